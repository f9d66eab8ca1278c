package layer

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"liken.dev/liken/api/v1alpha1"
)

// sample packs a small valid layer.
func sample(t *testing.T) []byte {
	t.Helper()
	b, err := Pack(Index{Schema: Schema, Role: v1alpha1.RoleAgent}, map[string]Entry{
		ClusterManifest:     {Data: bytes.Repeat([]byte("apiVersion: liken.dev/v1alpha1\n"), 200), Mode: 0o644},
		TokenFile:           {Data: []byte("K10abc::node:secret\n"), Mode: 0o600},
		"tls/server-ca.crt": {Data: bytes.Repeat([]byte("CERT"), 300), Mode: 0o644},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPackedLayerUnpacks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "layer")
	idx, err := Unpack(bytes.NewReader(sample(t)), dir, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.Files) != 3 {
		t.Errorf("index lists %d files", len(idx.Files))
	}
	st, err := os.Stat(filepath.Join(dir, TokenFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("token: %v %v", st, err)
	}
	again, _ := os.ReadFile(filepath.Join(dir, IndexName))
	if !bytes.Contains(again, []byte(Schema)) {
		t.Errorf("index not written")
	}
	if a, b := sample(t), sample(t); !bytes.Equal(a, b) {
		t.Errorf("packing is not deterministic")
	}
}

func TestUnpackReplacesWhole(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "layer")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "stale"), []byte("old"), 0o644)
	if _, err := Unpack(bytes.NewReader(sample(t)), dir, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "stale")); err == nil {
		t.Errorf("a file of the previous layer survived")
	}
	if entries, _ := os.ReadDir(filepath.Dir(dir)); len(entries) != 1 {
		t.Errorf("unpacking left %d entries beside the layer", len(entries))
	}
}
