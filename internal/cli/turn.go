package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"liken.dev/liken/api/v1alpha1"
)

func newReleaseTurn() *cobra.Command {
	var (
		o  output
		k  kubeFlags
		by string
	)
	cmd := &cobra.Command{
		Use:   "release-turn MACHINE",
		Short: "give back the disruption-budget turn of a machine that does not come back",
		Long: `A machine keeps its disruption-budget turn until it is back and healthy, however long
that takes: liken never lets a turn expire silently, so a machine that never returns
holds the budget, and 'liken status' and the Cluster's Degraded condition say so.
release-turn marks that machine's turn as given back by you (status.turns[].releasedBy);
the coordinator then takes it back, uncordoning the Node unless it was cordoned before
the turn. The machine's Node still counts against the budget while it is NotReady.`,
		Example: `  liken release-turn worker-7`,
		Args:    exactArgs(1, "the Machine whose turn to give back"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			lc, who, err := k.liken(by)
			if err != nil {
				return err
			}
			name := args[0]
			var turn v1alpha1.Turn
			for try := 0; ; try++ {
				cl, err := lc.Cluster(cmd.Context())
				if err != nil {
					return fmt.Errorf("reading the Cluster: %w", err)
				}
				i := -1
				for j, t := range cl.Status.Turns {
					if t.Machine == name {
						i = j
					}
				}
				if i < 0 {
					return fmt.Errorf("%s holds no disruption-budget turn (liken status shows who does)", name)
				}
				cl.Status.Turns[i].ReleasedBy = who
				turn = cl.Status.Turns[i]
				// Conditional on the version read: a turn is given back only as it was shown.
				_, err = lc.UpdateClusterStatus(cmd.Context(), cl)
				if err == nil {
					break
				}
				if !apierrors.IsConflict(err) || try == 2 {
					if apierrors.IsConflict(err) {
						return errors.New("the Cluster's status kept changing; try again")
					}
					return fmt.Errorf("writing the Cluster's status: %w", err)
				}
			}
			return o.print(cmd.OutOrStdout(), turn, func(w io.Writer) {
				fmt.Fprintf(w, "gave back %s's turn (held since %s, phase %s); the coordinator takes it back", name, turn.Since.UTC().Format("2006-01-02T15:04:05Z"), turn.Phase)
				if turn.CordonedBefore {
					fmt.Fprintln(w, "; the Node stays cordoned, as it was before the turn")
				} else {
					fmt.Fprintln(w, " and uncordons the Node")
				}
			})
		},
	}
	cmd.Flags().StringVar(&by, "released-by", "", "who gives the turn back (default: the kubeconfig's user, else $USER)")
	o.add(cmd)
	k.add(cmd)
	return cmd
}
