package coordinator

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
)

// Fleet is the cluster as the coordinator reads it from the API.
type Fleet struct {
	Cluster  *v1alpha1.Cluster
	Machines []v1alpha1.Machine
	Nodes    map[string]*corev1.Node
	// Self is the machine running the coordinator that plans; it goes last.
	Self string
	Now  time.Time
	// Gates are where the machines back from their reboot on a drained turn are in their
	// gates (gateChecker.Gates), by GateKey; a drained turn is given back only once they
	// passed or failed.
	Gates map[string]v1alpha1.TurnGates
}

// Plan is what the coordinator does next: the Cluster status to write (turns released
// and granted, who waits and why, the fleet's counts), and the Nodes to uncordon before
// that write, because the turns that say liken cordoned them go with it.
type Plan struct {
	Status   v1alpha1.ClusterStatus
	Uncordon []string
	// Released and Granted name the turns given back and given, for Events and logs;
	// Despite says, for a server granted while other servers are down, which and who
	// accepted it.
	Released map[string]string
	Granted  []string
	Despite  map[string]string
}

// holding says whether a machine still uses its turn, from the state its agent reports.
// A turn being drained is kept while the machine waits for exactly the set it was given
// for; a drained one also while the machine goes down, comes back and verifies its health.
// done says that a turn not kept ended as meant: its machine rebooted, came back healthy (a
// trial committed) and passed its gates (the soak counts from such a turn).
func holding(t v1alpha1.Turn, m *v1alpha1.Machine, n *corev1.Node) (keep bool, why string, done bool) {
	if m == nil {
		return false, "its Machine was deleted", false
	}
	if t.ReleasedBy != "" {
		return false, t.ReleasedBy + " gave it back with liken release-turn", false
	}
	st := m.Status.Reboot.State
	same := m.Status.PendingHash == t.PendingHash
	switch {
	case m.Status.Upgrade.State == v1alpha1.UpgradeDownloading && st != v1alpha1.RebootRebooting && st != v1alpha1.RebootVerifying:
		// A turn is granted only once the release is written: writing it again (the agent
		// restarted mid-write, or found the slot corrupt) can take long, and the Node
		// should not stay cordoned, nor the budget held, meanwhile. It asks again once done.
		return false, "it must write its release into the inactive slot again before it can reboot", false
	case st == v1alpha1.RebootRebooting || st == v1alpha1.RebootVerifying:
		return t.Phase == v1alpha1.TurnDrained, "it was not drained yet", false
	case (st == v1alpha1.RebootWaitingForTurn || st == v1alpha1.RebootDraining) && same:
		return true, "", false
	case st == v1alpha1.RebootNone && t.Phase == v1alpha1.TurnDrained:
		// Back and healthy by its own account: the turn is kept until its gates (the
		// workloads that ran on it, spec.rollout.gates) have passed or failed.
		switch {
		case n == nil:
			return false, "it rebooted and passed its health gate (it has no Node whose workloads to wait for)", true
		case t.Gates == nil || t.Gates.Phase == v1alpha1.GateChecking:
			return true, "", false
		case t.Gates.Phase == v1alpha1.GateFailed:
			return false, "it rebooted, but its gates failed: " + t.Gates.Message, false
		}
		return false, "it rebooted and passed its health gate and its gates", true
	case !same:
		return false, fmt.Sprintf("its pending set changed from %s to %s", t.PendingHash, orNone(m.Status.PendingHash)), false
	default:
		return false, fmt.Sprintf("it no longer waits for a reboot (%s)", st), false
	}
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// autoOnly: the machine reboots by rebootPolicy Auto alone, without an operator's approval
// of its pending set; only such reboots wait for a maintenance window.
func autoOnly(m *v1alpha1.Machine, cl *v1alpha1.Cluster) bool {
	if m.EffectiveRebootPolicy(cl) != v1alpha1.RebootAuto {
		return false
	}
	r := m.Spec.Reboot
	return r == nil || r.Approval == nil || r.Approval.PendingHash != m.Status.PendingHash
}

// unavailable says why a machine's Node is unavailable, or "".
func unavailable(n *corev1.Node) string {
	if n == nil {
		return "no Node"
	}
	switch {
	case !kube.NodeReady(n):
		return "NotReady"
	case n.Spec.Unschedulable:
		return Cordoned
	}
	return ""
}

// machineUnavailable is unavailable, and also says a machine whose agent reports it is going
// down or back from a reboot and not yet healthy on this boot is unavailable: its Node may
// still show a Ready its kubelet posted before the reboot, which is no evidence of this boot.
func machineUnavailable(m *v1alpha1.Machine, n *corev1.Node) string {
	if why := unavailable(n); why != "" {
		return why
	}
	switch m.Status.Reboot.State {
	case v1alpha1.RebootRebooting:
		return "Rebooting"
	case v1alpha1.RebootVerifying:
		return "Verifying"
	}
	return ""
}

// neverJoined: the machine has no Node and its agent never wrote its status.
func neverJoined(m *v1alpha1.Machine, n *corev1.Node) bool {
	s := m.Status
	return n == nil && s.ObservedGeneration == 0 && s.Release == nil && s.Hardware == nil && s.Reboot.State == ""
}

// waitsForTurn: the machine's agent asks for a turn now, for a release it has finished
// writing, and is not held back by a drain that was blocked for the same set.
func waitsForTurn(m *v1alpha1.Machine, blocks map[string]v1alpha1.DrainBlock, now time.Time) (bool, string) {
	if m.Status.Reboot.State != v1alpha1.RebootWaitingForTurn || m.Status.PendingHash == "" {
		return false, ""
	}
	if m.Status.Upgrade.State == v1alpha1.UpgradeDownloading {
		return false, ""
	}
	if b, ok := blocks[m.Name]; ok && b.PendingHash == m.Status.PendingHash && now.Before(b.RetryAt.Time) {
		return false, fmt.Sprintf("its last drain was blocked; it tries again at %s", b.RetryAt.UTC().Format(time.RFC3339))
	}
	return true, ""
}

// MakePlan decides from the fleet as read: it takes back turns that are no longer used,
// grants turns to waiting machines as Decide allows, and counts the fleet. It depends only
// on its input, so any coordinator (a restarted one, a new leader) plans the same.
func MakePlan(f Fleet) (Plan, error) {
	p := Plan{Released: map[string]string{}, Despite: map[string]string{}}
	cl := f.Cluster
	st := *cl.Status.DeepCopy()
	byName := map[string]*v1alpha1.Machine{}
	for i := range f.Machines {
		byName[f.Machines[i].Name] = &f.Machines[i]
	}
	now := metav1.NewTime(f.Now.UTC().Truncate(time.Second))

	for i, t := range st.Turns {
		if g, ok := f.Gates[GateKey(t)]; ok && t.Phase == v1alpha1.TurnDrained {
			st.Turns[i].Gates = &g
		}
	}
	recordGateFailures(&st, cl, f.Machines)
	failures := TrialFailures(&v1alpha1.Cluster{Spec: cl.Spec, Status: st}, f.Machines)
	halt := Halt(failures, cl.Spec.Rollout.FailureLimit())
	canaries := newCanaries(cl.Spec.Rollout)
	var ended []v1alpha1.EndedTurn
	var turns []v1alpha1.Turn
	for _, t := range st.Turns {
		keep, why, done := holding(t, byName[t.Machine], f.Nodes[t.Machine])
		if keep && halt != nil && t.Phase == v1alpha1.TurnDraining {
			// Not drained yet: no further machine is emptied for what failed. One drained
			// already goes down, and its trial commits or falls back.
			keep, why = false, "the rollout halted: "+halt.What+" failed its trial on "+strings.Join(halt.Machines, ", ")
		}
		if !keep {
			p.Released[t.Machine] = why
			if f.Nodes[t.Machine] != nil && !t.CordonedBefore && t.Phase != "" {
				p.Uncordon = append(p.Uncordon, t.Machine)
			}
			if done {
				ended = append(ended, v1alpha1.EndedTurn{Machine: t.Machine, At: now, Canary: canaries.is(byName[t.Machine])})
			}
			continue
		}
		turns = append(turns, t)
	}
	uncordoning := map[string]bool{}
	for _, n := range p.Uncordon {
		uncordoning[n] = true
	}
	held := map[string]bool{}
	heldTurn := map[string]v1alpha1.Turn{}
	for _, t := range turns {
		held[t.Machine] = true
		heldTurn[t.Machine] = t
	}
	blocks := map[string]v1alpha1.DrainBlock{}
	var keptBlocks []v1alpha1.DrainBlock
	for _, b := range st.DrainBlocked {
		// A block is kept while the machine still waits for the set it was blocked on, so
		// the next drain's backoff grows; it goes once the set is done or changed.
		if m := byName[b.Machine]; m != nil && m.Status.PendingHash == b.PendingHash {
			blocks[b.Machine] = b
			keptBlocks = append(keptBlocks, b)
		}
	}

	canaryHold := canaries.hold(f.Machines, held)
	soakUntil, soakWhy := soaking(cl, ended, f.Now)
	var ms []Machine
	var notJoined []string
	notes := map[string]string{}
	windowOpen, nextWindow, windowErr := Windows(cl.Spec.MaintenanceWindows, f.Now)
	for i := range f.Machines {
		m := &f.Machines[i]
		w, note := waitsForTurn(m, blocks, f.Now)
		if w && autoOnly(m, cl) && !windowOpen {
			w = false
			switch {
			case windowErr != nil:
				note = "rebootPolicy Auto waits for a maintenance window, but " + windowErr.Error()
			case nextWindow.IsZero():
				note = "rebootPolicy Auto: reboots start only in a maintenance window, and none ever opens"
			default:
				note = "rebootPolicy Auto: reboots start only in a maintenance window; the next opens at " + nextWindow.UTC().Format(time.RFC3339) +
					" (liken approve-reboot starts it sooner)"
			}
		}
		if w && canaryHold != "" && !canaries.is(m) {
			w, note = false, canaryHold
		}
		if note != "" {
			notes[m.Name] = note
		}
		since := m.CreationTimestamp.Time
		if m.Status.Reboot.Since != nil {
			since = m.Status.Reboot.Since.Time
		}
		node := f.Nodes[m.Name]
		if neverJoined(m, node) && !held[m.Name] {
			// Listed in the layer but never installed, or not booted yet: nothing of the
			// cluster's capacity is missing, so it takes none of the budget (it would stop
			// every reboot under maxUnavailable 1 for ever).
			notJoined = append(notJoined, m.Name)
			continue
		}
		if uncordoning[m.Name] && node != nil {
			// Its turn ends in this plan and the Node is uncordoned before the write: a
			// cordon that is liken's own does not hold the budget a moment longer.
			node = node.DeepCopy()
			node.Spec.Unschedulable = false
		}
		var serversDown []string
		if r := m.Spec.Reboot; r != nil && r.Approval != nil && r.Approval.PendingHash == m.Status.PendingHash {
			serversDown = r.Approval.ServersDown
		}
		reclaimable := false
		if t, ok := heldTurn[m.Name]; ok && t.GrantedUnavailable != "" && t.Phase == v1alpha1.TurnDraining {
			// Given while down; up again, liken's own cordon aside, before it went down
			// for the turn: the budget must have room for it now.
			up := node
			if up != nil && !t.CordonedBefore {
				up = up.DeepCopy()
				up.Spec.Unschedulable = false
			}
			reclaimable = machineUnavailable(m, up) == ""
		}
		mc := Machine{
			Name: m.Name, Server: m.Spec.Role == v1alpha1.RoleServer, Reclaimable: reclaimable,
			Unavailable: machineUnavailable(m, node), HoldsTurn: held[m.Name],
			Waiting: w, WaitingSince: since, Coordinator: m.Name == f.Self, ServersDown: serversDown,
			Canary: canaries.is(m),
		}
		if mc.Server {
			mc.Etcd = EtcdOf(f.Nodes[m.Name], f.Now)
		}
		ms = append(ms, mc)
	}
	d, err := Decide(ms, cl.Spec.DisruptionBudget.MaxUnavailable)
	if err != nil {
		return p, err
	}
	if len(d.Revoke) > 0 {
		kept := turns[:0:0]
		for _, t := range turns {
			why, ok := d.Revoke[t.Machine]
			if !ok {
				kept = append(kept, t)
				continue
			}
			p.Released[t.Machine] = why
			if f.Nodes[t.Machine] != nil && !t.CordonedBefore {
				p.Uncordon = append(p.Uncordon, t.Machine)
			}
		}
		turns = kept
	}
	paused := metav1.Condition{Type: v1alpha1.ClusterRolloutPaused, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNotPaused,
		Message: "new reboot turns are given as the budget allows", ObservedGeneration: cl.Generation}
	if r := cl.Spec.Rollout; r.IsPaused() || halt != nil {
		// No new turn: whoever would have had one waits, as does everyone else, for the
		// pause; turns given before go on.
		why, reason := "", v1alpha1.ReasonPaused
		switch {
		case halt != nil:
			why, reason = HaltMessage(halt, failures), v1alpha1.ReasonHalted
			if r.IsPaused() {
				why += "; besides, " + PausedMessage(r)
			}
		default:
			why = PausedMessage(r)
		}
		for _, name := range d.Grant {
			d.Wait[name] = why
		}
		for name := range d.Wait {
			d.Wait[name] = why
		}
		d.Grant, d.Despite = nil, map[string][]string{}
		paused = metav1.Condition{Type: v1alpha1.ClusterRolloutPaused, Status: metav1.ConditionTrue, Reason: reason,
			Message: why, ObservedGeneration: cl.Generation}
	}
	if soakWhy != "" && len(d.Grant) > 0 {
		// Every machine, canary or not, even one down already: the soak is for watching
		// the machines that have it before another gets it.
		for _, name := range d.Grant {
			d.Wait[name] = soakWhy
		}
		d.Grant, d.Despite = nil, map[string][]string{}
	}
	for _, name := range d.Grant {
		m := byName[name]
		n := f.Nodes[name]
		boot := ""
		if n != nil {
			boot = n.Status.NodeInfo.BootID
		}
		turns = append(turns, v1alpha1.Turn{
			Machine: name, Since: now, PendingHash: m.Status.PendingHash, Phase: v1alpha1.TurnDraining, BootID: boot,
			GrantedUnavailable: d.Unavailable[name],
			// Not liken's own cordon of a turn ending in this same plan.
			CordonedBefore: n != nil && n.Spec.Unschedulable && !uncordoning[name],
		})
		p.Granted = append(p.Granted, name)
		if down := d.Despite[name]; len(down) > 0 {
			by := "an operator"
			if a := m.Spec.Reboot.Approval; a.ApprovedBy != "" {
				by = a.ApprovedBy
			}
			p.Despite[name] = fmt.Sprintf("while %s is down too, as %s accepted (spec.reboot.approval.serversDown)", strings.Join(down, ", "), by)
		}
	}
	st.Turns = turns
	st.DrainBlocked = keptBlocks

	// Who waits, in the order they would be granted.
	var waiting []v1alpha1.WaitingMachine
	for _, m := range ms {
		if why, ok := d.Wait[m.Name]; ok {
			waiting = append(waiting, v1alpha1.WaitingMachine{Machine: m.Name, Since: metav1.NewTime(m.WaitingSince), Reason: why})
		} else if note, ok := notes[m.Name]; ok {
			waiting = append(waiting, v1alpha1.WaitingMachine{Machine: m.Name, Since: metav1.NewTime(m.WaitingSince), Reason: note})
		}
	}
	sort.SliceStable(waiting, func(i, j int) bool {
		if !waiting[i].Since.Equal(&waiting[j].Since) {
			return waiting[i].Since.Before(&waiting[j].Since)
		}
		return waiting[i].Machine < waiting[j].Machine
	})
	st.Waiting = waiting
	st.Coordinator = f.Self
	count(&st, cl, f.Machines, ms, notJoined, f.Now)
	st.Rollout.Failures, st.Rollout.Halted = failures, halt
	for _, e := range ended {
		st.Rollout.TurnsEnded++
		st.Rollout.LastTurnEnded = e.DeepCopy()
	}
	st.Rollout.SoakUntil = nil
	if soakWhy != "" {
		st.Rollout.SoakUntil = &metav1.Time{Time: soakUntil}
	}
	meta.SetStatusCondition(&st.Conditions, paused)
	meta.SetStatusCondition(&st.Conditions, quorumCondition(ms, cl.Generation))
	if windowErr != nil {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ClusterDegraded, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonMaintenanceWindowInvalid, Message: windowErr.Error() + ": rebootPolicy Auto reboots wait until it is fixed", ObservedGeneration: cl.Generation})
	}
	p.Status = st
	return p, nil
}

