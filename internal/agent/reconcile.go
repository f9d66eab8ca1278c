package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/host/sysctl"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/state"
)

// outcome collects what one reconcile did, for status, Events and the state file.
type outcome struct {
	failures  map[string]string // item → why it could not be applied
	applied   []change.Change   // Live and RestartK3s changes applied now
	staged    []change.Change   // NextBoot and Reboot changes newly staged
	restarted bool              // k3s files changed; a restart is scheduled
	nodeFound bool
	// nodeReady: the Node is Ready by a report of this boot (its boot ID is init's).
	nodeReady bool
	// nodeStale says why the Node's status is not this boot's; empty when it is.
	nodeStale string
	// notAppliedBoot: boot-time settings init could not apply at this boot (field → why).
	notAppliedBoot map[string]string
	// preflightFailed: the host check init makes once k3s runs failed, so.
	preflightFailed string
	// k3sUnhealthy says why k3s's health check failed; empty when healthy or not checked.
	k3sUnhealthy string
	// roleMismatch says how the role this machine booted with and its Machine's differ.
	roleMismatch string
	// clusterPolicy is the Cluster's rebootPolicy, which a Machine may override.
	clusterPolicy v1alpha1.RebootPolicy
	// view is where the machine stands with releases; rebooting once a reboot is asked of init.
	view      *upgradeView
	rebooting bool
	// reboot is where the machine stands in its reboot (turn.go).
	reboot *rebootView
	// etcdSnapshot is the snapshot taken for the turn being drained (snapshot.go).
	etcdSnapshot *v1alpha1.EtcdSnapshotStatus
}

