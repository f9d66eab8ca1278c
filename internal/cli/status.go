package cli

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
)

// fleet is what status prints.
type fleet struct {
	// Version is the Cluster's spec.version; Policy its rebootPolicy.
	Version string `json:"version"`
	Policy  string `json:"rebootPolicy"`
	// Coordinator is the machine leading reboot coordination; Turns who holds a
	// disruption-budget turn; DrainBlocked whose last drain was blocked.
	Coordinator  string                `json:"coordinator,omitempty"`
	Turns        []v1alpha1.Turn       `json:"turns,omitempty"`
	DrainBlocked []v1alpha1.DrainBlock `json:"drainBlocked,omitempty"`
	// TrialFailures are the failed trials of what the machines are meant to run now, which
	// count towards spec.rollout.maxFailures unless accepted.
	TrialFailures []v1alpha1.TrialFailure `json:"trialFailures,omitempty"`
	// SoakUntil is set while the fleet soaks after LastTurnEnded (spec.rollout.soak).
	SoakUntil     *metav1.Time        `json:"soakUntil,omitempty"`
	LastTurnEnded *v1alpha1.EndedTurn `json:"lastTurnEnded,omitempty"`
	Conditions    []metav1.Condition  `json:"conditions,omitempty"`
	Machines      []machineState      `json:"machines"`
}

// machineState is one Machine's row.
type machineState struct {
	Name    string `json:"name"`
	Role    string `json:"role"`
	Wanted  string `json:"wanted,omitempty"`
	Running string `json:"running,omitempty"`
	Slot    string `json:"slot,omitempty"`
	Upgrade string `json:"upgrade,omitempty"`
	Pending int32  `json:"pending"`
	Reboot  string `json:"reboot,omitempty"`
	Ready   string `json:"ready"`
	// Why says what the machine waits for, or what is wrong, in its own words.
	Why string `json:"why,omitempty"`
}

