package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/logfile"
)

func newSupport() *cobra.Command {
	var (
		k   kubeFlags
		out string
	)
	cmd := &cobra.Command{
		Use:   "support [MACHINE...] [-o FILE]",
		Short: "write one archive with what a diagnosis needs: the Cluster, Machines, Nodes, liken's Events and each machine's logs",
		Long: `Writes a gzipped tar archive for a bug report or a colleague: the Cluster (its turns,
rollout and failures in its status), the Machines and their Nodes, liken's Events, and for
each machine (all by default) this boot's logs (init's, the kernel's, the agent's, k3s's)
and init's log of the boot before, read as liken logs reads them. A machine whose logs
cannot be read is named in the archive's errors.txt, and the rest is written.

No Secret is read into it but to take its values out: the registry credentials and TLS
keys the Cluster names are replaced wherever they appear, as are k3s join tokens, bearer
tokens, JSON web tokens and the values of token=, password= and secret= pairs. Fields
managed by the API server (managedFields) and kubectl's last-applied annotation are left
out. Read README.txt in the archive for what it holds.`,
		Example: `  liken support
  liken support worker-7 server-1 -o worker-7.tar.gz`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				out = "liken-support-" + time.Now().UTC().Format("20060102-150405") + ".tar.gz"
			}
			cc, _ := k.client()
			cfg, err := cc.ClientConfig()
			if err != nil {
				return fmt.Errorf("reading the kubeconfig: %w", err)
			}
			b, err := collectSupport(cmd.Context(), cfg, args, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			data, err := b.archive()
			if err != nil {
				return err
			}
			if err := atomicfile.Write(out, data, 0o600); err != nil {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s: %d files, %d bytes (gzipped):\n", out, len(b.files), len(data))
			for _, f := range b.names() {
				fmt.Fprintf(w, "  %-48s %8d\n", f, len(b.files[f]))
			}
			if len(b.errs) > 0 {
				fmt.Fprintf(w, "not collected (errors.txt): %d\n", len(b.errs))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "the archive to write (default liken-support-TIME.tar.gz)")
	k.add(cmd)
	return cmd
}

// bundle is a support archive being collected: file name to content.
type bundle struct {
	files map[string][]byte
	errs  []string
	// secrets are values to take out wherever they appear, with what replaces each.
	secrets map[string]string
}

func (b *bundle) fail(format string, args ...any) {
	b.errs = append(b.errs, fmt.Sprintf(format, args...))
}

// put adds an object as YAML, without what the API server manages for itself.
func (b *bundle) put(name string, obj metav1.Object, v any) {
	obj.SetManagedFields(nil)
	if a := obj.GetAnnotations(); a != nil {
		delete(a, "kubectl.kubernetes.io/last-applied-configuration")
	}
	y, err := yaml.Marshal(v)
	if err != nil {
		b.fail("%s: %v", name, err)
		return
	}
	b.files[name] = y
}

func (b *bundle) names() []string { return slices.Sorted(maps.Keys(b.files)) }

// collectSupport reads what the archive holds; machines empty means every Machine.
func collectSupport(ctx context.Context, cfg *rest.Config, machines []string, warn io.Writer) (*bundle, error) {
	b := &bundle{files: map[string][]byte{}, secrets: map[string]string{}}
	lc, err := kube.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	cl, err := lc.Cluster(ctx)
	switch {
	case err == nil:
		b.secretValues(ctx, kc, cl)
		b.put("cluster.yaml", cl, cl)
	case apierrors.IsNotFound(err):
		b.fail("the Cluster: %v", err)
	default:
		return nil, fmt.Errorf("reading the Cluster: %w", err)
	}
	all, err := lc.Machines(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the Machines: %w", err)
	}
	names := machines
	if len(names) == 0 {
		for _, m := range all {
			names = append(names, m.Name)
		}
	}
	for _, name := range names {
		i := slices.IndexFunc(all, func(m v1alpha1.Machine) bool { return m.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("no Machine %s in this cluster", name)
		}
		m := &all[i]
		b.put("machines/"+name+".yaml", m, m)
		if n, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			b.fail("the Node %s: %v", name, err)
		} else {
			b.put("nodes/"+name+".yaml", n, n)
		}
		b.machineLogs(ctx, cfg, name, warn)
	}
	evs, err := kc.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.apiVersion=" + v1alpha1.GroupVersion.String()})
	if err != nil {
		b.fail("liken's Events: %v", err)
	} else {
		sort.SliceStable(evs.Items, func(i, j int) bool { return evs.Items[i].LastTimestamp.Before(&evs.Items[j].LastTimestamp) })
		var sb strings.Builder
		for _, e := range evs.Items {
			fmt.Fprintf(&sb, "%s\t%s\t%s/%s\t%s\tx%d\t%s\n", e.LastTimestamp.UTC().Format(time.RFC3339), e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, max(e.Count, 1), e.Message)
		}
		b.files["events.txt"] = []byte(sb.String())
	}
	if len(b.errs) > 0 {
		b.files["errors.txt"] = []byte(strings.Join(b.errs, "\n") + "\n")
	}
	for name, data := range b.files {
		b.files[name] = b.redact(data)
	}
	// Written after the redaction, which would take its own words for a secret's.
	b.files["README.txt"] = []byte(fmt.Sprintf(`liken support archive, written %s by liken support.

cluster.yaml            the Cluster: spec, and status (turns, rollout, failures)
machines/NAME.yaml      each Machine: spec and status (conditions, pending, upgrade, reboot)
nodes/NAME.yaml         each machine's Node
events.txt              liken's Events (time, type, object, reason, count, message), oldest first
logs/NAME/*.log         this boot's logs: liken-init (init, as on the console), kernel
                        (dmesg), liken-agent, k3s; before/liken-init.log is the boot before's
errors.txt              what could not be collected, and why

Left out: every Secret (the values of those the Cluster names are replaced by
[redacted ...] wherever they appear), k3s join tokens, bearer tokens, JSON web tokens and
the values of token=, password= and secret= pairs; the fields the API server manages
for itself and kubectl's last-applied-configuration annotation.
`, time.Now().UTC().Format(time.RFC3339)))
	return b, nil
}

// machineLogs adds a machine's logs of this boot and init's of the boot before.
func (b *bundle) machineLogs(ctx context.Context, cfg *rest.Config, name string, warn io.Writer) {
	nl, err := newNodeLogs(cfg, name)
	if err != nil {
		b.fail("%s's logs: %v", name, err)
		return
	}
	for _, c := range logfile.Components {
		text, _, err := nl.read(ctx, "", c)
		if err != nil {
			b.fail("%s's %s log: %v", name, c, err)
			fmt.Fprintf(warn, "liken support: %v\n", err)
			if apierrors.IsForbidden(err) {
				return
			}
			continue
		}
		b.files["logs/"+name+"/"+c+".log"] = text
	}
	dir, err := nl.bootDir(ctx, 1)
	if err == nil {
		var text []byte
		if text, _, err = nl.read(ctx, dir, logfile.Init); err == nil {
			b.files["logs/"+name+"/before/"+logfile.Init+".log"] = text
		}
	}
	if err != nil {
		b.fail("%s's log of the boot before: %v", name, err)
	}
}

// secretValues notes the values of the Secrets the Cluster names, to take them out.
func (b *bundle) secretValues(ctx context.Context, kc kubernetes.Interface, cl *v1alpha1.Cluster) {
	var refs []string
	if r := cl.Spec.Registries; r != nil {
		for _, c := range r.Configs {
			if c.AuthSecret != nil {
				refs = append(refs, c.AuthSecret.Name)
			}
			if c.TLS != nil && c.TLS.Secret != nil {
				refs = append(refs, c.TLS.Secret.Name)
			}
		}
	}
	for _, name := range refs {
		s, err := kc.CoreV1().Secrets(v1alpha1.SecretNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			// Unread, it is not in the archive either; the patterns still apply.
			b.fail("Secret %s/%s, read only to take its values out: %v", v1alpha1.SecretNamespace, name, err)
			continue
		}
		for k, v := range s.Data {
			if len(v) >= 4 {
				b.secrets[string(v)] = fmt.Sprintf("[redacted: Secret %s/%s %s]", v1alpha1.SecretNamespace, name, k)
			}
		}
	}
}

var secretPatterns = []struct {
	re   *regexp.Regexp
	with string
}{
	// k3s's secure join token: K10<CA hash>::<user>:<password>.
	{regexp.MustCompile(`K10[0-9a-f]{16,}::[^\s"',]+`), "[redacted: k3s token]"},
	{regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+`), "[redacted: JSON web token]"},
	{regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}`), "${1}[redacted]"},
	{regexp.MustCompile(`(?i)((?:token|password|passwd|secret)["']?\s*[:=]\s*["']?)[^\s"',}&]{4,}`), "${1}[redacted]"},
}

// redact replaces the Secrets' values, longest first, then the patterns.
func (b *bundle) redact(data []byte) []byte {
	vals := make([]string, 0, len(b.secrets))
	for v := range b.secrets {
		vals = append(vals, v)
	}
	sort.Slice(vals, func(i, j int) bool { return len(vals[i]) > len(vals[j]) })
	for _, v := range vals {
		data = bytes.ReplaceAll(data, []byte(v), []byte(b.secrets[v]))
	}
	for _, p := range secretPatterns {
		data = p.re.ReplaceAll(data, []byte(p.with))
	}
	return data
}

// archive is the bundle as a gzipped tar under liken-support/.
func (b *bundle) archive() ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	now := time.Now()
	for _, name := range b.names() {
		data := b.files[name]
		if err := tw.WriteHeader(&tar.Header{Name: filepath.Join("liken-support", name), Mode: 0o600, Size: int64(len(data)), ModTime: now}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