// reconcile is one pass: read, classify, apply live, render k3s, stage the rest, persist,
// report. Each step is idempotent, so a pass after a crash repeats nothing that was done.
func (a *Agent) reconcile(ctx context.Context) error {
	m, c, node, err := a.observe()
	if err != nil || m == nil || c == nil {
		// Nothing to do until both documents are known; the watch brings them.
		return err
	}
	if a.cfg.Boot != nil && a.bootInfo == nil {
		if err := a.loadBoot(ctx); err != nil {
			return err
		}
	}
	// Until init has checked k3s once it runs (checkK3sPATH), its report is asked for
	// again every 5 s, so a failure there reaches status; a failed asking waits for the
	// next time.
	if bi := a.bootInfo; a.cfg.Boot != nil && bi != nil && bi.Report != nil && !bi.Report.PreflightDone {
		if a.cfg.Now().Sub(a.bootInfoAt) >= 5*time.Second {
			if err := a.loadBoot(ctx); err != nil {
				a.log.Warn("asking init for its preflight", "err", err)
			}
		}
		a.queue.AddAfter(keyReconcile, 5*time.Second)
	}
	if !a.attemptResolved {
		if bi := a.bootInfo; bi != nil && bi.BootID != a.st.BootID && bi.Report != nil {
			a.diskEvents(m, bi.Report.DiskStatus)
		}
		if bi := a.bootInfo; bi != nil && bi.BootID != a.st.BootID {
			if msg := roleMismatch(bi.Role, m.Spec.Role); msg != "" {
				a.log.Warn("this machine booted with another role than its Machine's", "booted", bi.Role, "spec.role", m.Spec.Role)
				a.events.Event(m, corev1.EventTypeWarning, v1alpha1.ReasonRoleMismatch, msg)
			}
		}
		if err := a.promoteBootSettings(); err != nil {
			return err
		}
		if err := a.resolveAttempt(m); err != nil {
			return err
		}
		a.adoptStatusRecords(m)
		a.adoptFailures(m)
		// After the status records: the last words may have put a mark there that a reboot
		// never taken must not keep.
		if err := a.settleRebootAsked(); err != nil {
			return err
		}
		a.attemptResolved = true
	}
	a.endRetrySettings(m) // saved with the rest of this pass
	desired := change.Spec{Cluster: c.Spec, Machine: m.Spec}
	applied := desired
	if a.st.Applied != nil {
		applied = *a.st.Applied
	}
	changes, err := change.Diff(applied, desired)
	if err != nil {
		return err
	}
	out := &outcome{failures: map[string]string{}, nodeFound: node != nil, clusterPolicy: c.Spec.RebootPolicy, notAppliedBoot: a.notAppliedAtBoot(desired)}
	if bi := a.bootInfo; bi != nil && bi.Report != nil {
		out.preflightFailed = bi.Report.PreflightFailed
	}
	if bi := a.bootInfo; bi != nil {
		out.roleMismatch = roleMismatch(bi.Role, m.Spec.Role)
	}
	if out.k3sUnhealthy = a.k3sHealth(ctx); out.k3sUnhealthy != "" {
		// k3s's health is not watched: look again shortly while it is not healthy.
		a.queue.AddAfter(keyReconcile, 5*time.Second)
	}

	a.applySysctls(desired, out)
	a.applyTimeServers(desired)
	if node != nil {
		out.nodeReady = kube.NodeReady(node)
		if bi := a.bootInfo; bi != nil && bi.BootID != "" && node.Status.NodeInfo.BootID != bi.BootID {
			// The Node still shows the last boot's kubelet (its Ready may be minutes old):
			// nothing it says is evidence about this boot. Its next report wakes the agent.
			out.nodeReady = false
			out.nodeStale = fmt.Sprintf("the Node's status is from another boot (boot ID %q, this boot is %q): k3s has not reported this boot yet", node.Status.NodeInfo.BootID, bi.BootID)
		}
		if err := a.applyNode(ctx, node, m.Spec, out); err != nil {
			return err
		}
	} else {
		out.failures["node"] = fmt.Sprintf("Node %s is not registered yet (k3s has not joined)", a.cfg.Machine)
	}
	if err := a.applyK3s(ctx, m, c, out); err != nil {
		out.failures["k3s"] = err.Error()
	}
	out.view = a.upgrade(ctx, m, c, out)

	newApplied, err := change.Keep(applied, desired, func(fc v1alpha1.FieldClass) bool { return change.Staged(fc.Class) })
	if err != nil {
		return err
	}
	a.groundStaged(&newApplied, m, c)
	pending, err := a.pending(newApplied, desired, out)
	if err != nil {
		return err
	}
	pending = a.releasePending(pending, m, c)
	if p := a.requestPending(m); p != nil {
		pending = append(pending, *p)
	}
	sort.Slice(pending, func(i, j int) bool { return pending[i].Field < pending[j].Field })
	for _, ch := range changes {
		if !change.Staged(ch.Class) {
			out.applied = append(out.applied, ch)
		}
	}

	a.st.Applied = &newApplied
	a.st.Staged = &desired
	a.st.Pending = pending
	if len(out.failures) == 0 {
		a.st.MachineGeneration = m.Generation
		a.st.ClusterGeneration = c.Generation
	}
	if err := a.cfg.State.Save(a.st); err != nil {
		return err
	}
	a.record(m, out)
	if err := a.commitTrial(ctx, m, c, out); err != nil {
		return err
	}
	out.etcdSnapshot = a.snapshotForTurn(ctx, m, c, node, pending, change.PendingHash(pending))
	rv := a.rebootView(m, c, pending, change.PendingHash(pending), out)
	out.reboot = &rv
	if rebooting, err := a.maybeReboot(ctx, m, out.view, change.PendingHash(pending), out); err != nil || rebooting {
		return err
	}
	return a.writeStatus(ctx, m, out)
}

