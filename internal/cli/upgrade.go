package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/preview"
	"liken.dev/liken/internal/release"
)

// versionChange is one spec.version upgrade or rollback wrote, as -o prints it.
type versionChange struct {
	// Object is "Cluster" or "Machine NAME".
	Object string `json:"object"`
	From   string `json:"from"`
	// Inherited: a Machine ran the Cluster's version (it had none of its own).
	Inherited bool   `json:"inherited,omitempty"`
	To        string `json:"to"`
	// Pinned: the release was pinned in spec.releases by this command (--pin).
	Pinned bool `json:"pinned,omitempty"`
	// AnswerLost: the API server's answer to this command's write was lost (a timeout, a
	// connection cut), and the write made again found the change made.
	AnswerLost bool `json:"answerLost,omitempty"`
	// written: a try that failed later wrote this change and had the answer; unanswered:
	// its write was the one that failed.
	written, unanswered bool
}

func newUpgrade() *cobra.Command { return newVersionCommand(true) }

func newRollback() *cobra.Command { return newVersionCommand(false) }

// newVersionCommand is liken upgrade (up true) or liken rollback: both set spec.version,
// the Cluster's or, with --machine, the named Machines'; they differ in the direction
// they accept, and only upgrade may pin a release that is not pinned yet.
func newVersionCommand(up bool) *cobra.Command {
	var (
		o         output
		k         kubeFlags
		machines  []string
		pin       string
		allowTest bool
		dryRun    bool
	)
	cmd := &cobra.Command{
		Use:   "upgrade VERSION [--machine NAME]... [--pin DIGEST]",
		Short: "set the Cluster's spec.version to a newer pinned release",
		Long: `Sets spec.version, the release every machine runs, to VERSION: in the Cluster, or with
--machine in those Machines only (a canary: a Machine's version overrides the
Cluster's). VERSION must be newer than the version it replaces and pinned in the
Cluster's spec.releases; --pin DIGEST pins it in the same write, after checking that the
release document in the Cluster's channel has exactly that digest (get it from whoever
built the release, or from 'liken release pin'). Nothing reboots here: each machine
writes the release into its inactive slot and then waits, under rebootPolicy Manual, for
'liken approve-reboot', and always for its disruption-budget turn. 'liken status'
follows the rollout.`,
		Example: `  liken upgrade 2026.08.03-001
  liken upgrade 2026.08.03-001 --machine worker-7
  liken upgrade 2026.08.03-001 --pin sha256:3f5a...`,
	}
	if !up {
		cmd.Use = "rollback VERSION [--machine NAME]..."
		cmd.Short = "move the fleet or one machine back to an earlier pinned release"
		cmd.Long = `Sets spec.version back to VERSION, an earlier release pinned in the Cluster's
spec.releases: in the Cluster, or with --machine in those Machines only. A machine whose
other slot still holds that release (checked byte by byte) downloads nothing. Like any
release change it reboots only with an approval (rebootPolicy Manual) and on its
disruption-budget turn. A rollback never pins a release: it goes back to one you trusted
before.`
		cmd.Example = `  liken rollback 2026.07.20-001
  liken rollback 2026.07.20-001 --machine worker-7`
	}
	cmd.Args = exactArgs(1, "the release version, such as 2026.08.03-001")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := o.check(); err != nil {
			return err
		}
		version := args[0]
		if !apirelease.ValidVersion(version) {
			return usageErr("%q is not a release version such as 2026.07.20-001", version)
		}
		if pin != "" && !apirelease.ValidDigest(pin) {
			return usageErr("--pin takes a release digest, sha256:<64 hex digits>")
		}
		lc, _, err := k.liken("")
		if err != nil {
			return err
		}
		// Agents and the coordinator write the objects' status often during a rollout, and
		// a busy API server may time out: a write refused or lost for that is made again
		// from a fresh read, checks and all.
		if dryRun {
			var plan preview.Plan
			changes, err := setVersion(cmd, lc, up, version, pin, allowTest, machines, &plan)
			if err != nil {
				return err
			}
			out := struct {
				Changes []versionChange `json:"changes"`
				Plan    preview.Plan    `json:"plan"`
			}{changes, plan}
			return o.print(cmd.OutOrStdout(), out, func(w io.Writer) {
				for _, c := range changes {
					if c.From == c.To {
						fmt.Fprintf(w, "%s runs %s already: nothing would change\n", c.Object, c.To)
						continue
					}
					if c.Pinned {
						fmt.Fprintf(w, "would pin %s as %s in the Cluster's spec.releases\n", c.To, pin)
					}
					fmt.Fprintf(w, "would set %s spec.version: %s -> %s\n", c.Object, c.From, c.To)
				}
				printPlan(w, plan)
				fmt.Fprintln(w, "(dry run: nothing was written)")
			})
		}
		var changes []versionChange
		earlier := map[string]versionChange{} // what failed tries wrote, by object
		err = kube.Retry(cmd.Context(), time.Minute, func(context.Context) error {
			var err error
			changes, err = setVersion(cmd, lc, up, version, pin, allowTest, machines, nil)
			for _, c := range changes {
				// A write refused for a conflict was not made; one whose answer did not
				// come may have been.
				if c.written || (c.unanswered && !apierrors.IsConflict(err)) {
					if e, ok := earlier[c.Object]; !ok || !e.written {
						earlier[c.Object] = c
					}
				}
			}
			return err
		})
		if err != nil {
			return err
		}
		changes = settle(earlier, changes)
		return o.print(cmd.OutOrStdout(), changes, func(w io.Writer) {
			for _, c := range changes {
				if c.From == c.To {
					fmt.Fprintf(w, "%s runs %s already: nothing changed\n", c.Object, c.To)
					continue
				}
				lost := ""
				if c.AnswerLost {
					lost = " (the API server's answer to the write was lost; writing again found it made)"
				}
				if c.Pinned {
					fmt.Fprintf(w, "pinned %s as %s in the Cluster's spec.releases%s\n", c.To, pin, lost)
				}
				from := c.From
				if c.Inherited {
					from += " (the Cluster's)"
				}
				fmt.Fprintf(w, "%s spec.version: %s -> %s%s\n", c.Object, from, c.To, lost)
			}
			fmt.Fprintln(w, "each machine writes the release into its inactive slot, then waits for its disruption-budget turn (and, under rebootPolicy Manual, for liken approve-reboot); liken status follows it")
		})
	}
	cmd.Flags().StringSliceVar(&machines, "machine", nil, "set the version in these Machines only (repeatable)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "write nothing: say what would change and what each machine would do (as liken diff)")
	if up {
		cmd.Flags().StringVar(&pin, "pin", "", "pin VERSION to this release digest first, checked against the Cluster's channel")
		cmd.Flags().BoolVar(&allowTest, "allow-test-release", false, "with --pin, pin a release built for tests (with liken.test.* fault switches)")
	}
	o.add(cmd)
	k.add(cmd)
	return cmd
}

