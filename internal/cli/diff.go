package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/preview"
)

// exitDiffFailed is diff's exit code when it could not say (as kubectl diff, above 1).
const exitDiffFailed = 4

// errDiffers is diff's "something would change": exit 1, nothing more to say.
var errDiffers = errors.New("differences found")

// errDiffFailed marks diff's failures, exit 4.
var errDiffFailed = errors.New("diff failed")

func newDiff() *cobra.Command {
	var (
		o     output
		k     kubeFlags
		files []string
		prune bool
	)
	cmd := &cobra.Command{
		Use:   "diff -f FILE...",
		Short: "preview what applying Cluster and Machine manifests would do to each machine",
		Long: `Compares the Cluster and Machines in the files with the live ones and says, before
anything moves, what each machine would do: every changed field with its change class
(Live, RestartK3s, NextBoot, Reboot, or Immutable, which the API server refuses), each
machine's most disruptive class and what follows from it, and for the reboots the
disruption-budget turns they take, the approvals (rebootPolicy Manual) and maintenance
windows (Auto) they wait for, and a paused or halted rollout. The files are checked with
the API's own rules and defaults first, as the API server would on kubectl apply. Writes
nothing. A Machine in the cluster but not in the files is left as it is, as kubectl apply
leaves it; with --prune it is reported as deleted.

Exit codes, as kubectl diff: 0 nothing would change, 1 something would, 4 the preview
failed (unreadable or invalid files, a change the API server refuses, no API server).`,
		Example: `  liken diff -f cluster.yaml
  liken diff -f docs/examples -o json
  kubectl get machine worker-7 -o yaml | sed 's/Manual/Auto/' | liken diff -f -`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if len(files) == 0 {
				return usageErr("give the manifests with -f FILE (a file, a directory, or - for standard input)")
			}
			p, invalid, err := diffPlan(cmd, &k, files, prune)
			if err != nil {
				return fmt.Errorf("%w: %w", errDiffFailed, err)
			}
			if err := o.print(cmd.OutOrStdout(), p, func(w io.Writer) { printPlan(w, p) }); err != nil {
				return fmt.Errorf("%w: %w", errDiffFailed, err)
			}
			switch {
			case len(invalid) > 0:
				return fmt.Errorf("%w: the API server would refuse it:\n%s", errDiffFailed, strings.Join(invalid, "\n"))
			case p.Summary.Changed:
				return errDiffers
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVarP(&files, "filename", "f", nil, "the manifests: files, directories (their *.yaml, *.yml and *.json) or - for standard input (repeatable)")
	cmd.Flags().BoolVar(&prune, "prune", false, "report the Machines in the cluster but not in the files as deleted")
	o.add(cmd)
	k.add(cmd)
	return cmd
}

// diffPlan reads the files and the live objects and previews the change; invalid are the
// API's refusals of the files' objects, as kubectl would show them.
func diffPlan(cmd *cobra.Command, k *kubeFlags, files []string, prune bool) (preview.Plan, []string, error) {
	ctx := cmd.Context()
	read, err := readManifests(cmd.InOrStdin(), files...)
	if err != nil {
		return preview.Plan{}, nil, err
	}
	if len(read.failed) > 0 {
		return preview.Plan{}, nil, fmt.Errorf("reading the manifests: %s", strings.Join(read.failed, "; "))
	}
	v, err := manifest.NewValidator()
	if err != nil {
		return preview.Plan{}, nil, err
	}
	lc, _, err := k.liken("")
	if err != nil {
		return preview.Plan{}, nil, err
	}
	var live, wanted preview.Objects
	if live.Cluster, err = lc.Cluster(ctx); apierrors.IsNotFound(err) {
		live.Cluster = nil
	} else if err != nil {
		return preview.Plan{}, nil, fmt.Errorf("reading the Cluster: %w", err)
	}
	if live.Machines, err = lc.Machines(ctx); err != nil {
		return preview.Plan{}, nil, fmt.Errorf("reading the Machines: %w", err)
	}
	liveMachines := map[string]*v1alpha1.Machine{}
	for i := range live.Machines {
		liveMachines[live.Machines[i].Name] = &live.Machines[i]
	}
	var invalid []string
	for _, d := range read.docs {
		var old runtime.Object
		switch d.Object.GetKind() {
		case "Cluster":
			if live.Cluster != nil && live.Cluster.Name == d.Object.GetName() {
				old = live.Cluster
			} else if live.Cluster != nil {
				invalid = append(invalid, fmt.Sprintf("%s: Cluster %q: the cluster has one Cluster, %q", d.Source, d.Object.GetName(), live.Cluster.Name))
				continue
			}
		case "Machine":
			if m := liveMachines[d.Object.GetName()]; m != nil {
				old = m
			}
		}
		var errs []string
		if old != nil {
			u, err := toUnstructured(old, d.Object.GetKind())
			if err != nil {
				return preview.Plan{}, nil, err
			}
			// What kubectl apply would store: the live object with the file's spec,
			// labels and annotations (a manifest carries no uid, creation time or
			// generation, which an update must keep).
			d.Object = appliedOver(u, d.Object)
			if fe := v.Update(d.Object, u); len(fe) > 0 {
				errs = append(errs, manifest.Describe(d.Object, fe))
			}
		} else if fe := v.Create(d.Object); len(fe) > 0 {
			errs = append(errs, manifest.Describe(d.Object, fe))
		}
		for _, e := range errs {
			invalid = append(invalid, d.Source+": "+e)
		}
		switch d.Object.GetKind() {
		case "Cluster":
			c := &v1alpha1.Cluster{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object.Object, c); err != nil {
				return preview.Plan{}, nil, fmt.Errorf("%s: %w", d.Source, err)
			}
			if wanted.Cluster != nil {
				invalid = append(invalid, d.Source+": a second Cluster in the files")
				continue
			}
			wanted.Cluster = c
		case "Machine":
			m := &v1alpha1.Machine{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object.Object, m); err != nil {
				return preview.Plan{}, nil, fmt.Errorf("%s: %w", d.Source, err)
			}
			wanted.Machines = append(wanted.Machines, *m)
		}
	}
	if live.Cluster == nil && wanted.Cluster == nil {
		return preview.Plan{}, nil, fmt.Errorf("the cluster has no Cluster yet and the files hold none: nothing to compare the Machines with")
	}
	p, err := preview.Compute(live, wanted, prune, time.Now())
	return p, invalid, err
}

// appliedOver is file applied over live: live's metadata with file's labels and annotations
// added, and file's spec.
func appliedOver(live, file *unstructured.Unstructured) *unstructured.Unstructured {
	out := live.DeepCopy()
	if spec, ok := file.Object["spec"]; ok {
		out.Object["spec"] = runtime.DeepCopyJSONValue(spec)
	} else {
		delete(out.Object, "spec")
	}
	for _, kv := range []struct {
		get func() map[string]string
		set func(map[string]string)
		add map[string]string
	}{{out.GetLabels, out.SetLabels, file.GetLabels()}, {out.GetAnnotations, out.SetAnnotations, file.GetAnnotations()}} {
		if len(kv.add) == 0 {
			continue
		}
		m := kv.get()
		if m == nil {
			m = map[string]string{}
		}
		for k, v := range kv.add {
			m[k] = v
		}
		kv.set(m)
	}
	return out
}

// toUnstructured is a live object as the validator takes it, with its kind set.
func toUnstructured(obj runtime.Object, kind string) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("converting the live %s: %w", kind, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	delete(u.Object, "status")
	return u, nil
}

// printPlan writes the preview for a person: the changed objects, field by field, then the
// summary.
func printPlan(w io.Writer, p preview.Plan) {
	if len(p.Cluster) > 0 {
		fmt.Fprintln(w, "Cluster:")
		printFields(w, p.Cluster)
	}
	unchanged := 0
	for _, m := range p.Machines {
		if m.Change == "unchanged" {
			unchanged++
			continue
		}
		class := ""
		if m.Class != "" {
			class = " " + string(m.Class) + ":"
		}
		fmt.Fprintf(w, "Machine %s (%s):%s %s\n", m.Name, m.Role, class, m.Follows)
		printFields(w, m.Fields)
	}
	s := p.Summary
	if !s.Changed {
		fmt.Fprintf(w, "no change: %d Machines as they are\n", unchanged)
		return
	}
	var parts []string
	for _, c := range []struct {
		what  string
		names []string
	}{{"live", s.Live}, {"restart k3s in place", s.RestartK3s}, {"at their next boot", s.NextBoot}, {"reboot", s.Reboot}, {"new", s.New}, {"deleted", s.Deleted}} {
		if len(c.names) > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", len(c.names), c.what))
		}
	}
	if unchanged > 0 {
		parts = append(parts, fmt.Sprintf("%d unchanged", unchanged))
	}
	fmt.Fprintf(w, "summary: %s\n", strings.Join(parts, ", "))
	if len(s.Reboot) > 0 {
		fmt.Fprintf(w, "reboots: %d, at most %d at a time (spec.disruptionBudget), servers one at a time: at least %d turns one after another\n", len(s.Reboot), s.AtOnce, s.Turns)
		if len(s.Approval) > 0 {
			fmt.Fprintf(w, "waiting for liken approve-reboot (rebootPolicy Manual): %s\n", strings.Join(s.Approval, ", "))
		}
		if len(s.Auto) > 0 {
			fmt.Fprintf(w, "rebooting on their own (rebootPolicy Auto): %s\n", strings.Join(s.Auto, ", "))
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintln(w, n)
	}
	if len(s.Refused) > 0 {
		fmt.Fprintf(w, "refused by the API server: %s\n", strings.Join(s.Refused, "; "))
	}
}

func printFields(w io.Writer, fs []preview.Field) {
	for _, f := range fs {
		fmt.Fprintf(w, "  %-36s %-10s %s -> %s", f.Field, f.Class, short(preview.JSON(f.From)), short(preview.JSON(f.To)))
		if f.Note != "" {
			fmt.Fprintf(w, " (%s)", f.Note)
		}
		fmt.Fprintln(w)
	}
}

// short keeps a value to one readable line: -o json has it whole.
func short(v string) string {
	if v == "" {
		return "(none)"
	}
	if r := []rune(v); len(r) > 60 {
		return string(r[:57]) + "..."
	}
	return v
}
