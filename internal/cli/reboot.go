package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
)

// approval is one approval approve-reboot wrote, as -o prints it.
type approval struct {
	Machine     string   `json:"machine"`
	PendingHash string   `json:"pendingHash"`
	Fields      []string `json:"fields"`
}

func newApproveReboot() *cobra.Command {
	var (
		o   output
		k   kubeFlags
		all bool
		by  string
	)
	cmd := &cobra.Command{
		Use:   "approve-reboot MACHINE... | --all",
		Short: "approve the reboot a machine waits for, bound to exactly its pending set",
		Long: `Approves the reboot each named Machine waits for under rebootPolicy Manual: it writes
spec.reboot.approval with the Machine's current status.pendingHash, who approved and when.
The approval covers exactly that set of staged changes (and reboot request): anything
staged after it needs a new approval. A Machine whose status does not yet describe its
latest spec is refused, so an approval is never given for a set you have not seen.`,
		Example: `  liken approve-reboot worker-7
  liken approve-reboot --all --kubeconfig layer/admin.kubeconfig`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if all == (len(args) > 0) {
				return usageErr("name the machines to approve, or give --all")
			}
			lc, who, err := k.liken(by)
			if err != nil {
				return err
			}
			if all {
				ms, err := lc.Machines(cmd.Context())
				if err != nil {
					return fmt.Errorf("listing Machines: %w", err)
				}
				for _, m := range ms {
					done := m.Spec.Reboot != nil && m.Spec.Reboot.Approval != nil && m.Spec.Reboot.Approval.PendingHash == m.Status.PendingHash
					if m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval && !done {
						args = append(args, m.Name)
					}
				}
				if len(args) == 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), "no machine waits for an approval")
				}
			}
			var done []approval
			var failed []string
			for _, name := range args {
				a, err := approve(cmd, lc, name, who)
				if err != nil {
					failed = append(failed, err.Error())
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", name, err)
					continue
				}
				done = append(done, a)
			}
			if err := o.print(cmd.OutOrStdout(), done, func(w io.Writer) {
				for _, a := range done {
					fmt.Fprintf(w, "approved %s: pending set %s (%s)\n", a.Machine, a.PendingHash, strings.Join(a.Fields, ", "))
				}
			}); err != nil {
				return err
			}
			if len(failed) > 0 {
				return fmt.Errorf("%d of %d machines not approved", len(failed), len(args))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "approve every Machine that waits for an approval it has not been given")
	cmd.Flags().StringVar(&by, "approved-by", "", "who approves (default: the kubeconfig's user, else $USER)")
	o.add(cmd)
	k.add(cmd)
	return cmd
}

func approve(cmd *cobra.Command, lc *kube.Client, name, who string) (approval, error) {
	m, err := lc.Machine(cmd.Context(), name)
	if apierrors.IsNotFound(err) {
		return approval{}, fmt.Errorf("no Machine %q", name)
	}
	if err != nil {
		return approval{}, fmt.Errorf("reading Machine %s: %w", name, err)
	}
	if m.Status.ObservedGeneration != m.Generation {
		return approval{}, errors.New("its status does not describe its latest spec yet (the agent has not seen the last edit); look at it again in a moment")
	}
	if m.Status.PendingHash == "" {
		return approval{}, errors.New("nothing is pending: there is no reboot to approve")
	}
	a := approval{Machine: name, PendingHash: m.Status.PendingHash}
	for _, p := range m.Status.Pending {
		a.Fields = append(a.Fields, p.Field)
	}
	if r := m.Spec.Reboot; r != nil && r.Approval != nil && r.Approval.PendingHash == a.PendingHash {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: this pending set was approved already (by %s); approving it again\n", name, r.Approval.ApprovedBy)
	}
	// The resourceVersion makes the write fail if the Machine changed since it was read: an
	// approval is only given for the set shown here.
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": m.ResourceVersion},
		"spec": map[string]any{"reboot": map[string]any{"approval": v1alpha1.RebootApproval{
			PendingHash: a.PendingHash, ApprovedBy: who, ApprovedAt: &metav1.Time{Time: time.Now().UTC()}}}},
	})
	if _, err := lc.PatchMachine(cmd.Context(), name, patch); err != nil {
		if apierrors.IsConflict(err) {
			return approval{}, errors.New("the Machine changed while it was being approved; look at its pending set again")
		}
		return approval{}, fmt.Errorf("writing the approval: %w", err)
	}
	return a, nil
}

func newRequestReboot() *cobra.Command {
	var (
		o          output
		k          kubeFlags
		by, reason string
	)
	cmd := &cobra.Command{
		Use:   "request-reboot MACHINE",
		Short: "ask a machine to reboot when nothing has changed",
		Long: `Writes spec.reboot.request (now, who, and the reason) on the Machine. The request is
pending like a change: under rebootPolicy Manual it waits for 'liken approve-reboot', and
whatever else is staged is tried at the same reboot. It is done once the machine has
booted after it.`,
		Example: `  liken request-reboot worker-7 --reason "the NIC driver bound the wrong device"
  liken request-reboot worker-7 && liken approve-reboot worker-7`,
		Args: exactArgs(1, "the Machine to reboot"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			lc, who, err := k.liken(by)
			if err != nil {
				return err
			}
			req := v1alpha1.RebootRequest{RequestedAt: metav1.Time{Time: time.Now().UTC()}, RequestedBy: who, Reason: reason}
			patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"reboot": map[string]any{"request": req}}})
			m, err := lc.PatchMachine(cmd.Context(), args[0], patch)
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("no Machine %q", args[0])
			}
			if err != nil {
				return fmt.Errorf("writing the request: %w", err)
			}
			return o.print(cmd.OutOrStdout(), m.Spec.Reboot.Request, func(w io.Writer) {
				fmt.Fprintf(w, "requested a reboot of %s at %s; under rebootPolicy Manual it waits for: liken approve-reboot %s\n",
					args[0], req.RequestedAt.Format(time.RFC3339), args[0])
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, shown in the machine's status and Events")
	cmd.Flags().StringVar(&by, "requested-by", "", "who asks (default: the kubeconfig's user, else $USER)")
	o.add(cmd)
	k.add(cmd)
	return cmd
}

// liken is the liken.dev client for the kubeconfig, and who the user is: by when given,
// else the kubeconfig context's user, else $USER.
func (k *kubeFlags) liken(by string) (*kube.Client, string, error) {
	cc, _ := k.client()
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("reading the kubeconfig: %w", err)
	}
	lc, err := kube.NewClient(cfg)
	if err != nil {
		return nil, "", err
	}
	if by == "" {
		if raw, err := cc.RawConfig(); err == nil {
			ctx := raw.CurrentContext
			if k.context != "" {
				ctx = k.context
			}
			if c := raw.Contexts[ctx]; c != nil {
				by = c.AuthInfo
			}
		}
	}
	if by == "" {
		by = os.Getenv("USER")
	}
	return lc, by, nil
}