// settle is what a command that wrote again did: the changes its last try found to make
// (final), where earlier tries that failed had written a change the last found made already
// (earlier, by object): from what it changed, and whether the write's answer was lost.
func settle(earlier map[string]versionChange, final []versionChange) []versionChange {
	out := slices.Clone(final)
	for i, c := range out {
		e, ok := earlier[c.Object]
		if c.From != c.To || !ok || e.From == e.To || e.To != c.To {
			continue
		}
		out[i].From, out[i].Inherited, out[i].Pinned = e.From, e.Inherited, out[i].Pinned || e.Pinned
		out[i].AnswerLost = !e.written
	}
	return out
}

// setVersion checks the version against the direction and the pins, pins it when asked,
// and writes spec.version, each write conditional on the version of the object read.
// Nothing is written until every check has passed; when a write fails, the changes it was
// making are returned with the error. With plan, nothing is written at all: plan gets the
// preview of the change.
func setVersion(cmd *cobra.Command, lc *kube.Client, up bool, version, pin string, allowTest bool, machines []string, plan *preview.Plan) ([]versionChange, error) {
	ctx := cmd.Context()
	cl, err := lc.Cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the Cluster: %w", err)
	}
	// What changes, and from what: the Cluster, or the named Machines (from the version
	// they run by their own spec.version or the Cluster's).
	changes := []versionChange{{Object: "Cluster", From: string(cl.Spec.Version), To: version}}
	var ms []*v1alpha1.Machine
	if len(machines) > 0 {
		changes = nil
		for _, name := range machines {
			m, err := lc.Machine(ctx, name)
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("no Machine %q", name)
			}
			if err != nil {
				return nil, fmt.Errorf("reading Machine %s: %w", name, err)
			}
			c := versionChange{Object: "Machine " + name, From: string(m.Spec.Version), To: version}
			if c.From == "" {
				c.From, c.Inherited = string(cl.Spec.Version), true
			}
			changes = append(changes, c)
			ms = append(ms, m)
		}
	}
	for _, c := range changes {
		switch {
		case c.From == "" || c.From == version:
		case up && version < c.From:
			return nil, fmt.Errorf("%s runs %s, newer than %s: going back is a rollback (liken rollback %s)", c.Object, c.From, version, version)
		case !up && version > c.From:
			return nil, fmt.Errorf("%s runs %s, older than %s: going forward is an upgrade (liken upgrade %s)", c.Object, c.From, version, version)
		}
	}
	pinned := false
	if have, ok := cl.Spec.Releases[version]; ok {
		if pin != "" && string(have) != pin {
			return nil, fmt.Errorf("%s is pinned to %s already, not %s: a pin never changes here (edit spec.releases yourself if the release was rebuilt)", version, have, pin)
		}
	} else if pin == "" {
		var list []string
		for v := range cl.Spec.Releases {
			list = append(list, v)
		}
		slices.Sort(list)
		hint := "pin it with --pin DIGEST ('liken release pin --channel " + cl.Spec.Channel + " --version " + version + "' prints the channel's digest; check it with whoever built the release)"
		if !up {
			hint = "a rollback goes back to a release pinned before"
		}
		return nil, fmt.Errorf("%s is not pinned in the Cluster's spec.releases (pinned: %s): %s", version, strings.Join(list, ", "), hint)
	} else {
		digest, doc, err := release.Pin(ctx, fetcher(cmd.ErrOrStderr()), cl.Spec.Channel, version)
		if err != nil {
			return nil, fmt.Errorf("reading release %s from the Cluster's channel %s: %w", version, cl.Spec.Channel, err)
		}
		if digest != pin {
			return nil, fmt.Errorf("release %s in channel %s has digest %s, not the %s given: not pinned", version, cl.Spec.Channel, digest, pin)
		}
		if root := string(cl.Spec.ChannelRoot); root != "" {
			// The machines would refuse a pin the channel's keys did not sign: refuse it here.
			if err := verifyPin(ctx, fetcher(cmd.ErrOrStderr()), cl.Spec.Channel, version, pin, root); err != nil {
				return nil, fmt.Errorf("release %s: not pinned: %w", version, err)
			}
		} else if cl.Spec.InsecureUnsignedChannel {
			fmt.Fprintf(cmd.ErrOrStderr(), "WARNING: the Cluster takes its channel unsigned (spec.insecureUnsignedChannel): release %s is pinned unverified; nothing proves who published it\n", version)
		} else {
			return nil, fmt.Errorf("release %s: not pinned: the Cluster names no channel root (spec.channelRoot, the digest liken release keys init printed), and its machines would write no release; set it, or spec.insecureUnsignedChannel: true for a channel that is not signed", version)
		}
		if err := checkTestRelease(cmd.ErrOrStderr(), doc, allowTest); err != nil {
			return nil, err
		}
		pinned = true
	}
	if plan != nil {
		return changes, previewVersion(ctx, lc, cl, ms, version, pin, pinned, plan)
	}
	conflict := func(what string, err error) error {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("the %s changed while it was being written; look at it again and run the command again: %w", what, err)
		}
		return fmt.Errorf("writing the %s: %w", what, err)
	}
	if pinned || (len(ms) == 0 && changes[0].From != version) {
		if pinned {
			cl.Spec.Releases[version] = v1alpha1.Digest(pin)
			changes[0].Pinned = true
		}
		if len(ms) == 0 {
			cl.Spec.Version = v1alpha1.ReleaseVersion(version)
		}
		if _, err := lc.UpdateCluster(ctx, cl); err != nil {
			changes[0].unanswered = true
			return changes, conflict("Cluster", err)
		}
	}
	for i, m := range ms {
		if changes[i].From == version {
			continue
		}
		m.Spec.Version = v1alpha1.ReleaseVersion(version)
		if _, err := lc.UpdateMachine(ctx, m); err != nil {
			for j := range i {
				changes[j].written = changes[j].From != version
			}
			changes[i].unanswered = true
			return changes, fmt.Errorf("%w (%d of %d Machines were changed before it)", conflict("Machine "+m.Name, err), i, len(ms))
		}
	}
	return changes, nil
}

