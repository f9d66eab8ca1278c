package install

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/layer"
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

// installedDisk is an image partitioned as install partitions it, its layer partition
// holding data recorded as built with digest.
func installedDisk(t *testing.T, data []byte, digest string) (string, disk.Extent) {
	t.Helper()
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
	if err := writeLayer(img, parts[disk.Layer], data, digest); err != nil {
		t.Fatal(err)
	}
	return img, parts[disk.Layer]
}

// readFile reads a test input or fails.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReplaceLayer: a newer layer of the same cluster and role replaces the one an installed
// disk holds, and the machine would read the new one; a layer of the other role or of
// another cluster is refused and the disk keeps its layer.
func TestReplaceLayer(t *testing.T) {
	idDir := t.TempDir()
	old := layersOf(t, idDir)
	// As install writes it for server-1.
	bound, _, err := layer.Narrow(readFile(t, old.Layers[v1alpha1.RoleServer]), "server-1")
	if err != nil {
		t.Fatal(err)
	}
	img, ext := installedDisk(t, bound, old.Digests[v1alpha1.RoleServer])
	newer := layersOf(t, idDir, agent9)
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
			idx, err := readInstalledLayer(img, ext)
			if err != nil || slices.Contains(idx.Machines, "agent-9") {
				t.Fatalf("after a refusal the disk holds %+v, %v; want the old layer", idx, err)
			}
		})
	}
	got, err := ReplaceLayer(Options{Disk: img, Layer: newer.Layers[v1alpha1.RoleServer], LayerDigest: newer.Digests[v1alpha1.RoleServer]})
	if err != nil {
		t.Fatal(err)
	}
	if got.LayerDigest != newer.Digests[v1alpha1.RoleServer] || got.Machine != "server-1" || got.Role != "server" {
		t.Errorf("ReplaceLayer returned %+v; want the layer's digest %s, for server-1", got, newer.Digests[v1alpha1.RoleServer])
	}
	idx, err := readInstalledLayer(img, ext)
	if err != nil {
		t.Fatal(err)
	}
	if idx.CAHash == "" {
		t.Fatalf("the replaced layer reads back as %+v", idx)
	}
	// agent-9's Machine is in every layer.
	found := false
	for _, f := range idx.Files {
		found = found || strings.HasSuffix(f.Name, "agent-9.yaml")
	}
	if !found {
		t.Errorf("the disk's layer after ReplaceLayer has no agent-9 Machine")
	}
}

// agent9 is one more Machine, for a newer layer.
const agent9 = `apiVersion: liken.dev/v1alpha1
kind: Machine
metadata: {name: agent-9}
spec:
  role: agent
  match: {macs: ["52:54:00:00:00:99"]}
`

// credentialsOn names the machines whose credentials a disk's layer holds, by its files,
// not by what its index claims.
func credentialsOn(t *testing.T, img string, ext disk.Extent) (*layer.Index, []string) {
	t.Helper()
	idx, err := readInstalledLayer(img, ext)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range idx.Files {
		if rest, ok := strings.CutPrefix(f.Name, layer.CredentialsDir+"/"); ok {
			name := strings.SplitN(rest, ".", 2)[0]
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return idx, names
}

// TestReplaceLayerBinds: --layer-only binds the newer layer as install binds a disk, so a
// disk never gets the private keys of machines it is not: it stays the machine it was
// installed for, takes --machine on a disk not bound to one, and is refused a layer of
// several machines otherwise. The credentials are counted in the files the disk holds.
func TestReplaceLayerBinds(t *testing.T) {
	idDir := t.TempDir()
	old := layersOf(t, idDir)
	newer := layersOf(t, idDir, agent9)
	full := readFile(t, old.Layers[v1alpha1.RoleServer])
	bound, _, err := layer.Narrow(full, "server-1")
	if err != nil {
		t.Fatal(err)
	}
	// A layer of one machine's credential, not bound: a disk installed without --machine
	// from a layer that held only that machine.
	idx, files, err := layer.Read(bytes.NewReader(bound), layer.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]layer.Entry{}
	for _, f := range idx.Files {
		entries[f.Name] = layer.Entry{Data: files[f.Name], Mode: f.Mode}
	}
	unbound, err := layer.Pack(layer.Index{Schema: idx.Schema, Role: idx.Role, CAHash: idx.CAHash, Machines: idx.Machines}, entries)
	if err != nil {
		t.Fatal(err)
	}
	// The newer server layer narrowed by hand: one machine's, given without --machine.
	oneFile := filepath.Join(t.TempDir(), "server-2.layer")
	one, _, err := layer.Narrow(readFile(t, newer.Layers[v1alpha1.RoleServer]), "server-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(oneFile, one, 0o644); err != nil {
		t.Fatal(err)
	}
	layerAll := newer.Layers[v1alpha1.RoleServer]
	for _, tc := range []struct {
		name      string
		installed []byte // the disk's layer before
		layer     string
		machine   string
		refusal   string   // empty: replaced
		want      []string // the credentials on the disk after
		bound     string   // the disk's binding after
	}{
		{"a disk installed for a machine stays that machine's", bound, layerAll, "", "", []string{"server-1"}, "server-1"},
		{"the same machine named", bound, layerAll, "server-1", "", []string{"server-1"}, "server-1"},
		{"another machine for a disk installed for one", bound, layerAll, "server-2",
			"was installed for machine server-1 and holds its state: --machine server-2 would give it another machine's credential", []string{"server-1"}, "server-1"},
		{"a layer of several machines onto a disk not bound", unbound, layerAll, "",
			"the server layer holds the credentials of 3 machines (server-1, server-2, server-3): a disk not bound to one of them would carry all their private keys; give --machine server-1", []string{"server-1"}, ""},
		{"a disk not bound, with --machine", unbound, layerAll, "server-1", "", []string{"server-1"}, "server-1"},
		{"one machine's layer needs no --machine", unbound, oneFile, "", "", []string{"server-2"}, "server-2"},
		{"a machine the layer has no credential for", unbound, layerAll, "agent-1", `has no credential for machine "agent-1"`, []string{"server-1"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, ext := installedDisk(t, tc.installed, old.Digests[v1alpha1.RoleServer])
			before := readFile(t, img)
			res, err := ReplaceLayer(Options{Disk: img, Layer: tc.layer, Machine: tc.machine})
			switch {
			case tc.refusal == "" && err != nil:
				t.Fatalf("ReplaceLayer: %v", err)
			case tc.refusal != "" && (err == nil || !strings.Contains(err.Error(), tc.refusal)):
				t.Fatalf("ReplaceLayer = %v; want a refusal saying %q", err, tc.refusal)
			case tc.refusal != "" && !bytes.Equal(before, readFile(t, img)):
				t.Errorf("a refused replacement changed the disk")
			case tc.refusal == "" && res.Machine != tc.bound:
				t.Errorf("ReplaceLayer says the disk is for machine %q; want %q", res.Machine, tc.bound)
			}
			idx, creds := credentialsOn(t, img, ext)
			if !slices.Equal(creds, tc.want) || !slices.Equal(idx.Machines, tc.want) || idx.Machine != tc.bound {
				t.Errorf("the disk holds the credentials of %v (index: %v, bound to %q); want %v, bound to %q", creds, idx.Machines, idx.Machine, tc.want, tc.bound)
			}
			if tc.refusal == "" && !slices.ContainsFunc(idx.Files, func(f layer.File) bool { return strings.HasSuffix(f.Name, "agent-9.yaml") }) {
				t.Errorf("the disk's layer is not the newer one: no agent-9 Machine")
			}
		})
	}
}
