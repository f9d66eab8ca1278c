package bootstrap

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) { os.Exit(apiserver.Main(m, "bootstrap", apiserver.Options{}, &env)) }

// serverLayer builds the server layer from the example manifests (and extra Machine
// manifests), as liken layer does, and unpacks it as init does.
func serverLayer(t *testing.T, extra map[string]string) string {
	t.Helper()
	src := t.TempDir()
	examples := filepath.Join("..", "..", "docs", "examples")
	entries, err := os.ReadDir(examples)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(examples, e.Name()))
		os.WriteFile(filepath.Join(src, e.Name()), b, 0o644)
	}
	for name, y := range extra {
		os.WriteFile(filepath.Join(src, name), []byte(y), 0o644)
	}
	docs, err := manifest.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(out, "identity"), OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(res.Layers[v1alpha1.RoleServer])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := filepath.Join(t.TempDir(), "layer")
	if _, err := layer.Unpack(f, dir, layer.DefaultLimits); err != nil {
		t.Fatal(err)
	}
	return dir
}

const agent3 = `apiVersion: liken.dev/v1alpha1
kind: Machine
metadata:
  name: agent-3
spec:
  role: agent
  match:
    serial: "CZ2026AB99"
`

// TestBootstrap: a server's bootstrap waits while its credential's RBAC is not there yet
// (k3s applies it from its manifests after it starts), then creates the Cluster and every
// Machine, each with an Event. After operators' edits, a server with a newer layer (one
// more Machine) creates that Machine alone, and every edit stands. The credential can do
// nothing else.
func TestBootstrap(t *testing.T) {
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.UserConfig(authority.BootstrapUser)
	if err != nil {
		t.Fatal(err)
	}
	dir := serverLayer(t, nil)
	_, machines, err := layer.ReadManifests(dir)
	if err != nil {
		t.Fatal(err)
	}

	// The RBAC lands two seconds after the bootstrap starts.
	go func() {
		time.Sleep(2 * time.Second)
		if err := authority.InstallBootstrap(context.Background(), admin); err != nil {
			t.Error(err)
		}
	}()
	start := time.Now()
	res, err := Run(ctx, Config{REST: cfg, LayerDir: dir, Server: "server-1", Retry: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 2*time.Second {
		t.Errorf("the bootstrap finished in %s, before its RBAC existed", time.Since(start))
	}
	want := []string{"Cluster " + v1alpha1.ClusterName}
	for _, m := range machines {
		want = append(want, "Machine "+m.Name)
	}
	if !slices.Equal(res.Created, want) || len(res.Existing) != 0 {
		t.Fatalf("created %v, found %v; want %v created", res.Created, res.Existing, want)
	}
	for _, name := range []string{"server-1", "agent-2"} {
		list, err := admin.CoreV1().Events(authority.EventNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=Bootstrapped"})
		if err != nil || len(list.Items) != 1 || !strings.Contains(list.Items[0].Message, "created by server server-1") {
			t.Errorf("Bootstrapped Event of Machine %s: %v %+v", name, err, list)
		}
	}
	m, err := lc.Machine(ctx, "agent-2")
	if err != nil || m.Spec.Version != "2026.08.03-001" || m.Spec.RebootPolicy == nil || *m.Spec.RebootPolicy != v1alpha1.RebootAuto {
		t.Errorf("agent-2 as created: %+v %v", m, err)
	}

	// Operators edit the Cluster and a Machine.
	c, err := lc.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Spec.KernelArgs = append(c.Spec.KernelArgs, "operator.edit=1")
	if _, err := lc.UpdateCluster(ctx, c); err != nil {
		t.Fatal(err)
	}
	m.Spec.NodeLabels = map[string]v1alpha1.LabelValue{"example.com/edited": "by-an-operator"}
	if _, err := lc.UpdateMachine(ctx, m); err != nil {
		t.Fatal(err)
	}
	// A server boots with a newer layer: one more Machine.
	res, err = Run(ctx, Config{REST: cfg, LayerDir: serverLayer(t, map[string]string{"agent-3.yaml": agent3}), Server: "server-2"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Created, []string{"Machine agent-3"}) || len(res.Existing) != len(want) {
		t.Errorf("the second bootstrap created %v and found %d; want agent-3 alone created", res.Created, len(res.Existing))
	}
	if c, _ := lc.Cluster(ctx); !slices.Contains(c.Spec.KernelArgs, "operator.edit=1") {
		t.Errorf("the operator's edit of the Cluster was undone: %v", c.Spec.KernelArgs)
	}
	if m, _ := lc.Machine(ctx, "agent-2"); m.Spec.NodeLabels["example.com/edited"] != "by-an-operator" {
		t.Errorf("the operator's edit of agent-2 was undone: %v", m.Spec.NodeLabels)
	}

	// An operator deletes a bootstrapped Machine: no later bootstrap makes it again.
	if err := lc.DeleteMachine(ctx, "agent-3"); err != nil {
		t.Fatal(err)
	}
	res, err = Run(ctx, Config{REST: cfg, LayerDir: serverLayer(t, map[string]string{"agent-3.yaml": agent3}), Server: "server-3"})
	if err != nil || len(res.Created) != 0 {
		t.Errorf("a bootstrap after agent-3 was deleted created %v (%v)", res.Created, err)
	}
	if _, err := lc.Machine(ctx, "agent-3"); !apierrors.IsNotFound(err) {
		t.Errorf("the deleted Machine agent-3 was made again: %v", err)
	}

	// Least privilege: no update, no delete, no Secrets, no Nodes.
	blc, err := kube.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bkc := kubernetes.NewForConfigOrDie(cfg)
	c, _ = lc.Cluster(ctx)
	c.Spec.KernelArgs = nil
	for what, err := range map[string]error{
		"update the Cluster": func() error { _, err := blc.UpdateCluster(ctx, c); return err }(),
		"delete a Machine":   blc.DeleteMachine(ctx, "agent-3"),
		"read Secrets": func() error {
			_, err := bkc.CoreV1().Secrets(v1alpha1.SecretNamespace).List(ctx, metav1.ListOptions{})
			return err
		}(),
		"list Machines": func() error { _, err := blc.Machines(ctx); return err }(),
		"create a Node": func() error {
			_, err := bkc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}, metav1.CreateOptions{})
			return err
		}(),
		"write Cluster status": func() error { _, err := blc.UpdateClusterStatus(ctx, c); return err }(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("the bootstrap credential may %s: %v", what, err)
		}
	}
}

const agent5 = `apiVersion: liken.dev/v1alpha1
kind: Machine
metadata:
  name: agent-5
spec:
  role: agent
  match:
    serial: "CZ2026AB55"
`

// recordReads fails every read of a bootstrap record with code while failing is set, as an
// API server that is overloaded (503) or whose authorizer refuses (403) answers.
type recordReads struct {
	code    int
	failing atomic.Bool
	refused atomic.Int32
}

// wrap is for rest.Config.Wrap.
func (r *recordReads) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if !r.failing.Load() || req.Method != http.MethodGet ||
			!strings.Contains(req.URL.Path, "/namespaces/"+v1alpha1.SecretNamespace+"/configmaps/bootstrapped-") {
			return next.RoundTrip(req)
		}
		return r.refuse(req), nil
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func (r *recordReads) refuse(req *http.Request) *http.Response {
	r.refused.Add(1)
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(r.code),
		Reason: metav1.StatusReasonServiceUnavailable, Message: "the test's API server cannot answer"}
	if r.code == http.StatusForbidden {
		st.Reason = metav1.StatusReasonForbidden
	}
	b, _ := json.Marshal(st)
	return &http.Response{StatusCode: r.code, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(b)), Request: req}
}