func newStatus() *cobra.Command {
	var o output
	var k kubeFlags
	cmd := &cobra.Command{
		Use:   "status [MACHINE...]",
		Short: "show the fleet: versions, pending changes, reboots, and what each machine waits for",
		Long: `Prints the Cluster's wanted release and reboot policy, then one row per Machine (or the
ones named): the release it should run and the one it runs, its slot and upgrade state,
its pending changes, where it is in a reboot, whether it is Ready, and in its own words
what it waits for or what is wrong.`,
		Example: `  liken status
  liken status worker-7 -o yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			lc, _, err := k.liken("")
			if err != nil {
				return err
			}
			f := fleet{}
			c, err := lc.Cluster(cmd.Context())
			if err != nil {
				return fmt.Errorf("reading the Cluster: %w", err)
			}
			f.Version, f.Policy = string(c.Spec.Version), string(c.Spec.RebootPolicy)
			f.Coordinator, f.Turns, f.DrainBlocked, f.Conditions = c.Status.Coordinator, c.Status.Turns, c.Status.DrainBlocked, c.Status.Conditions
			if c.Status.Rollout != nil {
				f.TrialFailures = c.Status.Rollout.Failures
				f.SoakUntil, f.LastTurnEnded = c.Status.Rollout.SoakUntil, c.Status.Rollout.LastTurnEnded
			}
			if f.Policy == "" {
				f.Policy = string(v1alpha1.RebootManual)
			}
			ms, err := lc.Machines(cmd.Context())
			if err != nil {
				return fmt.Errorf("listing Machines: %w", err)
			}
			want := map[string]bool{}
			for _, a := range args {
				want[a] = true
			}
			for _, m := range ms {
				if len(want) > 0 && !want[m.Name] {
					continue
				}
				delete(want, m.Name)
				f.Machines = append(f.Machines, row(&m))
			}
			for name := range want {
				return fmt.Errorf("no Machine %q", name)
			}
			sort.Slice(f.Machines, func(i, j int) bool { return f.Machines[i].Name < f.Machines[j].Name })
			return o.print(cmd.OutOrStdout(), f, func(w io.Writer) {
				fmt.Fprintf(w, "cluster: wanted release %s, rebootPolicy %s, %d machines\n", dash(f.Version), f.Policy, len(f.Machines))
				if f.Coordinator == "" {
					fmt.Fprintln(w, "coordinator: none has written the Cluster's status (one runs on each server machine)")
				} else {
					fmt.Fprintf(w, "coordinator: %s\n", f.Coordinator)
				}
				for _, t := range f.Turns {
					fmt.Fprintf(w, "turn: %s since %s (%s)", t.Machine, t.Since.UTC().Format(time.RFC3339), t.Phase)
					if t.ReleasedBy != "" {
						fmt.Fprintf(w, ", given back by %s", t.ReleasedBy)
					}
					if g := t.Gates; g != nil {
						fmt.Fprintf(w, ", gates %s since %s: %s", g.Phase, g.Since.UTC().Format(time.RFC3339), g.Message)
					}
					fmt.Fprintln(w)
				}
				for _, b := range f.DrainBlocked {
					fmt.Fprintf(w, "drain blocked: %s (%d times): %s\n", b.Machine, b.Attempts, b.Message)
				}
				for _, tf := range f.TrialFailures {
					accepted := ""
					if tf.Accepted {
						accepted = " (accepted by liken rollout resume)"
					}
					failed := "trial failed"
					if tf.Reason == v1alpha1.ReasonGateFailed {
						failed = "gates failed"
					}
					fmt.Fprintf(w, "%s: %s, %s at %s: %s: %s%s\n", failed, tf.Machine, tf.What, tf.At.UTC().Format(time.RFC3339), tf.Reason, tf.Message, accepted)
				}
				if f.SoakUntil != nil && f.LastTurnEnded != nil {
					fmt.Fprintf(w, "soaking: no new turn before %s (spec.rollout.soak), after %s's turn ended well at %s\n",
						f.SoakUntil.UTC().Format(time.RFC3339), f.LastTurnEnded.Machine, f.LastTurnEnded.At.UTC().Format(time.RFC3339))
				}
				for _, c := range f.Conditions {
					if (c.Type == v1alpha1.ClusterDegraded && c.Status == metav1.ConditionTrue) || (c.Type == v1alpha1.ClusterAvailable && c.Status == metav1.ConditionFalse) ||
						(c.Type == v1alpha1.ClusterRolloutPaused && c.Status == metav1.ConditionTrue) {
						fmt.Fprintf(w, "%s=%s: %s\n", c.Type, c.Status, c.Message)
					}
				}
				fmt.Fprintln(w)
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "MACHINE\tROLE\tWANTED\tRUNNING\tSLOT\tUPGRADE\tPENDING\tREBOOT\tREADY\tWHY")
				for _, r := range f.Machines {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Name, r.Role, dash(r.Wanted), dash(r.Running), dash(r.Slot),
						dash(r.Upgrade), r.Pending, dash(r.Reboot), r.Ready, r.Why)
				}
				tw.Flush()
			})
		},
	}
	o.add(cmd)
	k.add(cmd)
	return cmd
}

func row(m *v1alpha1.Machine) machineState {
	s := m.Status
	r := machineState{Name: m.Name, Role: string(m.Spec.Role), Wanted: s.Upgrade.WantedVersion, Upgrade: string(s.Upgrade.State),
		Pending: s.PendingCount, Reboot: string(s.Reboot.State), Ready: "Unknown"}
	if s.Release != nil {
		r.Running, r.Slot = s.Release.Version, string(s.Release.Slot)
	}
	ready := meta.FindStatusCondition(s.Conditions, v1alpha1.MachineReady)
	if ready != nil {
		r.Ready = string(ready.Status)
	}
	switch {
	case s.ObservedGeneration != m.Generation:
		r.Why = "the machine has not reported on its latest spec yet"
	case s.Reboot.State != "" && s.Reboot.State != v1alpha1.RebootNone:
		r.Why = s.Reboot.Message
	case s.Upgrade.State != "" && s.Upgrade.State != v1alpha1.UpgradeIdle:
		r.Why = s.Upgrade.Message
	case ready != nil && ready.Status != "True":
		r.Why = ready.Message
	case meta.IsStatusConditionTrue(s.Conditions, v1alpha1.MachineUpgradeFailed):
		r.Why = meta.FindStatusCondition(s.Conditions, v1alpha1.MachineUpgradeFailed).Message
	case meta.IsStatusConditionTrue(s.Conditions, v1alpha1.MachineDegraded):
		r.Why = meta.FindStatusCondition(s.Conditions, v1alpha1.MachineDegraded).Message
	}
	return r
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
