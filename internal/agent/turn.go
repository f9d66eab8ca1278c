package agent

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"liken.dev/liken/api/v1alpha1"
)

// rebootView is where this machine stands in its reboot: from its pending set, its reboot
// policy and approval, and what the coordinator recorded in the Cluster's status (the
// turn it holds, a drain that was blocked, what it waits for).
type rebootView struct {
	state   v1alpha1.RebootState
	message string
	// mayReboot: the machine holds a drained turn for exactly its pending set, and the
	// reboot is approved (Manual) or due (Auto); turnSince is that turn's.
	mayReboot bool
	turnSince metav1.Time
}

// healthy is the health gate before a turn is given back: k3s healthy, the Node Ready,
// no k3s restart pending and no trial waiting to be committed. A change that fails to
// apply (a bad sysctl, say) is reported in the conditions but does not hold the turn: it
// has nothing to do with the reboot, and holding the turn would stall the fleet.
func (a *Agent) healthy(out *outcome) (bool, string) {
	if why := trialWaits(out, a.st.K3sRestartPending); why != "" {
		return false, why // what a trial's commit waits for is this boot's health
	}
	if a.bootInfo != nil && a.bootInfo.Trial && !a.bootInfo.Committed {
		return false, "the trial boot is not committed yet"
	}
	return true, ""
}

// backOnTurn: the machine holds a drained turn and this boot came after the reboot made
// on it (or is a trial not yet committed, which only such a reboot starts).
func (a *Agent) backOnTurn(turn *v1alpha1.Turn) bool {
	if turn == nil || turn.Phase != v1alpha1.TurnDrained {
		return false
	}
	if bi := a.bootInfo; bi != nil && bi.Trial && !bi.Committed {
		return true
	}
	r := a.st.RebootedForTurn
	return r != nil && r.Equal(&turn.Since) && a.st.RebootAsked == nil
}

