package coordinator

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"liken.dev/liken/api/v1alpha1"
)

// KernelArgsKey is the prefix of a TrialFailure's key for kernel arguments; a release's key
// is its digest.
const KernelArgsKey = "kernelArgs:"

// TrialFailures lists the failed trials of what each machine is meant to run now: the
// release it wants (a failure of another digest is history, not this rollout's), and the
// kernel arguments the spec asks for, which its agent reports only while the spec still
// asks for them. Failures at or before spec.rollout.resumedAt are accepted, as is one a
// Machine's spec.retryFailedDigest asks to try again. The gate failures the coordinator
// recorded in the Cluster's status count too. Oldest first.
func TrialFailures(cl *v1alpha1.Cluster, machines []v1alpha1.Machine) []v1alpha1.TrialFailure {
	var resumed time.Time
	if r := cl.Spec.Rollout; r != nil && r.ResumedAt != nil {
		resumed = r.ResumedAt.Time
	}
	var out []v1alpha1.TrialFailure
	add := func(f v1alpha1.TrialFailure) {
		f.Accepted = !resumed.IsZero() && !f.At.Time.After(resumed)
		out = append(out, f)
	}
	for i := range machines {
		m := &machines[i]
		version := string(cl.Spec.Version)
		if m.Spec.Version != "" {
			version = string(m.Spec.Version)
		}
		if digest := string(cl.Spec.Releases[version]); digest != "" {
			for _, f := range m.Status.Upgrade.FailedReleases {
				if f.Digest != digest {
					continue
				}
				add(v1alpha1.TrialFailure{Machine: m.Name, What: fmt.Sprintf("release %s (%s)", version, digest), Key: digest,
					Reason: f.Reason, Message: f.Message, At: f.At})
				if string(m.Spec.RetryFailedDigest) == digest && !f.Retried {
					// An operator asks this machine to try it once more: that accepts its
					// failure. The retry's own failure (Retried) counts again.
					out[len(out)-1].Accepted = true
				}
			}
		}
		if f := m.Status.Upgrade.FailedKernelArgs; f != nil {
			add(v1alpha1.TrialFailure{Machine: m.Name, What: fmt.Sprintf("kernel arguments %q", f.Args), Key: KernelArgsKey + f.Args,
				Reason: f.Reason, Message: f.Message, At: f.At})
		}
	}
	if ro := cl.Status.Rollout; ro != nil {
		for _, f := range ro.GateFailures {
			add(f)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].At.Equal(&out[j].At) {
			return out[i].At.Before(&out[j].At)
		}
		return out[i].Machine < out[j].Machine
	})
	return out
}

// Halt decides whether the failures halt the rollout: once limit machines failed the
// trial of the same thing (not accepted), no further machine should be drained for it.
// When several things reached the limit, the one that reached it first is named.
func Halt(failures []v1alpha1.TrialFailure, limit int) *v1alpha1.RolloutHalt {
	seen := map[string][]string{}
	for _, f := range failures { // oldest first
		if f.Accepted {
			continue
		}
		seen[f.Key] = append(seen[f.Key], f.Machine)
		if len(seen[f.Key]) == limit {
			return &v1alpha1.RolloutHalt{What: f.What, Key: f.Key, Machines: seen[f.Key], MaxFailures: int32(limit)}
		}
	}
	return nil
}

// HaltMessage says why the rollout halted and how it goes on, for the Cluster's status and
// the machines that wait.
func HaltMessage(h *v1alpha1.RolloutHalt, failures []v1alpha1.TrialFailure) string {
	var each []string
	for _, f := range failures {
		if f.Key == h.Key && !f.Accepted {
			each = append(each, fmt.Sprintf("%s (%s: %s)", f.Machine, f.Reason, f.Message))
		}
	}
	n := "1 machine"
	if len(h.Machines) != 1 {
		n = fmt.Sprintf("%d machines", len(h.Machines))
	}
	return fmt.Sprintf("the rollout halted: %s failed the trial of %s, spec.rollout.maxFailures is %d: %s; no new reboot turn until liken rollout resume accepts these failures or the spec asks for something else",
		n, h.What, h.MaxFailures, strings.Join(each, "; "))
}

// GateFailureKey is what a machine's failed gates count against when it did not change
// its release in that turn: the gate, across every machine.
const GateFailureKey = "gate:"

// recordGateFailures adds to the Cluster's status a failure for each drained turn whose
// machine is back, healthy by its own account, and failed its gates: the failure of the
// release the machine runs now when that is the release it is meant to run (the rollout's),
// else of the gate itself. Each is recorded once (by machine and when its checks began).
func recordGateFailures(st *v1alpha1.ClusterStatus, cl *v1alpha1.Cluster, machines []v1alpha1.Machine) {
	byName := map[string]*v1alpha1.Machine{}
	for i := range machines {
		byName[machines[i].Name] = &machines[i]
	}
	for _, t := range st.Turns {
		m := byName[t.Machine]
		g := t.Gates
		if m == nil || g == nil || g.Phase != v1alpha1.GateFailed || t.Phase != v1alpha1.TurnDrained || m.Status.Reboot.State != v1alpha1.RebootNone {
			continue
		}
		f := v1alpha1.TrialFailure{Machine: t.Machine, What: "gate " + g.Gate, Key: GateFailureKey + g.Gate,
			Reason: v1alpha1.ReasonGateFailed, Message: g.Message, At: g.Since}
		version := string(cl.Spec.Version)
		if m.Spec.Version != "" {
			version = string(m.Spec.Version)
		}
		if r, digest := m.Status.Release, string(cl.Spec.Releases[version]); r != nil && digest != "" && r.Digest == digest {
			f.What, f.Key = fmt.Sprintf("release %s (%s)", version, digest), digest
		}
		if st.Rollout == nil {
			st.Rollout = &v1alpha1.RolloutStatus{TargetVersion: string(cl.Spec.Version)}
		}
		known := false
		for _, o := range st.Rollout.GateFailures {
			known = known || (o.Machine == f.Machine && o.At.Equal(&f.At))
		}
		if !known {
			st.Rollout.GateFailures = append(st.Rollout.GateFailures, f)
		}
	}
	if ro := st.Rollout; ro != nil && len(ro.GateFailures) > maxGateFailures {
		ro.GateFailures = ro.GateFailures[len(ro.GateFailures)-maxGateFailures:]
	}
}

// maxGateFailures is how many gate failures the Cluster's status keeps (the newest).
const maxGateFailures = 256
