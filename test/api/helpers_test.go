package api

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/manifest"
)

var (
	clustersGVR = v1alpha1.GroupVersion.WithResource("clusters")
	machinesGVR = v1alpha1.GroupVersion.WithResource("machines")
)

func gvrOf(u *unstructured.Unstructured) schema.GroupVersionResource {
	if u.GetKind() == "Cluster" {
		return clustersGVR
	}
	return machinesGVR
}

func dyn(t *testing.T) dynamic.Interface {
	t.Helper()
	c, err := dynamic.NewForConfig(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// examples loads docs/examples by name ("cluster", "server-1", ...).
func examples(t *testing.T) map[string]*unstructured.Unstructured {
	t.Helper()
	docs, err := manifest.Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*unstructured.Unstructured{}
	for _, d := range docs {
		base := strings.TrimSuffix(filepath.Base(d.Source), filepath.Ext(d.Source))
		out[base] = d.Object
	}
	if len(out) < 6 {
		t.Fatalf("expected a Cluster and five Machines in docs/examples, found %d objects", len(out))
	}
	return out
}

func validator(t *testing.T) *manifest.Validator {
	t.Helper()
	v, err := manifest.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func ctx(t *testing.T) context.Context { return t.Context() }

// set sets a field given by a dotted path ("spec.network.interfaces"), creating maps.
func set(t *testing.T, u *unstructured.Unstructured, value any, path string) {
	t.Helper()
	if err := unstructured.SetNestedField(u.Object, deepCopyJSON(value), strings.Split(path, ".")...); err != nil {
		t.Fatalf("setting %s: %v", path, err)
	}
}

func remove(u *unstructured.Unstructured, path string) {
	unstructured.RemoveNestedField(u.Object, strings.Split(path, ".")...)
}

// deepCopyJSON turns Go literals used in the tables into the JSON-compatible values
// unstructured objects hold (int → int64, []string → []any, ...).
func deepCopyJSON(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case []string:
		out := make([]any, len(x))
		for i, s := range x {
			out[i] = s
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopyJSON(e)
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = deepCopyJSON(e)
		}
		return out
	default:
		return v
	}
}