func (a *Agent) rebootView(m *v1alpha1.Machine, c *v1alpha1.Cluster, pending []v1alpha1.PendingChange, hash string, out *outcome) rebootView {
	var fields, failed, notApplied []string
	approvedNow := a.approved(m, hash)
	for _, p := range pending {
		switch {
		case p.Class != v1alpha1.Reboot:
		case out.view.notRetried(p.Field):
			failed = append(failed, p.Field)
		case out.notAppliedBoot[p.Field] != "" && !approvedNow:
			// A boot could not apply it (a disk holding data, say): another boot would not
			// either, so it asks for no reboot by itself, whatever else was rebooted for.
			// Only an operator's approval of the set tries it again.
			notApplied = append(notApplied, p.Field)
		default:
			fields = append(fields, p.Field)
		}
	}
	none := ""
	if len(fields) == 0 && len(failed) > 0 {
		// What failed its trial here is not retried, so it alone asks for no reboot.
		none = "no reboot: " + out.view.whyNotRetried(failed)
	}
	var turn *v1alpha1.Turn
	for i, t := range c.Status.Turns {
		if t.Machine == a.cfg.Machine && t.ReleasedBy == "" { // one given back is not held
			turn = &c.Status.Turns[i]
		}
	}
	if a.backOnTurn(turn) {
		// Back from the reboot this turn was for: the turn is held until this boot is
		// healthy (a trial until it commits), whatever became pending meanwhile. Reporting
		// a new wait here would make the coordinator take the turn back, uncordon the Node
		// and give the budget to the next machine while this one may still fall back.
		if ok, why := a.healthy(out); !ok {
			return rebootView{state: v1alpha1.RebootVerifying, message: "back from its reboot; it gives its turn back once healthy: " + why}
		}
	}
	if len(fields) == 0 {
		if turn != nil && turn.Phase == v1alpha1.TurnDrained {
			if ok, why := a.healthy(out); !ok {
				return rebootView{state: v1alpha1.RebootVerifying, message: "back from its reboot; it gives its turn back once healthy: " + why}
			}
			return rebootView{state: v1alpha1.RebootNone, message: "back from its reboot and healthy: the coordinator uncordons the Node and takes the turn back once its gates pass (the workloads that ran here, spec.rollout.gates; the Cluster's status.turns says where they are)"}
		}
		if len(notApplied) > 0 {
			var whys []string
			for _, f := range notApplied {
				whys = append(whys, f+": "+out.notAppliedBoot[f])
			}
			return rebootView{state: v1alpha1.RebootWaitingForApproval, message: fmt.Sprintf(
				"%s need a reboot, but a reboot for them happened already and the boot could not apply them (%s); approve pending set %s with liken approve-reboot to try once more",
				strings.Join(notApplied, ", "), strings.Join(whys, "; "), hash)}
		}
		return rebootView{state: v1alpha1.RebootNone, message: none}
	}
	need := strings.Join(fields, ", ") + " need a reboot"
	cannot := ""
	if a.cfg.Boot == nil {
		cannot = "; but liken's init did not boot this machine, so liken cannot reboot it"
	}
	approved := approvedNow
	why := ""
	switch {
	case approved:
		why = "approved by " + orSomeone(m.Spec.Reboot.Approval.ApprovedBy)
	case a.st.ApprovedHash == hash:
		// Rebooted for exactly this set already and it is still pending (its trial failed):
		// not again by itself, whatever the policy.
		return rebootView{state: v1alpha1.RebootWaitingForApproval, message: fmt.Sprintf("%s; a reboot for pending set %s happened already and the set is still pending; approve it again with liken approve-reboot to try once more", need, hash)}
	case m.EffectiveRebootPolicy(c) == v1alpha1.RebootManual:
		msg := fmt.Sprintf("%s; approve pending set %s with liken approve-reboot", need, hash)
		if r := m.Spec.Reboot; r != nil && r.Approval != nil && r.Approval.PendingHash != hash {
			msg += fmt.Sprintf(" (the approval on record is for %s, a set that has changed since: stale)", r.Approval.PendingHash)
		}
		return rebootView{state: v1alpha1.RebootWaitingForApproval, message: msg + cannot}
	default:
		why = "rebootPolicy is Auto"
	}
	if cannot != "" {
		// Asking for a turn would drain a Node nothing here can reboot.
		return rebootView{state: v1alpha1.RebootNone, message: fmt.Sprintf("%s (%s)%s", need, why, cannot)}
	}
	if v := out.view; v != nil && v.status.State == v1alpha1.UpgradeDownloading {
		return rebootView{state: v1alpha1.RebootWaitingForTurn, message: fmt.Sprintf("%s (%s); the new release is still being written into the inactive slot: the machine asks for a turn once it is verified", need, why)}
	}
	// A turn first: the coordinator's clock decided the retry, not this machine's.
	if turn != nil && turn.PendingHash == hash {
		if turn.Phase == v1alpha1.TurnDrained {
			return rebootView{state: v1alpha1.RebootDraining, message: "drained: rebooting", mayReboot: true, turnSince: turn.Since}
		}
		msg := fmt.Sprintf("%s (%s); holds a disruption-budget turn since %s: the coordinator cordons the Node and evicts its pods", need, why, turn.Since.UTC().Format(time.RFC3339))
		if s := out.etcdSnapshot; s != nil && s.Error != "" {
			msg += "; not before its etcd snapshot for the turn, which failed (tried again shortly): " + s.Error
		} else if s != nil {
			msg += fmt.Sprintf(", its etcd snapshot %s taken", s.Name)
		}
		return rebootView{state: v1alpha1.RebootDraining, message: msg}
	}
	for _, b := range c.Status.DrainBlocked {
		if b.Machine == a.cfg.Machine && b.PendingHash == hash && a.cfg.Now().Before(b.RetryAt.Time) {
			if a.queue != nil {
				a.queue.AddAfter(keyReconcile, b.RetryAt.Sub(a.cfg.Now())) // to ask for a turn again then
			}
			return rebootView{state: v1alpha1.RebootDrainBlocked, message: b.Message}
		}
	}
	wait := "waiting for a disruption-budget turn"
	for _, w := range c.Status.Waiting {
		if w.Machine == a.cfg.Machine && w.Reason != "" {
			wait += ": " + w.Reason
		}
	}
	if c.Status.Coordinator == "" {
		wait += " (no coordinator has written the Cluster's status yet: one runs on a server machine)"
	}
	return rebootView{state: v1alpha1.RebootWaitingForTurn, message: fmt.Sprintf("%s (%s); %s", need, why, wait)}
}