// commitTrial makes a trial boot permanent once the machine is really back: k3s healthy on
// this boot, its Node Ready by a report of this boot, k3s running its rendered
// configuration, and (for a server's new network) a peer reaching it. Nothing else decides
// it: a sysctl this machine lacks, an unpinned version or a Node label the API refused stay
// failures in ConfigApplied and Degraded, and would fail a good release if they held the
// commit. Until then, init's health deadline (and the watchdog) send a failed trial back to
// the last good slot, and the failure says what the commit last waited for.
func (a *Agent) commitTrial(ctx context.Context, m *v1alpha1.Machine, c *v1alpha1.Cluster, out *outcome) error {
	bi := a.bootInfo
	if bi == nil || !bi.Trial || bi.Committed {
		return nil
	}
	at := a.st.Attempt
	if at != nil && at.Slot != bi.Slot {
		at = nil
	}
	waiting := trialWaits(out, a.st.K3sRestartPending)
	if waiting != "" {
		a.peerWaitSince = time.Time{} // the peers' wait counts only while healthy on its own
	}
	if waiting == "" && at != nil && len(at.Peers) > 0 {
		if waiting = a.peersReach(ctx, at.Peers); waiting != "" {
			if a.peerWaitSince.IsZero() {
				a.peerWaitSince = a.cfg.Now()
			}
			wait := a.peerWait()
			if a.cfg.Now().Sub(a.peerWaitSince) >= wait { // monotonic with time.Now: a clock step does not count
				// Healthy here, unreachable there: init's deadline would end it the same
				// way, minutes later, with the cluster's other machines cut off meanwhile.
				failed := fmt.Sprintf("%s, in %s of being healthy itself", waiting, wait)
				a.log.Warn("no peer reached this server on its new network: ending the trial; the machine falls back to its last good settings", "why", failed)
				a.events.Eventf(m, corev1.EventTypeWarning, v1alpha1.ReasonPeersUnreachable, "the trial boot of slot %s was healthy, but %s; it ends, and the machine falls back to its last good network", bi.Slot, failed)
				return a.cfg.Boot.FailTrial(ctx, state.EndPeersUnreachable, failed)
			}
			waiting += fmt.Sprintf(" (the trial ends if none has within %s of this server being healthy)", wait)
		}
	}
	if waiting == "" {
		var failed string
		if waiting, failed = trialGates(c, a.cfg.Machine, bi.BootID); failed != "" {
			a.log.Warn("the trial's gates failed: ending it; the machine falls back to its last good slot", "why", failed)
			a.events.Eventf(m, corev1.EventTypeWarning, v1alpha1.ReasonGateFailed, "the trial boot of slot %s was healthy, but its gates failed: %s; it ends, and the machine falls back to its last good slot", bi.Slot, failed)
			if err := a.cfg.Boot.FailTrial(ctx, state.EndGatesFailed, failed); err != nil {
				return err
			}
			return nil
		}
	}
	a.trialWaiting = waiting
	if at != nil && at.Waiting != waiting {
		at.Waiting = waiting
		if err := a.cfg.State.Save(a.st); err != nil {
			return err
		}
		if waiting != "" {
			a.log.Info("trial not committed yet", "waiting", waiting)
		}
	}
	if waiting != "" {
		// k3s's health is not watched: look again shortly while the trial waits for it.
		a.queue.AddAfter(keyReconcile, 2*time.Second)
		return nil
	}
	if err := a.cfg.Boot.CommitTrial(ctx); err != nil {
		return err
	}
	if err := a.loadBoot(ctx); err != nil {
		return err
	}
	rec := a.bootInfo.Slots[bi.Slot]
	if at := a.st.Attempt; at != nil && at.Slot == bi.Slot {
		if err := a.settleCommitted(at, bi.Report); err != nil {
			return err
		}
	}
	a.log.Info("trial committed: this slot is now the default", "slot", bi.Slot, "version", rec.Version)
	a.events.Eventf(m, corev1.EventTypeNormal, v1alpha1.ReasonCommitted, "the trial boot of slot %s (release %s, kernel arguments %q) is healthy: it is the default now", bi.Slot, rec.Version, bi.KernelArgs)
	// The view was computed before the commit.
	out.view = a.upgrade(ctx, m, c, out)
	return nil
}

// trialGates says what a trial healthy by its own account still waits for from its gates
// (spec.rollout.commitAfterGates), or, once they failed on this boot, why they did. The
// coordinator judges the gates of the turn the machine rebooted for (Drained, given on
// another boot) and writes its verdict there with the boot ID it judged. Nothing is waited
// for without such a turn (an operator gave it back, or the reboot had none), when
// commitAfterGates is off, or when the coordinator records no boot ID in its turns (one
// older than the gates, as during a fleet's upgrade, whose coordinator goes last).
func trialGates(c *v1alpha1.Cluster, machine, bootID string) (waiting, failed string) {
	if c == nil || !c.Spec.Rollout.CommitsAfterGates() || bootID == "" {
		return "", ""
	}
	for _, t := range c.Status.Turns {
		if t.Machine != machine || t.Phase != v1alpha1.TurnDrained || t.BootID == "" || t.BootID == bootID {
			continue
		}
		g := t.Gates
		switch {
		case g == nil || g.BootID != bootID || g.Phase == v1alpha1.GateChecking:
			why := "its gates: the coordinator checks that the workloads that had pods here are back, and spec.rollout.gates"
			if g != nil && g.BootID == bootID && g.Message != "" {
				why += " (" + g.Message + ")"
			}
			return why, ""
		case g.Phase == v1alpha1.GateFailed:
			msg := g.Message
			if g.Gate != "" {
				msg = "gate " + g.Gate + ": " + msg
			}
			return "", msg
		}
		return "", ""
	}
	return "", ""
}

