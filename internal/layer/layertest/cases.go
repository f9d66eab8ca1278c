// Package layertest holds hostile deployment layers, for the tests of every reader of a
// layer: liken's layer package, and init's reader of the layer partition at boot.
package layertest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/layer"
)

// Case is a layer a reader must refuse under Lim, with an error holding Want.
type Case struct {
	Name string
	Data []byte
	Lim  layer.Limits
	Want string
}

// Refused are the hostile layers: tampered, truncated, climbing out of the layer, links and
// devices, over a bound (entry size, total, name length, decompressed bytes, stored bytes),
// duplicate or unlisted entries, look-alike names, trailing data, odd modes.
func Refused(t testing.TB) []Case {
	good := []byte("cluster: yes\n")
	idx := func(files ...layer.File) *layer.Index {
		return &layer.Index{Schema: layer.Schema, Role: v1alpha1.RoleAgent, Files: files}
	}
	realBytes := Sample(t)
	return []Case{
		{"tampered entry", Craft(t, idx(FileOf("a", good)), []Entry{Reg("a", []byte("cluster: no!\n"))}), layer.DefaultLimits, `layer entry "a" does not match its index`},
		{"tampered compressed bytes", func() []byte { b := append([]byte(nil), realBytes...); b[len(b)/2] ^= 0xff; return b }(), layer.DefaultLimits, "corrupt"},
		{"truncated", realBytes[:len(realBytes)/2], layer.DefaultLimits, "truncated"},
		{"not gzip", []byte("hello"), layer.DefaultLimits, "not a gzip stream"},
		{"path traversal", Craft(t, idx(FileOf("../evil", good)), []Entry{Reg("../evil", good)}), layer.DefaultLimits, "must not climb out of the layer"},
		{"nested traversal", Craft(t, idx(), []Entry{Reg("a/../../evil", good)}), layer.DefaultLimits, "must be clean paths"},
		{"absolute path", Craft(t, idx(FileOf("/etc/passwd", good)), []Entry{Reg("/etc/passwd", good)}), layer.DefaultLimits, "must be relative paths"},
		{"symlink", Craft(t, idx(), []Entry{{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "link", Linkname: "/etc/shadow"}}}), layer.DefaultLimits, "is a symbolic link"},
		{"hardlink", Craft(t, idx(), []Entry{{Hdr: tar.Header{Typeflag: tar.TypeLink, Name: "link", Linkname: "layer.json"}}}), layer.DefaultLimits, "is a hard link"},
		{"device node", Craft(t, idx(), []Entry{{Hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}}}), layer.DefaultLimits, "is a device or pipe"},
		{"directory entry", Craft(t, idx(), []Entry{{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755}}}), layer.DefaultLimits, "only regular files"},
		{"oversized entry", Craft(t, idx(FileOf("big", make([]byte, 2000))), []Entry{Reg("big", make([]byte, 2000))}), layer.Limits{MaxFileSize: 1000, MaxTotal: 1 << 20, MaxFiles: 10}, "more than the 1000 allowed"},
		{"oversized total", Craft(t, idx(FileOf("a", make([]byte, 900)), FileOf("b", make([]byte, 900))), []Entry{Reg("a", make([]byte, 900)), Reg("b", make([]byte, 900))}), layer.Limits{MaxFileSize: 1000, MaxTotal: 1500, MaxFiles: 10}, "larger than 1500 bytes"},
		{"duplicate entry", Craft(t, idx(FileOf("a", good)), []Entry{Reg("a", good), Reg("a", good)}), layer.DefaultLimits, `"a" appears twice`},
		{"entry not indexed", Craft(t, idx(), []Entry{Reg("extra", good)}), layer.DefaultLimits, `"extra" is not in its index`},
		{"indexed entry missing", Craft(t, idx(FileOf("gone", good)), nil), layer.DefaultLimits, `lists "gone", which the layer does not hold`},
		{"index not first", Craft(t, nil, []Entry{Reg("a", good)}), layer.DefaultLimits, "does not start with layer.json"},
		{"unknown index schema", Craft(t, &layer.Index{Schema: "liken.dev/layer/v9"}, nil), layer.DefaultLimits, `schema "liken.dev/layer/v9"`},
		{"look-alike name", Craft(t, idx(), []Entry{Reg("manifests/cl\u0430ster.yaml", good)}), layer.DefaultLimits, `"manifests/cl\u0430ster.yaml" is not in its index`},
		{"name too long", Craft(t, idx(FileOf(strings.Repeat("n", 300), good)), []Entry{Reg(strings.Repeat("n", 300), good)}), layer.DefaultLimits, "has a name of 300 bytes, more than the 255 allowed"},
		{"padding after the archive", Padded(t, Craft(t, idx(FileOf("a", good)), []Entry{Reg("a", good)}), 3<<20), layer.Limits{MaxTotal: 1 << 20}, "decompresses to more than 2097152 bytes"},
		{"larger than allowed as stored", realBytes, layer.Limits{MaxCompressed: 100}, "larger than 100 bytes as stored"},
		{"bytes after the gzip stream", append(append([]byte(nil), realBytes...), "junk"...), layer.DefaultLimits, "bytes after its gzip stream"},
		{"a second gzip stream", append(append([]byte(nil), realBytes...), realBytes...), layer.DefaultLimits, "bytes after its gzip stream"},
		{"setuid mode", Craft(t, idx(layer.File{Name: "a", Size: int64(len(good)), SHA256: FileOf("a", good).SHA256, Mode: 0o4755}), []Entry{Reg("a", good)}), layer.DefaultLimits, "only permission bits"},
	}
}

// Sample packs a small valid layer.
func Sample(t testing.TB) []byte {
	t.Helper()
	b, err := layer.Pack(layer.Index{Schema: layer.Schema, Role: v1alpha1.RoleAgent}, map[string]layer.Entry{
		layer.ClusterManifest: {Data: bytes.Repeat([]byte("apiVersion: liken.dev/v1alpha1\n"), 200), Mode: 0o644},
		layer.TokenFile:       {Data: []byte("K10abc::node:secret\n"), Mode: 0o600},
		"tls/server-ca.crt":   {Data: bytes.Repeat([]byte("CERT"), 300), Mode: 0o644},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Entry is one entry Craft writes: any tar header, and the bytes after it.
type Entry struct {
	Hdr  tar.Header
	Data []byte
}

// Craft writes a tar.gz with arbitrary headers, after an index listing the given files
// (none when index is nil).
func Craft(t testing.TB, index *layer.Index, entries []Entry) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if index != nil {
		b, _ := json.Marshal(index)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: layer.IndexName, Size: int64(len(b)), Mode: 0o644})
		tw.Write(b)
	}
	for _, e := range entries {
		h := e.Hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.Data)
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// Padded is layer's archive followed, inside the same gzip stream, by n zero bytes.
func Padded(t testing.TB, layer []byte, n int) []byte {
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

// FileOf is the index entry of a file holding data.
func FileOf(name string, data []byte) layer.File {
	sum := sha256.Sum256(data)
	return layer.File{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Mode: 0o644}
}

// Reg is a regular file entry.
func Reg(name string, data []byte) Entry {
	return Entry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644}, Data: data}
}
