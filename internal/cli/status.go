package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
)

// fleet is what status prints.
type fleet struct {
	// Version is the Cluster's spec.version; Policy its rebootPolicy.
	Version string `json:"version"`
	Policy  string `json:"rebootPolicy"`
	// ChannelRoot is the channel's trusted root (spec.channelRoot); Unsigned: releases are
	// taken unverified (spec.insecureUnsignedChannel).
	ChannelRoot string `json:"channelRoot,omitempty"`
	Unsigned    bool   `json:"insecureUnsignedChannel,omitempty"`
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
	// Address is the node address the Machine reports; Digest its release's; Booted when
	// this boot began; Hardware the system's vendor and product (-o wide).
	Address  string `json:"address,omitempty"`
	Digest   string `json:"digest,omitempty"`
	Booted   string `json:"booted,omitempty"`
	Hardware string `json:"hardware,omitempty"`
	// EtcdSnapshot is a server's etcd snapshot for its last turn (status.etcdSnapshot).
	EtcdSnapshot *v1alpha1.EtcdSnapshotStatus `json:"etcdSnapshot,omitempty"`
	// Watchdog is the identity of the watchdog the machine arms (status.hardware.watchdogs[0]).
	Watchdog string `json:"watchdog,omitempty"`
	// EtcdRestore is a server's last restore of etcd from a snapshot (status.etcdRestore).
	EtcdRestore *v1alpha1.EtcdRestoreStatus `json:"etcdRestore,omitempty"`
	// EtcdRejoin is a server's last rejoin of etcd without its data (status.etcdRejoin).
	EtcdRejoin *v1alpha1.EtcdRejoinStatus `json:"etcdRejoin,omitempty"`
}

// statusFlags are status's output options beyond -o json|yaml, as kubectl users know them.
type statusFlags struct {
	format    string // "", json, yaml, wide, name
	noHeaders bool
	watch     bool
}

func newStatus() *cobra.Command {
	var sf statusFlags
	var k kubeFlags
	cmd := &cobra.Command{
		Use:   "status [MACHINE...]",
		Short: "show the fleet: versions, pending changes, reboots, and what each machine waits for",
		Long: `Prints the Cluster's wanted release and reboot policy, then one row per Machine (or the
ones named): the release it should run and the one it runs, its slot and upgrade state,
its pending changes, where it is in a reboot, whether it is Ready, and in its own words
what it waits for or what is wrong.

-o wide adds each Machine's node address, release digest, last boot and hardware; -o name
prints machine.liken.dev/NAME lines; --no-headers leaves out the cluster's lines and the
table's header; -w prints the whole view again, with its time, each time it changes, until
interrupted.`,
		Example: `  liken status
  liken status worker-7 -o yaml
  liken status -w
  liken status -o wide --no-headers`,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch sf.format {
			case "", "json", "yaml", "wide", "name":
			default:
				return usageErr("--output %q: give json, yaml, wide or name", sf.format)
			}
			lc, _, err := k.liken("")
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			last, err := printView(cmd.Context(), lc, args, sf, out, "")
			if err != nil || !sf.watch {
				return err
			}
			return watchViews(cmd.Context(), lc, args, sf, out, last)
		},
	}
	cmd.Flags().StringVarP(&sf.format, "output", "o", "", "json, yaml, wide (more columns) or name (machine.liken.dev/NAME lines) instead of the table")
	cmd.Flags().BoolVar(&sf.noHeaders, "no-headers", false, "leave out the cluster's lines and the table's header")
	cmd.Flags().BoolVarP(&sf.watch, "watch", "w", false, "after the view, print it again each time it changes, until interrupted")
	k.add(cmd)
	return cmd
}

// view reads what status shows: the Cluster and the Machines (those named, or all).
func view(ctx context.Context, lc *kube.Client, names []string) (fleet, error) {
	f := fleet{}
	c, err := lc.Cluster(ctx)
	if err != nil {
		return f, fmt.Errorf("reading the Cluster: %w", err)
	}
	f.Version, f.Policy, f.ChannelRoot, f.Unsigned = string(c.Spec.Version), string(c.Spec.RebootPolicy), string(c.Spec.ChannelRoot), c.Spec.InsecureUnsignedChannel
	f.Coordinator, f.Turns, f.DrainBlocked, f.Conditions = c.Status.Coordinator, c.Status.Turns, c.Status.DrainBlocked, c.Status.Conditions
	if c.Status.Rollout != nil {
		f.TrialFailures = c.Status.Rollout.Failures
		f.SoakUntil, f.LastTurnEnded = c.Status.Rollout.SoakUntil, c.Status.Rollout.LastTurnEnded
	}
	if f.Policy == "" {
		f.Policy = string(v1alpha1.RebootManual)
	}
	ms, err := lc.Machines(ctx)
	if err != nil {
		return f, fmt.Errorf("listing Machines: %w", err)
	}
	want := map[string]bool{}
	for _, a := range names {
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
		return f, fmt.Errorf("no Machine %q", name)
	}
	sort.Slice(f.Machines, func(i, j int) bool { return f.Machines[i].Name < f.Machines[j].Name })
	return f, nil
}

