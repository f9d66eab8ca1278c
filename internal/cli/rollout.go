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
			r := &v1alpha1.Rollout{Paused: true, PausedBy: who, PausedAt: &metav1.Time{Time: time.Now().UTC().Truncate(time.Second)}, Reason: reason}
			cl, was, err := setRollout(cmd.Context(), lc, r)
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), cl.Spec.Rollout, func(w io.Writer) {
				if was.IsPaused() {
					fmt.Fprintln(w, "the rollout was paused already; paused again, now:")
				}
				fmt.Fprintln(w, coordinator.PausedMessage(r))
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
		Use:     "resume",
		Short:   "give reboot turns again, as the budget allows",
		Long:    `Clears the Cluster's spec.rollout: machines waiting for a turn get one again as the disruption budget allows.`,
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
			cl, was, err := setRollout(cmd.Context(), lc, nil)
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), cl.Spec.Rollout, func(w io.Writer) {
				if !was.IsPaused() {
					fmt.Fprintln(w, "the rollout was not paused: nothing changed")
					return
				}
				fmt.Fprintf(w, "resumed (it was: %s)\n", coordinator.PausedMessage(was))
			})
		},
	}
	o.add(cmd)
	k.add(cmd)
	return cmd
}

// setRollout writes the Cluster's spec.rollout (nil clears it), again from a fresh read
// after a conflict or a passing failure, and returns the Cluster and what it was before.
func setRollout(ctx context.Context, lc *kube.Client, r *v1alpha1.Rollout) (cl *v1alpha1.Cluster, was *v1alpha1.Rollout, err error) {
	err = kube.Retry(ctx, time.Minute, func(ctx context.Context) error {
		c, err := lc.Cluster(ctx)
		if err != nil {
			return fmt.Errorf("reading the Cluster: %w", err)
		}
		was = c.Spec.Rollout
		if !was.IsPaused() && r == nil {
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