// TestBootstrapRecordUnreadable: a Machine bootstrapped once and deleted by an operator is
// not made again by a bootstrap that cannot read its record (503, Forbidden): the bootstrap
// waits, and once the records can be read it finds this one and leaves the Machine deleted.
func TestBootstrapRecordUnreadable(t *testing.T) {
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := authority.InstallBootstrap(ctx, admin); err != nil {
		t.Fatal(err)
	}
	dir := serverLayer(t, map[string]string{"agent-5.yaml": agent5})
	cfg, err := env.UserConfig(authority.BootstrapUser)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(ctx, Config{REST: cfg, LayerDir: dir, Server: "server-1", Retry: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := lc.Machine(ctx, "agent-5"); err != nil {
		t.Fatalf("the first bootstrap did not make agent-5: %v", err)
	}
	if err := lc.DeleteMachine(ctx, "agent-5"); err != nil {
		t.Fatal(err)
	}

	for _, code := range []int{http.StatusServiceUnavailable, http.StatusForbidden} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			ctx := t.Context()
			if err := lc.DeleteMachine(ctx, "agent-5"); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err) // left by a subtest before that failed
			}
			reads := &recordReads{code: code}
			reads.failing.Store(true)
			wrapped, err := env.UserConfig(authority.BootstrapUser)
			if err != nil {
				t.Fatal(err)
			}
			wrapped.Wrap(reads.wrap)
			type result struct {
				res Result
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := Run(ctx, Config{REST: wrapped, LayerDir: dir, Server: "server-2", Retry: 100 * time.Millisecond})
				done <- result{res, err}
			}()
			// The reads fail for a while: the bootstrap tries again and makes nothing.
			deadline := time.Now().Add(1500 * time.Millisecond)
			for time.Now().Before(deadline) || reads.refused.Load() < 4 {
				select {
				case r := <-done:
					t.Fatalf("the bootstrap finished while no record could be read (created %v, %v)", r.res.Created, r.err)
				case <-time.After(50 * time.Millisecond):
				}
				if _, err := lc.Machine(ctx, "agent-5"); !apierrors.IsNotFound(err) {
					t.Fatalf("agent-5, deleted by an operator, was made again while its record could not be read (%d reads refused): %v", reads.refused.Load(), err)
				}
			}
			// The API server answers again: the records are found and nothing is made.
			reads.failing.Store(false)
			var r result
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the bootstrap did not finish once the records could be read")
			}
			if r.err != nil || len(r.res.Created) != 0 {
				t.Errorf("the bootstrap created %v (%v); want nothing", r.res.Created, r.err)
			}
			if _, err := lc.Machine(ctx, "agent-5"); !apierrors.IsNotFound(err) {
				t.Errorf("agent-5, deleted by an operator, was made again: %v", err)
			}
		})
	}
}