// printView reads the view and prints it unless it renders as last; it returns what it
// rendered. stamp, when set, heads the print (a watch's time).
func printView(ctx context.Context, lc *kube.Client, names []string, sf statusFlags, w io.Writer, last string) (string, error) {
	f, err := view(ctx, lc, names)
	if err != nil {
		return last, err
	}
	var b strings.Builder
	if err := render(&b, f, sf); err != nil {
		return last, err
	}
	if b.String() == last {
		return last, nil
	}
	if last != "" { // a watch's later view
		switch sf.format {
		case "yaml":
			fmt.Fprintln(w, "---")
		case "", "wide":
			fmt.Fprintf(w, "\n%s\n", time.Now().Format(time.TimeOnly))
		}
	}
	_, err = io.WriteString(w, b.String())
	return b.String(), err
}

// watchViews prints the view again each time the Cluster or a Machine changes, until ctx
// ends (an interrupt): informers keep the watches (they list and watch again after an API
// server's restart), and a burst of changes prints once.
func watchViews(ctx context.Context, lc *kube.Client, names []string, sf statusFlags, w io.Writer, last string) error {
	var cluster <-chan struct{}
	_, machines, err := kube.Watch(ctx, lc.MachinesListWatch(), &v1alpha1.Machine{})
	if err == nil {
		_, cluster, err = kube.Watch(ctx, lc.ClusterListWatch(), &v1alpha1.Cluster{})
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted before the watches began
		}
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-machines:
		case <-cluster:
		}
		select { // let a burst of changes settle
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
		next, err := printView(ctx, lc, names, sf, w, last)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintf(w, "%s: %v (watching on)\n", time.Now().Format(time.TimeOnly), err)
			continue
		}
		last = next
	}
}

// render writes f as status shows it.
func render(w io.Writer, f fleet, sf statusFlags) error {
	switch sf.format {
	case "json", "yaml":
		return (&output{format: sf.format}).print(w, f, nil)
	case "name":
		for _, r := range f.Machines {
			fmt.Fprintf(w, "machine.%s/%s\n", v1alpha1.GroupVersion.Group, r.Name)
		}
		return nil
	}
	if !sf.noHeaders {
		summary(w, f)
	}
	wide := sf.format == "wide"
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if !sf.noHeaders {
		h := "MACHINE\tROLE\tWANTED\tRUNNING\tSLOT\tUPGRADE\tPENDING\tREBOOT\tREADY"
		if wide {
			h += "\tADDRESS\tDIGEST\tBOOTED\tHARDWARE"
		}
		fmt.Fprintln(tw, h+"\tWHY")
	}
	for _, r := range f.Machines {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s", r.Name, r.Role, dash(r.Wanted), dash(r.Running), dash(r.Slot),
			dash(r.Upgrade), r.Pending, dash(r.Reboot), r.Ready)
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s", dash(r.Address), dash(shortDigest(r.Digest)), dash(r.Booted), dash(r.Hardware))
		}
		fmt.Fprintf(tw, "\t%s\n", r.Why)
	}
	return tw.Flush()
}

