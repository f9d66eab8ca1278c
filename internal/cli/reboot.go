package cli

import (
	"context"
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
	"k8s.io/client-go/rest"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/policy"
)

// approval is one approval approve-reboot wrote, as -o prints it.
type approval struct {
	Machine     string   `json:"machine"`
	PendingHash string   `json:"pendingHash"`
	Fields      []string `json:"fields"`
}

// requestField is the pending entry of an operator's reboot request (the agent's name for
// it, in status.pending).
const requestField = "machine.spec.reboot.request"

// defaultWait is how long approve-reboot waits, by default, for an agent to see a reboot
// request: an agent that is up sees an edit within seconds.
const defaultWait = time.Minute

func newApproveReboot() *cobra.Command {
	var (
		o    output
		k    kubeFlags
		all  bool
		by   string
		wait time.Duration
		down []string
	)
	cmd := &cobra.Command{
		Use:   "approve-reboot MACHINE... | --all",
		Short: "approve the reboot a machine waits for, bound to exactly its pending set",
		Long: `Approves the reboot each named Machine waits for under rebootPolicy Manual: it writes
spec.reboot.approval with the Machine's current status.pendingHash, who approved and when.
The approval covers exactly that set of staged changes (and reboot request): anything
staged after it needs a new approval. The pending set approved is always the one the
Machine's status gives for its latest spec: a pending set the agent computed before the
last edit is never approved.

A Machine whose reboot request (liken request-reboot) its agent has not seen yet is waited
for, up to --wait (default 1m), and then its new pending set, the request included, is
approved. Any other edit the agent has not seen yet is refused, unless --wait is given:
then it is waited for too. --wait 0 never waits. --wait bounds the whole command, however
many machines it waits for.

A server that is unavailable (NotReady) does not get its turn while another server is down
too: it may still be a healthy etcd voter, and liken does not decide alone that the control
plane keeps its quorum without both. --servers-down names the other servers the operator
accepts as down for this approval; the server then goes as soon as those, and no others,
are the servers down.`,
		Example: `  liken approve-reboot worker-7
  liken request-reboot worker-7 && liken approve-reboot worker-7
  liken approve-reboot worker-7 --wait 5m
  liken approve-reboot --all --kubeconfig layer/admin.kubeconfig
  liken approve-reboot server-1 --servers-down server-2`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if all == (len(args) > 0) {
				return usageErr("name the machines to approve, or give --all")
			}
			if wait < 0 {
				return usageErr("--wait %s: give a duration of 0 or more, such as 1m", wait)
			}
			if len(down) > 0 && all {
				return usageErr("--servers-down is for the servers named, not --all")
			}
			w := waiting{limit: wait, edits: cmd.Flags().Changed("wait"), deadline: time.Now().Add(wait)}
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
				a, err := approve(cmd, lc, name, who, w, down)
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
	cmd.Flags().StringSliceVar(&down, "servers-down", nil, "other servers this server's reboot may go ahead without, down as it is itself (see above)")
	cmd.Flags().DurationVar(&wait, "wait", defaultWait, "how long to wait for an agent to see a reboot request; given, any edit it has not seen is waited for too (0: never wait)")
	o.add(cmd)
	k.add(cmd)
	return cmd
}

// waiting is what approve-reboot waits for: up to limit, ending at deadline for every
// machine together; edits: any edit the agent has not seen (--wait given), not only a
// reboot request.
type waiting struct {
	limit    time.Duration
	edits    bool
	deadline time.Time
}

func approve(cmd *cobra.Command, lc *kube.Client, name, who string, w waiting, serversDown []string) (approval, error) {
	m, err := lc.Machine(cmd.Context(), name)
	if apierrors.IsNotFound(err) {
		return approval{}, fmt.Errorf("no Machine %q", name)
	}
	if err != nil {
		return approval{}, fmt.Errorf("reading Machine %s: %w", name, err)
	}
	if len(serversDown) > 0 && m.Spec.Role != v1alpha1.RoleServer {
		return approval{}, fmt.Errorf("--servers-down: %s is an agent; only a server waits for other servers", name)
	}
	for _, s := range serversDown {
		o, err := lc.Machine(cmd.Context(), s)
		switch {
		case s == name:
			return approval{}, fmt.Errorf("--servers-down names %s itself", name)
		case apierrors.IsNotFound(err):
			return approval{}, fmt.Errorf("--servers-down: no Machine %q", s)
		case err != nil:
			return approval{}, fmt.Errorf("reading Machine %s: %w", s, err)
		case o.Spec.Role != v1alpha1.RoleServer:
			return approval{}, fmt.Errorf("--servers-down: %s is not a server", s)
		}
	}
	if m.Status.ObservedGeneration < m.Generation {
		// The pending set in status is the one before the last edit: approving it would
		// approve a set that is no longer the machine's.
		what := "the last edit of its spec"
		if at := unseenRequest(m); at != nil {
			what = "its reboot request of " + at.UTC().Format(time.RFC3339)
		} else if !w.edits {
			return approval{}, errors.New("its status does not describe its latest spec yet (the agent has not seen the last edit): look at it again in a moment, or give --wait 1m to wait for it")
		}
		if w.limit == 0 {
			return approval{}, fmt.Errorf("its agent has not seen %s yet, and --wait 0 does not wait for it", what)
		}
		if m, err = waitForAgent(cmd, lc, m, what, w); err != nil {
			return approval{}, err
		}
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
	// The approval is given only for the set shown here: the patch tests, where the API
	// server applies it, that the spec is the one read (its generation) and the pending set
	// the one shown, so an edit meanwhile refuses it, and a change of status alone (the agent
	// refreshing its conditions or progress, however often) does not. The approval is
	// replaced whole: an earlier approval's serversDown must not outlive it.
	var prev *v1alpha1.RebootApproval
	if m.Spec.Reboot != nil {
		prev = m.Spec.Reboot.Approval
	}
	fields := map[string]any{"pendingHash": a.PendingHash, "approvedAt": v1alpha1.NewApprovalTime(prev, a.PendingHash, time.Now())}
	if who != "" {
		fields["approvedBy"] = who
	}
	if len(serversDown) > 0 {
		fields["serversDown"] = serversDown
	}
	if err := writeApproval(cmd.Context(), lc, m, fields); err != nil {
		return approval{}, err
	}
	return a, nil
}

// writeApproval writes fields as m's approval if m's spec and pending set are still the ones
// read (see approve).
func writeApproval(ctx context.Context, lc *kube.Client, m *v1alpha1.Machine, fields map[string]any) error {
	ops := []map[string]any{
		{"op": "test", "path": "/metadata/generation", "value": m.Generation},
		{"op": "test", "path": "/status/pendingHash", "value": m.Status.PendingHash},
	}
	if m.Spec.Reboot == nil {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/reboot", "value": map[string]any{"approval": fields}})
	} else {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/reboot/approval", "value": fields})
	}
	patch, _ := json.Marshal(ops)
	if _, err := lc.PatchMachineJSON(ctx, m.Name, patch); err != nil {
		if now, rerr := lc.Machine(ctx, m.Name); rerr == nil && !sameApproval(m, now) {
			return errors.New("the Machine changed while it was being approved; look at its pending set again")
		}
		return fmt.Errorf("writing the approval: %w", err)
	}
	return nil
}

// sameApproval says whether the Machine now differs from the one read only in its status,
// with the same pending set, still describing its spec: an approval for before holds now.
func sameApproval(before, now *v1alpha1.Machine) bool {
	return now.Generation == before.Generation && now.Status.ObservedGeneration >= now.Generation &&
		now.Status.PendingHash == before.Status.PendingHash
}

// unseenRequest is the time of the Machine's reboot request when its status shows neither
// that request pending nor carried out: the agent has not seen it yet.
func unseenRequest(m *v1alpha1.Machine) *metav1.Time {
	if m.Spec.Reboot == nil || m.Spec.Reboot.Request == nil {
		return nil
	}
	at := m.Spec.Reboot.Request.RequestedAt
	if h := m.Status.Reboot.LastRequestHandled; h != nil && h.Equal(&at) {
		return nil
	}
	for _, p := range m.Status.Pending {
		if p.Field == requestField && p.Since.Equal(&at) {
			return nil
		}
	}
	return &at
}

// waitForAgent waits until the Machine's status describes its latest spec (the agent
// writes observedGeneration with the pending set it computed for that generation), and
// returns the Machine then. It polls with gets, which approving needs anyway, rather than
// watching, which an operator's role may not allow.
func waitForAgent(cmd *cobra.Command, lc *kube.Client, m *v1alpha1.Machine, what string, w waiting) (*v1alpha1.Machine, error) {
	name := m.Name
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: waiting up to %s for the agent on %s to see %s (its status describes generation %d of %d)\n",
		name, time.Until(w.deadline).Round(time.Second), name, what, m.Status.ObservedGeneration, m.Generation)
	ctx, cancel := context.WithDeadline(cmd.Context(), w.deadline)
	defer cancel()
	var lastErr error
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if cmd.Context().Err() != nil {
				return nil, fmt.Errorf("waiting for the agent on %s to see %s: %w", name, what, cmd.Context().Err())
			}
			msg := fmt.Sprintf("the agent on %s did not see %s within %s: its status still describes generation %d of %d, so nothing was approved; is the machine up (liken status %s)?",
				name, what, w.limit, m.Status.ObservedGeneration, m.Generation, name)
			if lastErr != nil {
				msg += fmt.Sprintf(" (the last read of the Machine failed: %v)", lastErr)
			}
			return nil, errors.New(msg)
		case <-tick.C:
		}
		got, err := lc.Machine(ctx, name)
		switch {
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("the Machine %s was deleted while waiting for its agent", name)
		case err != nil:
			if ctx.Err() == nil {
				lastErr = err
			}
			continue
		}
		lastErr, m = nil, got
		if m.Status.ObservedGeneration >= m.Generation {
			return m, nil
		}
	}
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
	if k.cmd != nil {
		cfg.WarningHandler = warningPrinter{k.cmd.ErrOrStderr()}
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

// warningPrinter prints the API server's warnings as kubectl does ("Warning: ..."), a change
// warning (internal/policy) without the policy's name in front: what a change of the
// Cluster or a Machine does to the machines.
type warningPrinter struct{ w io.Writer }

// WarningPrinter is a client-go warning handler printing to w, as the commands print.
func WarningPrinter(w io.Writer) rest.WarningHandler { return warningPrinter{w} }

func (p warningPrinter) HandleWarningHeader(_ int, _ string, text string) {
	msg, _ := policy.Strip(text)
	fmt.Fprintf(p.w, "Warning: %s\n", msg)
}
