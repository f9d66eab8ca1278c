package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/coordinator"
	"liken.dev/liken/internal/kube"
)

func newRollout() *cobra.Command {
	return group(&cobra.Command{
		Use:   "rollout",
		Short: "pause or resume the reboots changes need across the fleet",
	}, newRolloutPause(), newRolloutResume())
}

func newRolloutPause() *cobra.Command {
	var (
		o          output
		k          kubeFlags
		by, reason string
	)
	cmd := &cobra.Command{
		Use:   "pause [--reason WHY]",
		Short: "give no new reboot turn until resumed",
		Long: `Sets the Cluster's spec.rollout.paused, with who paused, when and why. While it is set
no machine is drained or rebooted for a change, whatever its approval or rebootPolicy; a
machine that has a turn already finishes it (its drain, its trial: it commits or falls
back), and changes that apply live or by restarting k3s still apply. The Cluster's status
(condition RolloutPaused) and liken status say so, and each waiting machine waits for it.`,
		Example: `  liken rollout pause --reason "checking the canary's workloads"`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			lc, who, err := k.liken(by)
			if err != nil {
				return err
			}
			var r v1alpha1.Rollout
			cl, was, err := setRollout(cmd.Context(), lc, func(_ *v1alpha1.Cluster, cur *v1alpha1.Rollout) bool {
				// maxFailures and resumedAt stay as they are.
				r = *cur
				r.Paused, r.PausedBy, r.PausedAt, r.Reason = true, who, &metav1.Time{Time: time.Now().UTC().Truncate(time.Second)}, reason
				*cur = r
				return true
			})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), cl.Spec.Rollout, func(w io.Writer) {
				if was.IsPaused() {
					fmt.Fprintln(w, "the rollout was paused already; paused again, now:")
				}
				fmt.Fprintln(w, coordinator.PausedMessage(&r))
				fmt.Fprintln(w, "turns given before finish; liken status shows them")
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, shown in the Cluster's status and Events")
	cmd.Flags().StringVar(&by, "paused-by", "", "who pauses (default: the kubeconfig's user, else $USER)")
	o.add(cmd)
	k.add(cmd)
	return cmd
}

func newRolloutResume() *cobra.Command {
	var (
		o output
		k kubeFlags
	)
	cmd := &cobra.Command{
		Use:   "resume",
		Short: "give reboot turns again, as the budget allows",
		Long: `Clears the Cluster's spec.rollout.paused (and who paused, when and why) and sets
spec.rollout.resumedAt to now: the failed trials recorded so far are accepted, so a rollout
the coordinator halted after spec.rollout.maxFailures of them goes on, and halts again only
after as many new ones. Machines waiting for a turn get one again as the disruption budget
allows.`,
		Example: `  liken rollout resume && liken status`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			lc, _, err := k.liken("")
			if err != nil {
				return err
			}
			now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
			cl, was, err := setRollout(cmd.Context(), lc, func(c *v1alpha1.Cluster, r *v1alpha1.Rollout) bool {
				if !r.Paused && !halted(c) {
					return false
				}
				r.Paused, r.PausedBy, r.PausedAt, r.Reason, r.ResumedAt = false, "", nil, "", &now
				return true
			})
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), cl.Spec.Rollout, func(w io.Writer) {
				h := halted(cl)
				switch {
				case !was.IsPaused() && !h:
					fmt.Fprintln(w, "the rollout was neither paused nor halted: nothing changed")
					return
				case was.IsPaused():
					fmt.Fprintf(w, "resumed (it was: %s)\n", coordinator.PausedMessage(was))
				}
				if h {
					fmt.Fprintf(w, "resumed after the halt (%s); the failed trials up to %s are accepted\n", cl.Status.Rollout.Halted.What, now.UTC().Format(time.RFC3339))
				}
			})
		},
	}
	o.add(cmd)
	k.add(cmd)
	return cmd
}

// setRollout changes the Cluster's spec.rollout with change (given the Cluster as read; it says whether anything
// is to be written), again from a fresh read after a conflict or a passing failure, and
// returns the Cluster and what spec.rollout was before.
func setRollout(ctx context.Context, lc *kube.Client, change func(c *v1alpha1.Cluster, r *v1alpha1.Rollout) bool) (cl *v1alpha1.Cluster, was *v1alpha1.Rollout, err error) {
	err = kube.Retry(ctx, time.Minute, func(ctx context.Context) error {
		c, err := lc.Cluster(ctx)
		if err != nil {
			return fmt.Errorf("reading the Cluster: %w", err)
		}
		was = c.Spec.Rollout.DeepCopy()
		r := c.Spec.Rollout.DeepCopy()
		if r == nil {
			r = &v1alpha1.Rollout{}
		}
		if !change(c, r) {
			cl = c
			return nil
		}
		c.Spec.Rollout = r
		if cl, err = lc.UpdateCluster(ctx, c); err != nil {
			return fmt.Errorf("writing the Cluster: %w", err)
		}
		return nil
	})
	return cl, was, err
}

// halted: the coordinator holds the rollout after failed trials (the Cluster's status).
func halted(cl *v1alpha1.Cluster) bool {
	return cl != nil && cl.Status.Rollout != nil && cl.Status.Rollout.Halted != nil
}
