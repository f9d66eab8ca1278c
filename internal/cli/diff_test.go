package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/preview"
)

// writeManifest writes an object as kubectl get -o yaml would show its spec: kind, name,
// spec.
func writeManifest(t testing.TB, path, kind, name string, spec any) {
	t.Helper()
	b, err := yaml.Marshal(map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind, "metadata": map[string]any{"name": name}, "spec": spec})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDiff runs liken diff against a real API server: the live objects written back
// unchanged differ in nothing (exit 0); edits of every class show with their class and what
// follows (exit 1, and -o json agrees); a change the API server refuses fails (exit 4)
// naming the field; a new Machine, and with --prune a Machine left out, are reported; and
// nothing is ever written. upgrade --dry-run previews a version change and writes nothing.
func TestDiff(t *testing.T) {
	lc, kc := adminClient(t)
	ensureCluster(t, lc)
	for _, m := range []*v1alpha1.Machine{
		{ObjectMeta: metav1.ObjectMeta{Name: "diff-server"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleServer}},
		{ObjectMeta: metav1.ObjectMeta{Name: "diff-agent"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}},
	} {
		if _, err := lc.CreateMachine(t.Context(), m); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lc.DeleteMachine(context.Background(), m.Name) })
	}
	cl, err := lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	server, err := lc.Machine(t.Context(), "diff-server")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := lc.Machine(t.Context(), "diff-agent")
	if err != nil {
		t.Fatal(err)
	}
	versions := func() string {
		c, _ := lc.Cluster(t.Context())
		ms, _ := lc.Machines(t.Context())
		s := c.ResourceVersion
		for _, m := range ms {
			s += " " + m.Name + "=" + m.ResourceVersion
		}
		return s
	}
	before := versions()
	dir := t.TempDir()
	clusterFile, serverFile, agentFile := filepath.Join(dir, "cluster.yaml"), filepath.Join(dir, "server.yaml"), filepath.Join(dir, "agent.yaml")
	writeManifest(t, clusterFile, "Cluster", cl.Name, cl.Spec)
	writeManifest(t, serverFile, "Machine", server.Name, server.Spec)
	writeManifest(t, agentFile, "Machine", agent.Name, agent.Spec)
	k := []string{"--kubeconfig", kc}

	code, out, errOut := run(t, append([]string{"diff", "-f", dir}, k...)...)
	if code != exitOK || !strings.Contains(out, "no change") {
		t.Errorf("diff of the live objects as they are: exit %d, want 0\n%s%s", code, out, errOut)
	}

	// One edit of each class.
	c := cl.Spec.DeepCopy()
	c.Sysctls = v1alpha1.Sysctls{"vm.swappiness": "10"}
	c.Registries = &v1alpha1.Registries{Mirrors: []v1alpha1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"https://mirror.example"}}}}
	writeManifest(t, clusterFile, "Cluster", cl.Name, c)
	a := agent.Spec.DeepCopy()
	a.KernelArgs = []v1alpha1.KernelArg{"quiet"}
	writeManifest(t, agentFile, "Machine", agent.Name, a)
	s := server.Spec.DeepCopy()
	s.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
	writeManifest(t, serverFile, "Machine", server.Name, s)
	code, out, errOut = run(t, append([]string{"diff", "-f", dir}, k...)...)
	if code != exitFailed {
		t.Errorf("diff of edits: exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"Cluster:", "cluster.spec.sysctls", "cluster.spec.registries",
		"Machine diff-agent (agent): NextBoot: staged: takes effect at its next boot", "machine.spec.kernelArgs",
		"Machine diff-server (server): Reboot: staged: it reboots on a disruption-budget turn", "after liken approve-reboot", "machine.spec.network",
		"1 at their next boot", "1 reboot", "waiting for liken approve-reboot (rebootPolicy Manual): diff-server",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("diff of edits does not say %q:\n%s", want, out)
		}
	}
	code, out, _ = run(t, append([]string{"diff", "-f", dir, "-o", "json"}, k...)...)
	var p preview.Plan
	if code != exitFailed || json.Unmarshal([]byte(out), &p) != nil {
		t.Fatalf("diff -o json: exit %d\n%s", code, out)
	}
	classes := map[string]v1alpha1.ChangeClass{}
	for _, m := range p.Machines {
		classes[m.Name] = m.Class
	}
	if classes["diff-server"] != v1alpha1.Reboot || classes["diff-agent"] != v1alpha1.NextBoot || !p.Summary.Changed {
		t.Errorf("diff -o json: classes %v, changed %v", classes, p.Summary.Changed)
	}
	// Every other Machine the API server holds gets the Cluster's live and k3s-restart edits.
	for name, class := range classes {
		if name != "diff-server" && name != "diff-agent" && class != v1alpha1.RestartK3s {
			t.Errorf("diff -o json: %s, which the files leave out, has class %q; want RestartK3s (the Cluster's registries)", name, class)
		}
	}

	// A change the API server refuses: exit 4, the field named.
	a.Role = v1alpha1.RoleServer
	writeManifest(t, agentFile, "Machine", agent.Name, a)
	code, out, errOut = run(t, append([]string{"diff", "-f", agentFile}, k...)...)
	if code != exitDiffFailed || !strings.Contains(out, "machine.spec.role") || !strings.Contains(out, "Immutable") || !strings.Contains(errOut, "the API server would refuse it") {
		t.Errorf("diff of a role change: exit %d, want 4 naming machine.spec.role\n%s%s", code, out, errOut)
	}
	// A new Machine, and with --prune the Machines the files leave out.
	newFile := filepath.Join(t.TempDir(), "new.yaml")
	writeManifest(t, newFile, "Machine", "diff-new", v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent})
	code, out, _ = run(t, append([]string{"diff", "-f", newFile}, k...)...)
	if code != exitFailed || !strings.Contains(out, "Machine diff-new (agent): a new Machine") || strings.Contains(out, "deleted") {
		t.Errorf("diff of a new Machine: exit %d\n%s", code, out)
	}
	code, out, _ = run(t, append([]string{"diff", "-f", newFile, "--prune"}, k...)...)
	if code != exitFailed || !strings.Contains(out, "Machine diff-agent (agent): deleted: its machine keeps running as it is") {
		t.Errorf("diff --prune: exit %d\n%s", code, out)
	}
	// Bad input: no files, an unreadable one.
	if code, _, errOut := run(t, append([]string{"diff"}, k...)...); code != exitUsage || !strings.Contains(errOut, "-f FILE") {
		t.Errorf("diff without -f: exit %d %s", code, errOut)
	}
	if code, _, errOut := run(t, append([]string{"diff", "-f", filepath.Join(dir, "nosuch.yaml")}, k...)...); code != exitDiffFailed {
		t.Errorf("diff of a missing file: exit %d %s", code, errOut)
	}

	if after := versions(); after != before {
		t.Errorf("diff wrote: resource versions %s, then %s", before, after)
	}

	// upgrade --dry-run: the plan of a version change, nothing written.
	const next = "2026.12.01-001"
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := lc.Cluster(t.Context())
		if err != nil {
			return err
		}
		c.Spec.Releases[next] = v1alpha1.Digest("sha256:" + strings.Repeat("1", 64))
		_, err = lc.UpdateCluster(t.Context(), c)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c, err := lc.Cluster(context.Background())
			if err != nil {
				return err
			}
			delete(c.Spec.Releases, next)
			_, err = lc.UpdateCluster(context.Background(), c)
			return err
		})
	})
	before = versions()
	code, out, errOut = run(t, append([]string{"upgrade", next, "--dry-run"}, k...)...)
	if code != exitOK {
		t.Errorf("upgrade --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"would set Cluster spec.version: ", " -> " + next, "Machine diff-server (server): Reboot", "cluster.spec.version", "(dry run: nothing was written)"} {
		if !strings.Contains(out, want) {
			t.Errorf("upgrade --dry-run does not say %q:\n%s", want, out)
		}
	}
	if after := versions(); after != before {
		t.Errorf("upgrade --dry-run wrote: resource versions %s, then %s", before, after)
	}
	if cl, _ := lc.Cluster(t.Context()); string(cl.Spec.Version) == next {
		t.Errorf("upgrade --dry-run set the version")
	}
}

