package install

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/manifest"
)

// layersOf builds the example cluster's layers (with any more Machine manifests given) from
// the identity in idDir.
func layersOf(t *testing.T, idDir string, more ...string) *identity.Result {
	t.Helper()
	src := t.TempDir()
	entries, _ := os.ReadDir(filepath.Join("..", "..", "docs", "examples"))
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join("..", "..", "docs", "examples", e.Name()))
		os.WriteFile(filepath.Join(src, e.Name()), b, 0o644)
	}
	for i, m := range more {
		os.WriteFile(filepath.Join(src, "more-"+string(rune('a'+i))+".yaml"), []byte(m), 0o644)
	}
	docs, err := manifest.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: idDir, OutDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestReplaceLayer: a newer layer of the same cluster and role replaces the one an installed
// disk holds, and the machine would read the new one; a layer of the other role or of
// another cluster is refused and the disk keeps its layer.
func TestReplaceLayer(t *testing.T) {
	idDir := t.TempDir()
	old := layersOf(t, idDir)
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, int64(small.MinSizeMiB())<<20); err != nil {
		t.Fatal(err)
	}
	if err := disk.Partition(img, small); err != nil {
		t.Fatal(err)
	}
	parts, err := disk.Read(img)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(old.Layers[v1alpha1.RoleServer])
	if err := writeLayer(img, parts[disk.Layer], b, old.Digests[v1alpha1.RoleServer]); err != nil {
		t.Fatal(err)
	}
	newer := layersOf(t, idDir, `apiVersion: liken.dev/v1alpha1
kind: Machine
metadata: {name: agent-9}
spec:
  role: agent
  match: {macs: ["52:54:00:00:00:99"]}
`)
	other := layersOf(t, t.TempDir())
	for _, tc := range []struct {
		name, layer, refusal string
	}{
		{"the other role", newer.Layers[v1alpha1.RoleAgent], "holds a server layer"},
		{"another cluster", other.Layers[v1alpha1.RoleServer], "not a newer layer for this machine"},
		{"a digest that is not the layer's", newer.Layers[v1alpha1.RoleServer] + "#digest", "not the layer that was built"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Disk: img, Layer: strings.TrimSuffix(tc.layer, "#digest")}
			if strings.HasSuffix(tc.layer, "#digest") {
				o.LayerDigest = old.Digests[v1alpha1.RoleServer]
			}
			if _, err := ReplaceLayer(o); err == nil || !strings.Contains(err.Error(), tc.refusal) {
				t.Fatalf("ReplaceLayer = %v; want a refusal saying %q", err, tc.refusal)
			}
			idx, err := readInstalledLayer(img, parts[disk.Layer])
			if err != nil || slices.Contains(idx.Machines, "agent-9") {
				t.Fatalf("after a refusal the disk holds %+v, %v; want the old layer", idx, err)
			}
		})
	}
	got, err := ReplaceLayer(Options{Disk: img, Layer: newer.Layers[v1alpha1.RoleServer], LayerDigest: newer.Digests[v1alpha1.RoleServer]})
	if err != nil {
		t.Fatal(err)
	}
	if got != newer.Digests[v1alpha1.RoleServer] {
		t.Errorf("ReplaceLayer returned %s; want the layer's digest %s", got, newer.Digests[v1alpha1.RoleServer])
	}
	idx, err := readInstalledLayer(img, parts[disk.Layer])
	if err != nil {
		t.Fatal(err)
	}
	// The server layer lists the servers' credentials; agent-9's Machine is in every layer.
	b, _ = os.ReadFile(newer.Layers[v1alpha1.RoleServer])
	if idx.CAHash == "" || len(b) == 0 {
		t.Fatalf("the replaced layer reads back as %+v", idx)
	}
	found := false
	for _, f := range idx.Files {
		found = found || strings.HasSuffix(f.Name, "agent-9.yaml")
	}
	if !found {
		t.Errorf("the disk's layer after ReplaceLayer has no agent-9 Machine")
	}
}
