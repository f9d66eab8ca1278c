package coordinator

import (
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"liken.dev/liken/api/v1alpha1"
)

// canaries are the machines spec.rollout.canaries selects, which take their turns before
// any other machine.
type canaries struct {
	sel labels.Selector
	// err is an invalid selector: then no machine gets a turn, and every waiting machine
	// says why (an operator meant some to go first; which is unknown).
	err error
}

func newCanaries(r *v1alpha1.Rollout) canaries {
	if r == nil || r.Canaries == nil {
		return canaries{}
	}
	sel, err := metav1.LabelSelectorAsSelector(r.Canaries)
	if err != nil {
		return canaries{err: fmt.Errorf("spec.rollout.canaries is not a valid label selector: %w", err)}
	}
	return canaries{sel: sel}
}

// is says whether m is a canary.
func (c canaries) is(m *v1alpha1.Machine) bool {
	return m != nil && c.sel != nil && c.sel.Matches(labels.Set(m.Labels))
}

// hold says why the machines that are not canaries wait, or "": while a canary has a
// reboot ahead of it (waiting for an approval, a window or a turn) or in progress (it
// holds a turn, draining, rebooting or verifying its trial).
func (c canaries) hold(machines []v1alpha1.Machine, held map[string]bool) string {
	if c.err != nil {
		return c.err.Error() + ": no machine gets a turn until it is fixed"
	}
	if c.sel == nil {
		return ""
	}
	var busy []string
	for i := range machines {
		m := &machines[i]
		if !c.is(m) {
			continue
		}
		switch s := m.Status.Reboot.State; {
		case held[m.Name]:
			busy = append(busy, m.Name+" (its turn)")
		case s != "" && s != v1alpha1.RebootNone:
			busy = append(busy, fmt.Sprintf("%s (%s)", m.Name, s))
		}
	}
	if len(busy) == 0 {
		return ""
	}
	sort.Strings(busy)
	return "canaries first (spec.rollout.canaries): " + strings.Join(busy, ", ") + " before any other machine"
}

// soaking says until when no new turn is given after the last turn that ended well
// (spec.rollout.soak), with the reason the waiting machines show, or "" when no soak
// holds now. ended are the turns this plan takes back having ended well; before them, the
// rollout's record in the Cluster's status counts (of this spec.version only).
func soaking(cl *v1alpha1.Cluster, ended []v1alpha1.EndedTurn, now time.Time) (time.Time, string) {
	var last *v1alpha1.EndedTurn
	var n int32
	if ro := cl.Status.Rollout; ro != nil && ro.TargetVersion == string(cl.Spec.Version) {
		last, n = ro.LastTurnEnded, ro.TurnsEnded
	}
	for i := range ended {
		last, n = &ended[i], n+1
	}
	if last == nil {
		return time.Time{}, ""
	}
	soak := cl.Spec.Rollout.SoakFor(n, last.Canary)
	until := last.At.Add(soak)
	if soak <= 0 || !now.Before(until) {
		return time.Time{}, ""
	}
	what := "turn"
	if last.Canary {
		what = "canary turn"
	}
	return until, fmt.Sprintf("soaking (spec.rollout.soak %s): %s's %s ended well at %s; the next turn from %s",
		soak, last.Machine, what, last.At.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339))
}
