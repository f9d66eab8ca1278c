package standin

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.deploy.liken.test
spec:
  group: deploy.liken.test
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Cluster
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
`

// TestDeployAppliesLikeK3s: the stand-in applies its manifests directory as k3s's deploy
// controller does: the manifest files in name order (a CRD in one file serves objects in a
// later one), not dotfiles, files of other kinds or files beside a .skip; again only when
// a file's content changed (an operator's edit stands until then); every file at a start.
func TestDeployAppliesLikeK3s(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	config := func(data string) string {
		return "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: deploy-test\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: deploy-test\ndata:\n  mode: " + data + "\n"
	}
	write("a-crd.yaml", widgetCRD)
	write("b-objects.yml", config("from-the-manifest")+"---\napiVersion: deploy.liken.test/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n")
	write(".hidden.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: hidden-ns\n")
	write("notes.txt", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: txt-ns\n")
	write("skipped.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: skipped-ns\n")
	write("skipped.yaml.skip", "")
	write("sub/c.json", `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"json-ns"}}`)

	var log strings.Builder
	d, err := newDeployer(env.Admin, dir, &log)
	if err != nil {
		t.Fatal(err)
	}
	// The CRD is established a moment after its creation: the Widget may need a second look.
	for i := 0; i < 50; i++ {
		if err = d.scan(ctx); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the manifests never all applied: %v\n%s", err, log.String())
	}
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	for _, ns := range []string{"deploy-test", "json-ns"} {
		if _, err := kc.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			t.Errorf("namespace %s not applied: %v", ns, err)
		}
	}
	for _, ns := range []string{"hidden-ns", "txt-ns", "skipped-ns"} {
		if _, err := kc.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("namespace %s was applied, from a file k3s does not apply: %v", ns, err)
		}
	}
	widgets := dynamic.NewForConfigOrDie(env.Admin).Resource(schema.GroupVersionResource{Group: "deploy.liken.test", Version: "v1", Resource: "widgets"})
	if w, err := widgets.Get(ctx, "w1", metav1.GetOptions{}); err != nil || w.Object["spec"].(map[string]any)["size"] != int64(3) {
		t.Errorf("the Widget of a CRD applied from another file: %v %v", w, err)
	}

	mode := func() string {
		cm, err := kc.CoreV1().ConfigMaps("deploy-test").Get(ctx, "settings", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data["mode"]
	}
	edit := func(v string) {
		cm, _ := kc.CoreV1().ConfigMaps("deploy-test").Get(ctx, "settings", metav1.GetOptions{})
		cm.Data["mode"] = v
		if _, err := kc.CoreV1().ConfigMaps("deploy-test").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	edit("an-operator's")
	if err := d.scan(ctx); err != nil || mode() != "an-operator's" {
		t.Errorf("an unchanged file was applied again over an edit (mode %q, %v)", mode(), err)
	}
	write("b-objects.yml", config("changed-in-the-file")+"---\napiVersion: deploy.liken.test/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n")
	if err := d.scan(ctx); err != nil || mode() != "changed-in-the-file" {
		t.Errorf("a changed file was not applied again (mode %q, %v)", mode(), err)
	}
	edit("an-operator's")
	crds := dynamic.NewForConfigOrDie(env.Admin).Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	crdVersion := func() string {
		c, err := crds.Get(ctx, "widgets.deploy.liken.test", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c.GetResourceVersion()
	}
	before := crdVersion()
	// The restarted deployer's requests, counted: an apply that changes nothing writes
	// nothing either, so only the requests tell whether it was sent.
	var crdPatches atomic.Int32
	cfg := rest.CopyConfig(env.Admin)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPatch && strings.Contains(r.URL.Path, "/customresourcedefinitions/") {
				crdPatches.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	restarted, err := newDeployer(cfg, dir, &log)
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.scan(ctx); err != nil || mode() != "changed-in-the-file" {
		t.Errorf("a start did not apply every file (mode %q, %v)", mode(), err)
	}
	// But a CRD unchanged since it was applied is not applied again (appliedHash): it is not
	// written, and not even sent.
	if n := crdPatches.Load(); n != 0 {
		t.Errorf("a start applied an unchanged CRD again (%d requests)", n)
	}
	write("a-crd.yaml", strings.Replace(widgetCRD, "singular: widget}", "singular: widget, shortNames: [wg]}", 1))
	if err := restarted.scan(ctx); err != nil || crdVersion() == before || crdPatches.Load() != 1 {
		t.Errorf("a changed CRD was not applied (%v; %d requests)", err, crdPatches.Load())
	}
	if !strings.Contains(log.String(), "k3s-standin: deploy: applied "+filepath.Join(dir, "a-crd.yaml")+" (1 objects)") {
		t.Errorf("the log does not say what was applied:\n%s", log.String())
	}
}