// trialWaits says what a trial's commit still waits for on this boot, or "".
func trialWaits(out *outcome, k3sRestartPending bool) string {
	switch {
	case out.k3sUnhealthy != "":
		return "k3s is not healthy: " + out.k3sUnhealthy
	case out.nodeStale != "":
		return out.nodeStale
	case !out.nodeReady:
		return "the Node is not Ready"
	case k3sRestartPending:
		return "k3s restarts for new configuration first"
	}
	return ""
}

// observe reads the cached Machine, Cluster and Node.
func (a *Agent) observe() (*v1alpha1.Machine, *v1alpha1.Cluster, *corev1.Node, error) {
	var m *v1alpha1.Machine
	var c *v1alpha1.Cluster
	var n *corev1.Node
	if o, ok, err := a.machines.GetByKey(a.cfg.Machine); err != nil {
		return nil, nil, nil, err
	} else if ok {
		m = o.(*v1alpha1.Machine).DeepCopy()
	}
	if o, ok, err := a.clusters.GetByKey(v1alpha1.ClusterName); err != nil {
		return nil, nil, nil, err
	} else if ok {
		c = o.(*v1alpha1.Cluster).DeepCopy()
	}
	if o, ok, err := a.nodes.GetByKey(a.cfg.Machine); err != nil {
		return nil, nil, nil, err
	} else if ok {
		n = o.(*corev1.Node).DeepCopy()
	}
	return m, c, n, nil
}

func (a *Agent) applySysctls(desired change.Spec, out *outcome) {
	want := sysctl.Merge(desired.Cluster.Sysctls, desired.Machine.Sysctls)
	res := a.cfg.Sysctl.Apply(want, a.st.SysctlOriginals)
	for k, err := range res.Failed {
		out.failures["sysctl "+k] = err.Error()
	}
	a.cfg.Metrics.SysctlFailures.Set(float64(len(res.Failed)))
}

func stringMap[V ~string](m map[string]V) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