// summary is the cluster's lines above the table.
func summary(w io.Writer, f fleet) {
	fmt.Fprintf(w, "cluster: wanted release %s, rebootPolicy %s, %d machines\n", dash(f.Version), f.Policy, len(f.Machines))
	switch {
	case f.ChannelRoot != "":
		fmt.Fprintf(w, "channel: signed; machines write only releases its keys signed (root %s)\n", shortDigest(f.ChannelRoot))
	case f.Unsigned:
		fmt.Fprintln(w, "channel: INSECURE: releases taken as pinned, unverified (spec.insecureUnsignedChannel): nothing proves who published them")
	default:
		fmt.Fprintln(w, "channel: no root named (spec.channelRoot): machines write no release until the Cluster names the channel's signed root (docs/upgrade.md)")
	}
	if f.Coordinator == "" {
		fmt.Fprintln(w, "coordinator: none has written the Cluster's status (one runs on each server machine)")
	} else {
		fmt.Fprintf(w, "coordinator: %s\n", f.Coordinator)
	}
	if c := meta.FindStatusCondition(f.Conditions, v1alpha1.ClusterControlPlaneQuorum); c != nil && c.Status != metav1.ConditionUnknown {
		fmt.Fprintf(w, "control plane: %s: %s\n", c.Reason, c.Message)
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
	for _, r := range f.Machines {
		if s := r.EtcdSnapshot; s != nil {
			fmt.Fprintf(w, "etcd snapshot: %s: %s\n", r.Name, snapshotWords(s))
		}
	}
	for _, r := range f.Machines {
		if e := r.EtcdRestore; e != nil {
			at := e.At.UTC().Format(time.RFC3339)
			if e.Error != "" {
				fmt.Fprintf(w, "etcd restore: %s: from %s FAILED at %s (k3s started on etcd's data as it was): %s\n", r.Name, e.Snapshot, at, e.Error)
			} else {
				fmt.Fprintf(w, "etcd restore: %s: restored from %s at %s; what the cluster wrote after that snapshot is gone\n", r.Name, e.Snapshot, at)
			}
		}
	}
	for _, r := range f.Machines {
		if e := r.EtcdRejoin; e != nil {
			at := e.At.UTC().Format(time.RFC3339)
			switch {
			case e.Error != "":
				fmt.Fprintf(w, "etcd rejoin: %s: request %q REFUSED at %s (k3s started on etcd's data as it was): %s\n", r.Name, e.Request, at, e.Error)
			case e.MovedTo != "":
				fmt.Fprintf(w, "etcd rejoin: %s: request %q at %s: its etcd data set aside (server/db/%s), k3s to join as a new member\n", r.Name, e.Request, at, e.MovedTo)
			default:
				fmt.Fprintf(w, "etcd rejoin: %s: request %q at %s: it had no etcd data, k3s to join as a new member\n", r.Name, e.Request, at)
			}
		}
	}
	for _, r := range f.Machines {
		if r.Watchdog == v1alpha1.SoftwareWatchdog {
			fmt.Fprintf(w, "watchdog: %s: softdog only, no hardware watchdog liken drives: a hang of the kernel itself will not reset it\n", r.Name)
		}
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
}

// shortDigest is a digest's algorithm and first 12 hex digits, as image IDs are shown.
func shortDigest(d string) string {
	if alg, hex, ok := strings.Cut(d, ":"); ok && len(hex) > 12 {
		return alg + ":" + hex[:12]
	}
	return d
}

func row(m *v1alpha1.Machine) machineState {
	s := m.Status
	r := machineState{Name: m.Name, Role: string(m.Spec.Role), Wanted: s.Upgrade.WantedVersion, Upgrade: string(s.Upgrade.State),
		Pending: s.PendingCount, Reboot: string(s.Reboot.State), Ready: "Unknown"}
	if s.Release != nil {
		r.Running, r.Slot, r.Digest = s.Release.Version, string(s.Release.Slot), s.Release.Digest
		if s.Release.BootTime != nil {
			r.Booted = s.Release.BootTime.UTC().Format(time.RFC3339)
		}
	}
	if h := s.Hardware; h != nil {
		r.Hardware = strings.TrimSpace(h.System.Vendor + " " + h.System.Product)
		if len(h.Watchdogs) > 0 {
			r.Watchdog = h.Watchdogs[0].Identity
		}
	}
	r.EtcdSnapshot = s.EtcdSnapshot
	r.EtcdRestore = s.EtcdRestore
	r.EtcdRejoin = s.EtcdRejoin
	// The node's address: the one k3s is given (spec.network.nodeIP), else the first
	// address the machine reports on a link.
	if m.Spec.Network != nil && m.Spec.Network.NodeIP != "" {
		r.Address = m.Spec.Network.NodeIP
	} else if s.Network != nil {
		for _, l := range s.Network.Links {
			if len(l.Addresses) > 0 {
				r.Address, _, _ = strings.Cut(l.Addresses[0], "/")
				break
			}
		}
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

// snapshotWords is a server's etcd snapshot for its last turn, in words.
func snapshotWords(s *v1alpha1.EtcdSnapshotStatus) string {
	turn := s.Turn.UTC().Format(time.RFC3339)
	if s.Error != "" {
		return fmt.Sprintf("FAILED for the turn given at %s (tried again every minute; the drain waits): %s", turn, s.Error)
	}
	at := "?"
	if s.TakenAt != nil {
		at = s.TakenAt.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s (%d bytes) taken at %s for the turn given at %s, %s", s.Name, s.SizeBytes, at, turn, s.For)
}
