package layer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
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

// craft writes a tar.gz with arbitrary headers, and an index listing the given files.
type craftEntry struct {
	hdr  tar.Header
	data []byte
}

func craft(t *testing.T, index *Index, entries []craftEntry) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if index != nil {
		b, _ := json.Marshal(index)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: IndexName, Size: int64(len(b)), Mode: 0o644})
		tw.Write(b)
	}
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.data)
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// padded is layer's archive followed, inside the same gzip stream, by n zero bytes.
func padded(t *testing.T, layer []byte, n int) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		t.Fatal(err)
	}
	archive, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	gz.Write(archive)
	gz.Write(make([]byte, n))
	gz.Close()
	return buf.Bytes()
}

func fileOf(name string, data []byte) File {
	sum := sha256.Sum256(data)
	return File{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Mode: 0o644}
}

func reg(name string, data []byte) craftEntry {
	return craftEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644}, data: data}
}

func TestUnpackRefuses(t *testing.T) {
	good := []byte("cluster: yes\n")
	idx := func(files ...File) *Index { return &Index{Schema: Schema, Role: v1alpha1.RoleAgent, Files: files} }
	realBytes := sample(t)
	tests := []struct {
		name string
		data []byte
		lim  Limits
		want string
	}{
		{"tampered entry", craft(t, idx(fileOf("a", good)), []craftEntry{reg("a", []byte("cluster: no!\n"))}), DefaultLimits, `layer entry "a" does not match its index`},
		{"tampered compressed bytes", func() []byte { b := append([]byte(nil), realBytes...); b[len(b)/2] ^= 0xff; return b }(), DefaultLimits, "corrupt"},
		{"truncated", realBytes[:len(realBytes)/2], DefaultLimits, "truncated"},
		{"not gzip", []byte("hello"), DefaultLimits, "not a gzip stream"},
		{"path traversal", craft(t, idx(fileOf("../evil", good)), []craftEntry{reg("../evil", good)}), DefaultLimits, "must not climb out of the layer"},
		{"nested traversal", craft(t, idx(), []craftEntry{reg("a/../../evil", good)}), DefaultLimits, "must be clean paths"},
		{"absolute path", craft(t, idx(fileOf("/etc/passwd", good)), []craftEntry{reg("/etc/passwd", good)}), DefaultLimits, "must be relative paths"},
		{"symlink", craft(t, idx(), []craftEntry{{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "link", Linkname: "/etc/shadow"}}}), DefaultLimits, "is a symbolic link"},
		{"hardlink", craft(t, idx(), []craftEntry{{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "link", Linkname: "layer.json"}}}), DefaultLimits, "is a hard link"},
		{"device node", craft(t, idx(), []craftEntry{{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}}}), DefaultLimits, "is a device or pipe"},
		{"directory entry", craft(t, idx(), []craftEntry{{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755}}}), DefaultLimits, "only regular files"},
		{"oversized entry", craft(t, idx(fileOf("big", make([]byte, 2000))), []craftEntry{reg("big", make([]byte, 2000))}), Limits{MaxFileSize: 1000, MaxTotal: 1 << 20, MaxFiles: 10}, "more than the 1000 allowed"},
		{"oversized total", craft(t, idx(fileOf("a", make([]byte, 900)), fileOf("b", make([]byte, 900))), []craftEntry{reg("a", make([]byte, 900)), reg("b", make([]byte, 900))}), Limits{MaxFileSize: 1000, MaxTotal: 1500, MaxFiles: 10}, "larger than 1500 bytes"},
		{"duplicate entry", craft(t, idx(fileOf("a", good)), []craftEntry{reg("a", good), reg("a", good)}), DefaultLimits, `"a" appears twice`},
		{"entry not indexed", craft(t, idx(), []craftEntry{reg("extra", good)}), DefaultLimits, `"extra" is not in its index`},
		{"indexed entry missing", craft(t, idx(fileOf("gone", good)), nil), DefaultLimits, `lists "gone", which the layer does not hold`},
		{"index not first", craft(t, nil, []craftEntry{reg("a", good)}), DefaultLimits, "does not start with layer.json"},
		{"unknown index schema", craft(t, &Index{Schema: "liken.dev/layer/v9"}, nil), DefaultLimits, `schema "liken.dev/layer/v9"`},
		{"look-alike name", craft(t, idx(), []craftEntry{reg("manifests/cl\u0430ster.yaml", good)}), DefaultLimits, `"manifests/cl\u0430ster.yaml" is not in its index`},
		{"name too long", craft(t, idx(fileOf(strings.Repeat("n", 300), good)), []craftEntry{reg(strings.Repeat("n", 300), good)}), DefaultLimits, "has a name of 300 bytes, more than the 255 allowed"},
		{"padding after the archive", padded(t, craft(t, idx(fileOf("a", good)), []craftEntry{reg("a", good)}), 3<<20), Limits{MaxTotal: 1 << 20}, "decompresses to more than 2097152 bytes"},
		{"larger than allowed as stored", realBytes, Limits{MaxCompressed: 100}, "larger than 100 bytes as stored"},
		{"bytes after the gzip stream", append(append([]byte(nil), realBytes...), "junk"...), DefaultLimits, "bytes after its gzip stream"},
		{"a second gzip stream", append(append([]byte(nil), realBytes...), realBytes...), DefaultLimits, "bytes after its gzip stream"},
		{"setuid mode", craft(t, idx(File{Name: "a", Size: int64(len(good)), SHA256: fileOf("a", good).SHA256, Mode: 0o4755}), []craftEntry{reg("a", good)}), DefaultLimits, "only permission bits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "layer")
			_, err := Unpack(bytes.NewReader(tt.data), dir, tt.lim)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want %q", err, tt.want)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Errorf("a refused layer left %d entries behind", len(entries))
			}
		})
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
