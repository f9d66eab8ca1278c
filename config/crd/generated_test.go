package crd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"

	"liken.dev/liken/config/crd"
)

// controllerGen is the generator `make generate` runs; keep the two in step.
const controllerGen = "sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0"

func generate(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", controllerGen}, args...)...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("running controller-gen: %v\n%s", err, stderr.String())
	}
	return out
}

// TestCRDsUpToDate regenerates the CRDs from api/ and fails when the committed ones differ.
func TestCRDsUpToDate(t *testing.T) {
	dir := t.TempDir()
	generate(t, "crd", "paths=./api/...", "output:crd:artifacts:config="+dir)
	fresh, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := crd.Files()
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh) != len(committed) {
		t.Errorf("controller-gen makes %d CRDs, config/crd has %d: run make generate", len(fresh), len(committed))
	}
	for _, f := range fresh {
		want, _ := os.ReadFile(f)
		if got := committed[filepath.Base(f)]; !bytes.Equal(got, want) {
			t.Errorf("config/crd/%s is stale: run make generate", filepath.Base(f))
		}
	}
}

// TestDeepCopyUpToDate regenerates the deepcopy functions and compares.
func TestDeepCopyUpToDate(t *testing.T) {
	want := generate(t, "object:headerFile=hack/boilerplate.go.txt", "paths=./api/...", "output:object:stdout")
	got, err := os.ReadFile(filepath.Join("..", "..", "api", "v1alpha1", "zz_generated.deepcopy.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
		t.Errorf("api/v1alpha1/zz_generated.deepcopy.go is stale: run make generate")
	}
}

// TestCRDsValid runs the API server's own CRD validation (structural schema, CEL rule
// compilation and cost limits, defaults against rules) on the committed CRDs, so a bad marker
// fails here with the reason rather than only when a test server installs them.
func TestCRDsValid(t *testing.T) {
	crds, err := crd.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		internal := &apiextensionsinternal.CustomResourceDefinition{}
		if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(c, internal, nil); err != nil {
			t.Fatal(err)
		}
		// As the API server's create strategy does before validating.
		internal.Status.StoredVersions = []string{c.Spec.Versions[0].Name}
		if errs := validation.ValidateCustomResourceDefinition(t.Context(), internal); len(errs) > 0 {
			t.Errorf("%s is not a valid CRD: %v", c.Name, errs.ToAggregate())
		}
	}
}