// previewVersion is the plan of setting version (pinned to pin when pinned) in cl, or in ms
// when named, as liken diff shows a change.
func previewVersion(ctx context.Context, lc *kube.Client, cl *v1alpha1.Cluster, ms []*v1alpha1.Machine, version, pin string, pinned bool, plan *preview.Plan) error {
	all, err := lc.Machines(ctx)
	if err != nil {
		return fmt.Errorf("reading the Machines: %w", err)
	}
	wc := cl.DeepCopy()
	if pinned {
		if wc.Spec.Releases == nil {
			wc.Spec.Releases = map[string]v1alpha1.Digest{}
		}
		wc.Spec.Releases[version] = v1alpha1.Digest(pin)
	}
	named := map[string]bool{}
	for _, m := range ms {
		named[m.Name] = true
	}
	if len(ms) == 0 {
		wc.Spec.Version = v1alpha1.ReleaseVersion(version)
	}
	var wanted []v1alpha1.Machine
	for _, m := range all {
		w := *m.DeepCopy()
		if named[m.Name] {
			w.Spec.Version = v1alpha1.ReleaseVersion(version)
		}
		wanted = append(wanted, w)
	}
	*plan, err = preview.Compute(preview.Objects{Cluster: cl, Machines: all}, preview.Objects{Cluster: wc, Machines: wanted}, false, time.Now())
	return err
}