// PausedMessage says who paused the rollout, when and why, for the Cluster's status.
func PausedMessage(r *v1alpha1.Rollout) string {
	msg := "the rollout is paused (spec.rollout.paused"
	if r.PausedBy != "" {
		msg += ", by " + r.PausedBy
	}
	if r.PausedAt != nil {
		msg += " at " + r.PausedAt.UTC().Format(time.RFC3339)
	}
	msg += ")"
	if r.Reason != "" {
		msg += ": " + r.Reason
	}
	return msg + "; no new reboot turn until liken rollout resume"
}

// count fills in the fleet's numbers and conditions.
// StuckAfter is how long a turn holder may be unavailable before the Cluster says so.
var StuckAfter = 15 * time.Minute

func count(st *v1alpha1.ClusterStatus, cl *v1alpha1.Cluster, machines []v1alpha1.Machine, ms []Machine, notJoined []string, now time.Time) {
	st.ObservedGeneration = cl.Generation
	st.Machines = int32(len(machines))
	type vd struct{ v, d string }
	versions := map[vd]int32{}
	var upToDate, waiting, failed int32
	var roles []string // machines running another role than their Machine's
	for i := range machines {
		m := &machines[i]
		if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineDegraded); c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonRoleMismatch {
			roles = append(roles, m.Name)
		}
		wantV := string(cl.Spec.Version)
		if m.Spec.Version != "" {
			wantV = string(m.Spec.Version)
		}
		r := m.Status.Release
		if r != nil && r.Version != "" {
			versions[vd{r.Version, r.Digest}]++
			if r.Version == wantV && string(cl.Spec.Releases[wantV]) == r.Digest && !r.Trial {
				upToDate++
			}
		}
		if m.Status.Upgrade.State == v1alpha1.UpgradeStaged {
			waiting++
		}
		if m.Status.Upgrade.State == v1alpha1.UpgradeFellBack {
			failed++
		}
	}
	st.UpToDateMachines = upToDate
	st.Versions = nil
	for k, n := range versions {
		st.Versions = append(st.Versions, v1alpha1.VersionCount{Version: k.v, Digest: k.d, Machines: n})
	}
	sort.Slice(st.Versions, func(i, j int) bool {
		if st.Versions[i].Version != st.Versions[j].Version {
			return st.Versions[i].Version < st.Versions[j].Version
		}
		return st.Versions[i].Digest < st.Versions[j].Digest
	})
	ro := st.Rollout
	if ro == nil || ro.TargetVersion != string(cl.Spec.Version) {
		ro = &v1alpha1.RolloutStatus{TargetVersion: string(cl.Spec.Version)}
	}
	ro.Updated, ro.Waiting, ro.Failed = upToDate, waiting, failed
	st.Rollout = ro

	var down []string
	for _, m := range ms {
		if m.Unavailable != "" || m.HoldsTurn {
			down = append(down, m.Name)
		}
	}
	set := func(t string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: cl.Generation})
	}
	budget, _ := Budget(cl.Spec.DisruptionBudget.MaxUnavailable, len(ms))
	never := ""
	if len(notJoined) > 0 {
		never = fmt.Sprintf("; not counted: %s never joined (no Node, and no status from its agent)", strings.Join(notJoined, ", "))
	}
	if len(down) > budget {
		set(v1alpha1.ClusterAvailable, false, v1alpha1.ReasonOverBudget, fmt.Sprintf("%d machines are unavailable, more than the budget of %d: %v%s", len(down), budget, down, never))
	} else {
		set(v1alpha1.ClusterAvailable, true, v1alpha1.ReasonWithinBudget, fmt.Sprintf("%d of %d machines unavailable, within the budget of %d%s", len(down), len(ms), budget, never))
	}
	if upToDate < int32(len(machines)) || len(st.Turns) > 0 || len(st.Waiting) > 0 {
		set(v1alpha1.ClusterProgressing, true, v1alpha1.ReasonRollingOut, fmt.Sprintf("%d of %d machines run the release they are meant to; %d hold a turn, %d wait", upToDate, len(machines), len(st.Turns), len(st.Waiting)))
	} else {
		set(v1alpha1.ClusterProgressing, false, v1alpha1.ReasonUpToDate, "every machine runs the release it is meant to and nothing waits")
	}
	var stuck []string
	for _, t := range st.Turns {
		for _, m := range ms {
			if m.Name == t.Machine && m.Unavailable != "" && now.Sub(t.Since.Time) > StuckAfter {
				stuck = append(stuck, fmt.Sprintf("%s (turn since %s, Node %s)", t.Machine, t.Since.UTC().Format(time.RFC3339), m.Unavailable))
			}
		}
	}
	switch {
	case len(stuck) > 0:
		set(v1alpha1.ClusterDegraded, true, v1alpha1.ReasonTurnHolderNotBack, fmt.Sprintf("%s holds a disruption-budget turn and is not back after %s: turns never expire by themselves; if it will not return, liken release-turn gives its turn back",
			strings.Join(stuck, ", "), StuckAfter))
	case len(roles) > 0:
		// Ahead of failed trials and blocked drains: no reboot or retry fixes it, and the
		// budget's rules for servers go by a role the machine does not run.
		also := ""
		if failed > 0 || len(st.DrainBlocked) > 0 {
			also = fmt.Sprintf("; besides, %d machines fell back from a trial, %d drains were blocked", failed, len(st.DrainBlocked))
		}
		set(v1alpha1.ClusterDegraded, true, v1alpha1.ReasonRoleMismatch, fmt.Sprintf("%s booted with another role than their Machine's spec.role (installed with the other role's layer): each Machine's Degraded condition says which and what to do%s",
			strings.Join(roles, ", "), also))
	case failed > 0 || len(st.DrainBlocked) > 0:
		set(v1alpha1.ClusterDegraded, true, v1alpha1.ReasonMachinesNeedAttention, fmt.Sprintf("%d machines fell back from a trial, %d drains were blocked", failed, len(st.DrainBlocked)))
	default:
		set(v1alpha1.ClusterDegraded, false, v1alpha1.ReasonHealthy, "no trial failed, no drain is blocked and every machine runs its Machine's role")
	}
}