// TestWarningPrinter: the API server's change warnings print as kubectl prints warnings,
// without the policy's name; any other warning prints whole.
func TestWarningPrinter(t *testing.T) {
	var b strings.Builder
	p := WarningPrinter(&b)
	p.HandleWarningHeader(299, "", "Validation failed for ValidatingAdmissionPolicy 'liken-change-warnings-machines' with binding 'liken-change-warnings-machines': Machine spec.network: Reboot class; ...")
	p.HandleWarningHeader(299, "", "metadata.finalizers: prefer a domain-qualified finalizer name")
	if want := "Warning: Machine spec.network: Reboot class; ...\nWarning: metadata.finalizers: prefer a domain-qualified finalizer name\n"; b.String() != want {
		t.Errorf("printed %q; want %q", b.String(), want)
	}
}

// BenchmarkDiff1000 times liken diff as an operator runs it against a real API server
// holding 1,000 Machines (3 servers): the Cluster file with a new version, every Machine
// read, classified and planned, each API server dry run included. Its figure is the
// command's wall time (diff-s), printed by make bench.
func BenchmarkDiff1000(b *testing.B) {
	lc, kc := adminClient(b)
	ensureCluster(b, lc)
	const n = 1000
	names := make(chan string)
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				role := v1alpha1.RoleAgent
				if strings.HasSuffix(name, "-0000") || strings.HasSuffix(name, "-0001") || strings.HasSuffix(name, "-0002") {
					role = v1alpha1.RoleServer
				}
				if _, err := lc.CreateMachine(context.Background(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: role}}); err != nil {
					failed.Store(err)
				}
			}
		}()
	}
	for i := range n {
		names <- fmt.Sprintf("bench-%04d", i)
	}
	close(names)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for i := range n {
			_ = lc.DeleteMachine(context.Background(), fmt.Sprintf("bench-%04d", i))
		}
	})
	cl, err := lc.Cluster(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	spec := cl.Spec.DeepCopy()
	const next = "2026.12.01-001"
	spec.Version = next
	spec.Releases = map[string]v1alpha1.Digest{next: v1alpha1.Digest("sha256:" + strings.Repeat("1", 64))}
	for v, d := range cl.Spec.Releases {
		spec.Releases[v] = d
	}
	file := filepath.Join(b.TempDir(), "cluster.yaml")
	b.StopTimer()
	writeManifest(b, file, "Cluster", cl.Name, spec)
	b.StartTimer()
	start := time.Now()
	for b.Loop() {
		code, out, errOut := run(b, "diff", "-f", file, "--kubeconfig", kc, "-o", "json")
		if code != exitFailed {
			b.Fatalf("diff of a version change: exit %d, want %d\n%s", code, exitFailed, errOut)
		}
		var p preview.Plan
		if err := json.Unmarshal([]byte(out), &p); err != nil || len(p.Summary.Reboot) < n {
			b.Fatalf("the plan names %d reboots, want at least %d (%v)", len(p.Summary.Reboot), n, err)
		}
	}
	b.ReportMetric(time.Since(start).Seconds()/float64(b.N), "diff-s")
	b.ReportMetric(n, "machines")
}