// applyNode keeps liken's labels and taints on the Node, removing those liken set earlier
// and no longer wants, and never touching what others set.
func (a *Agent) applyNode(ctx context.Context, node *corev1.Node, spec v1alpha1.MachineSpec, out *outcome) error {
	want := stringMap(spec.NodeLabels)
	changed := false
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	for k, v := range want {
		if node.Labels[k] != v {
			node.Labels[k] = v
			changed = true
		}
	}
	for k := range a.st.NodeLabels {
		if _, still := want[k]; !still {
			if _, on := node.Labels[k]; on {
				delete(node.Labels, k)
				changed = true
			}
		}
	}
	type tk struct{ key, effect string }
	mine := map[tk]bool{}
	for _, t := range a.st.NodeTaints {
		mine[tk{t.Key, string(t.Effect)}] = true
	}
	wantT := map[tk]v1alpha1.Taint{}
	for _, t := range spec.NodeTaints {
		wantT[tk{t.Key, string(t.Effect)}] = t
	}
	var taints []corev1.Taint
	seen := map[tk]bool{}
	for _, t := range node.Spec.Taints {
		k := tk{t.Key, string(t.Effect)}
		if w, ok := wantT[k]; ok {
			seen[k] = true
			if t.Value != w.Value {
				t.Value = w.Value
				changed = true
			}
			taints = append(taints, t)
			continue
		}
		if mine[k] {
			changed = true // liken's own taint, no longer wanted
			continue
		}
		taints = append(taints, t)
	}
	for _, t := range spec.NodeTaints {
		if !seen[tk{t.Key, string(t.Effect)}] {
			taints = append(taints, corev1.Taint{Key: t.Key, Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
			changed = true
		}
	}
	node.Spec.Taints = taints
	if changed {
		// Update with the cached resourceVersion: a concurrent writer makes this fail with a
		// conflict, and the retry starts from the fresh Node the watch delivers.
		if _, err := a.kube.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{FieldManager: "liken-agent"}); err != nil {
			if apierrors.IsConflict(err) {
				return fmt.Errorf("updating Node %s: %w", node.Name, err)
			}
			out.failures["node"] = fmt.Sprintf("updating Node labels and taints: %v", err)
			return nil
		}
	}
	a.st.NodeLabels = want
	a.st.NodeTaints = append([]v1alpha1.Taint(nil), spec.NodeTaints...)
	return nil
}

// applyK3s renders k3s's files and, when they differ from what is on disk, replaces them and
// schedules a restart after RestartDelay (so a burst of edits restarts k3s once).
func (a *Agent) applyK3s(ctx context.Context, m *v1alpha1.Machine, c *v1alpha1.Cluster, out *outcome) error {
	secrets, err := a.registrySecrets(ctx, c)
	if err != nil {
		return err
	}
	role := m.Spec.Role
	if bi := a.bootInfo; bi != nil && bi.Role != "" {
		// k3s runs the role init started it with; the other role's files would make it
		// another node (a first server without cluster-init, an agent with a server's
		// settings). A Machine that says otherwise is reported (roleMismatch).
		role = bi.Role
	}
	// node-ip belongs to spec.network (a Reboot-class field): it is the network this boot
	// has, as init rendered it, never the Machine's newer one, which waits for its reboot.
	var nodeIP string
	if bi := a.bootInfo; bi != nil && bi.Report != nil && bi.Report.Network != nil {
		nodeIP = bi.Report.Network.NodeIP
	}
	// The kubelet accepts swap whenever swap is on here: features.swap turns it on at boot.
	rendered, err := k3s.Render(k3s.Input{Role: role, NodeName: a.cfg.Machine, NodeIP: nodeIP, Cluster: c.Spec, Join: a.cfg.Join, Secrets: secrets, Paths: a.cfg.K3sPaths, SwapOn: a.swapOn()})
	if err != nil {
		return err
	}
	changed, err := a.cfg.K3sRoot.Changed(rendered)
	if err != nil {
		return err
	}
	if len(changed) == 0 {
		return nil
	}
	// Persist the intent before replacing the files: a crash after the write still ends in
	// the restart the new files need.
	a.st.K3sRestartPending = true
	if err := a.cfg.State.Save(a.st); err != nil {
		return err
	}
	if err := a.cfg.K3sRoot.Write(rendered); err != nil {
		return err
	}
	a.log.Info("k3s configuration changed; restart scheduled", "files", changed, "delay", a.cfg.RestartDelay)
	a.lastRender = a.cfg.Now()
	out.restarted = true
	a.queue.AddAfter(keyRestart, a.cfg.RestartDelay)
	return nil
}

func (a *Agent) registrySecrets(ctx context.Context, c *v1alpha1.Cluster) (map[string]map[string][]byte, error) {
	out := map[string]map[string][]byte{}
	for _, n := range c.Spec.Registries.SecretNames() {
		s, err := a.kube.CoreV1().Secrets(v1alpha1.SecretNamespace).Get(ctx, n, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // Render names the missing Secret
		}
		if apierrors.IsForbidden(err) {
			// A machine reads only the Secrets the Cluster names, once the coordinator has
			// named them in its Role: look again shortly.
			a.queue.AddAfter(keyReconcile, 5*time.Second)
			return nil, fmt.Errorf("reading Secret %s/%s: not allowed yet (the reboot coordinator grants the registry Secrets the Cluster names): %w", v1alpha1.SecretNamespace, n, err)
		}
		if err != nil {
			return nil, fmt.Errorf("reading Secret %s/%s: %w", v1alpha1.SecretNamespace, n, err)
		}
		out[n] = s.Data
	}
	return out, nil
}

// restartK3s asks the supervisor to restart k3s once the rendered files have been quiet for
// RestartDelay.
func (a *Agent) restartK3s(ctx context.Context) error {
	if !a.st.K3sRestartPending {
		return nil
	}
	if wait := a.lastRender.Add(a.cfg.RestartDelay).Sub(a.cfg.Now()); wait > 0 {
		a.queue.AddAfter(keyRestart, wait)
		return nil
	}
	if a.cfg.Restarter == nil {
		return errors.New("k3s files changed but this agent has no supervisor to restart k3s")
	}
	// On a server the API server goes down with k3s: let what was said reach it first. What
	// has not after LastWords stays queued and is sent once k3s is back.
	flushCtx, cancel := context.WithTimeout(ctx, a.cfg.LastWords)
	a.events.Flush(flushCtx)
	cancel()
	if err := a.cfg.Restarter.RestartK3s(ctx); err != nil {
		return fmt.Errorf("restarting k3s: %w", err)
	}
	a.cfg.Metrics.K3sRestarts.Inc()
	a.st.K3sRestartPending = false
	if err := a.cfg.State.Save(a.st); err != nil {
		return err
	}
	a.log.Info("k3s restarted in place")
	if m, _, _, err := a.observe(); err == nil && m != nil {
		a.events.Event(m, corev1.EventTypeNormal, "RestartedK3s", "k3s restarted in place to apply its new configuration; pods kept running")
	}
	a.queue.Add(keyReconcile)
	return nil
}

// pending computes the staged set, keeping each entry's "since" while its target is unchanged.
func (a *Agent) pending(applied, desired change.Spec, out *outcome) ([]v1alpha1.PendingChange, error) {
	staged, err := change.Diff(applied, desired)
	if err != nil {
		return nil, err
	}
	prev := map[string]v1alpha1.PendingChange{}
	for _, p := range a.st.Pending {
		prev[p.Field] = p
	}
	var out2 []v1alpha1.PendingChange
	for _, ch := range staged {
		p := v1alpha1.PendingChange{Field: ch.Field, Class: ch.Class, From: ch.From, To: ch.To, Since: metav1.NewTime(a.cfg.Now().UTC().Truncate(1e9))}
		if old, ok := prev[ch.Field]; ok && old.To == ch.To && old.From == ch.From {
			p.Since = old.Since
		} else {
			out.staged = append(out.staged, ch)
		}
		out2 = append(out2, p)
	}
	sort.Slice(out2, func(i, j int) bool { return out2[i].Field < out2[j].Field })
	return out2, nil
}

// k3sHealth asks k3s's kubelet whether it is healthy (K3sHealthz); it returns why not, or
// "" when healthy or when there is nothing to ask.
func (a *Agent) k3sHealth(ctx context.Context) string {
	if a.cfg.K3sHealthz == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.cfg.K3sHealthz, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Sprintf("k3s's health check %s: %v", a.cfg.K3sHealthz, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("k3s's health check %s answered %s", a.cfg.K3sHealthz, resp.Status)
	}
	return ""
}

// record emits an Event for each applied or newly staged change and counts them.
func (a *Agent) record(m *v1alpha1.Machine, out *outcome) {
	for _, ch := range out.applied {
		a.cfg.Metrics.ChangesApplied.WithLabelValues(string(ch.Class)).Inc()
		how := "applied live"
		if ch.Class == v1alpha1.RestartK3s {
			how = "applied by restarting k3s in place where its files changed"
		}
		a.events.Eventf(m, corev1.EventTypeNormal, "Applied", "%s %s", ch.Field, how)
	}
	for _, ch := range out.staged {
		a.cfg.Metrics.ChangesStaged.WithLabelValues(string(ch.Class)).Inc()
		when := "staged for the next boot"
		if ch.Class == v1alpha1.Reboot {
			when = "staged; it needs a reboot of its own"
		}
		a.events.Eventf(m, corev1.EventTypeNormal, "Staged", "%s %s", ch.Field, when)
	}
	key := failureKey(out.failures)
	if key != "" && key != a.lastFailureKey {
		a.events.Eventf(m, corev1.EventTypeWarning, "ApplyFailed", "could not apply: %s", key)
	}
	a.lastFailureKey = key
}

func failureKey(f map[string]string) string {
	var items []string
	for k, v := range f {
		items = append(items, k+": "+v)
	}
	sort.Strings(items)
	return strings.Join(items, "; ")
}

// writeStatus writes the Machine's status only when it changed.
func (a *Agent) writeStatus(ctx context.Context, m *v1alpha1.Machine, out *outcome) error {
	next := a.status(m, out)
	if equality.Semantic.DeepEqual(m.Status, next) {
		return nil
	}
	m.Status = next
	if _, err := a.liken.UpdateMachineStatus(ctx, m); err != nil {
		return fmt.Errorf("writing Machine status: %w", err)
	}
	a.cfg.Metrics.StatusWrites.Inc()
	return nil
}

// diskEvents records, once for each boot, what init did with each disk of spec.disks.
func (a *Agent) diskEvents(m *v1alpha1.Machine, disks []v1alpha1.DiskStatus) {
	for _, d := range disks {
		typ, reason := corev1.EventTypeNormal, "Disk"+d.Reason
		if d.Phase != v1alpha1.DiskReady {
			typ, reason = corev1.EventTypeWarning, v1alpha1.ReasonDiskRefused
		}
		a.events.Eventf(m, typ, reason, "disk %s (%s): %s, %s: %s", d.Device, d.Path, d.Phase, d.Reason, d.Message)
	}
}

func (a *Agent) swapOn() bool {
	if a.cfg.SwapOn != nil {
		return a.cfg.SwapOn()
	}
	return k3s.SwapOn()
}
