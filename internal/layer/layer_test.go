package layer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/manifest"
)

func examples(t *testing.T) []manifest.Document {
	t.Helper()
	docs, err := manifest.Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

func build(t *testing.T, identity, out string) *Result {
	t.Helper()
	res, err := Build(Input{Docs: examples(t), IdentityDir: identity, OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestBuildPerRole(t *testing.T) {
	out := t.TempDir()
	res := build(t, filepath.Join(t.TempDir(), "identity"), out)
	if res.Kubeconfig != filepath.Join(out, "admin.kubeconfig") {
		t.Errorf("admin kubeconfig at %s", res.Kubeconfig)
	}
	kc, _ := os.ReadFile(res.Kubeconfig)
	if !strings.Contains(string(kc), "server: https://192.168.10.11:6443") {
		t.Errorf("admin kubeconfig does not name the first server:\n%s", kc)
	}
	for role, path := range res.Layers {
		dir := filepath.Join(t.TempDir(), "layer")
		f, _ := os.Open(path)
		idx, err := Unpack(f, dir, DefaultLimits)
		f.Close()
		if err != nil {
			t.Fatalf("%s layer: %v", role, err)
		}
		has := func(p string) bool { _, err := os.Stat(filepath.Join(dir, p)); return err == nil }
		mode := func(p string) os.FileMode { st, _ := os.Stat(filepath.Join(dir, p)); return st.Mode().Perm() }
		if has("admin.kubeconfig") {
			t.Errorf("%s layer holds the admin kubeconfig", role)
		}
		for _, p := range []string{ClusterManifest, MachinesDir + "/server-1.yaml", MachinesDir + "/agent-2.yaml", "tls/server-ca.crt", "tls/client-ca.crt", "tls/etcd/peer-ca.crt", TokenFile} {
			if !has(p) {
				t.Errorf("%s layer lacks %s", role, p)
			}
		}
		token, _ := os.ReadFile(filepath.Join(dir, TokenFile))
		ca, _ := os.ReadFile(filepath.Join(dir, "tls/server-ca.crt"))
		sum := sha256.Sum256(ca)
		wantPrefix := "K10" + hex.EncodeToString(sum[:]) + "::"
		if !strings.HasPrefix(string(token), wantPrefix) {
			t.Errorf("%s token %q does not carry the server CA hash %s", role, token, wantPrefix)
		}
		if mode(TokenFile) != 0o600 {
			t.Errorf("%s token mode %o, want 0600", role, mode(TokenFile))
		}
		switch role {
		case v1alpha1.RoleServer:
			if !strings.Contains(string(token), "::server:") || !has(AgentTokenFile) {
				t.Errorf("server layer: token %q, agent token present %v", token, has(AgentTokenFile))
			}
			for _, k := range []string{"tls/server-ca.key", "tls/client-ca.key", "tls/request-header-ca.key", "tls/etcd/peer-ca.key", "tls/etcd/server-ca.key", "tls/service.key"} {
				if !has(k) || mode(k) != 0o600 {
					t.Errorf("server layer: %s missing or not 0600", k)
				}
			}
			cert, _ := os.ReadFile(filepath.Join(dir, "tls/server-ca.crt"))
			key, _ := os.ReadFile(filepath.Join(dir, "tls/server-ca.key"))
			if _, err := tls.X509KeyPair(cert, key); err != nil {
				t.Errorf("server CA certificate and key do not match: %v", err)
			}
			if !has("k3s-manifests/liken-crds.yaml") || !has("k3s-manifests/liken-rbac.yaml") {
				t.Errorf("server layer lacks the manifests k3s applies")
			}
			if strings.Join(idx.Machines, ",") != "server-1,server-2,server-3" {
				t.Errorf("server layer credentials for %v", idx.Machines)
			}
		case v1alpha1.RoleAgent:
			if !strings.Contains(string(token), "::node:") || has(AgentTokenFile) {
				t.Errorf("agent layer: token %q must be the agent token only", token)
			}
			filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
				rel, _ := filepath.Rel(dir, p)
				if strings.HasPrefix(rel, "tls/") && strings.HasSuffix(rel, ".key") {
					t.Errorf("agent layer carries a CA key: %s", rel)
				}
				return nil
			})
			if strings.Join(idx.Machines, ",") != "agent-1,agent-2" || has("credentials/server-1.key") {
				t.Errorf("agent layer credentials for %v", idx.Machines)
			}
			if mode("credentials/agent-1.key") != 0o600 {
				t.Errorf("machine key mode %o", mode("credentials/agent-1.key"))
			}
		}
	}
}

func TestRebuildKeepsIdentityAndBytes(t *testing.T) {
	identity := filepath.Join(t.TempDir(), "identity")
	a := build(t, identity, t.TempDir())
	b := build(t, identity, t.TempDir())
	for role := range a.Layers {
		x, _ := os.ReadFile(a.Layers[role])
		y, _ := os.ReadFile(b.Layers[role])
		if !bytes.Equal(x, y) {
			t.Errorf("%s layer differs between two builds with the same identity", role)
		}
		if a.Digests[role] != b.Digests[role] {
			t.Errorf("%s digest differs", role)
		}
	}
	c := build(t, filepath.Join(t.TempDir(), "other"), t.TempDir())
	x, _ := os.ReadFile(a.Layers[v1alpha1.RoleServer])
	y, _ := os.ReadFile(c.Layers[v1alpha1.RoleServer])
	if bytes.Equal(x, y) {
		t.Errorf("two identities gave the same layer")
	}
}

func TestBuildRefuses(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "deploy.yaml"), []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"), 0o644)
	docs := append(examples(t), mustLoad(t, dir)...)
	_, err := Build(Input{Docs: docs, IdentityDir: t.TempDir(), OutDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "holds only liken.dev/v1alpha1 Cluster and Machine objects, not apps/v1 Deployment") {
		t.Errorf("wrong kind: %v", err)
	}
	bad := examples(t)
	for _, d := range bad {
		if d.Object.GetName() == "agent-1" {
			d.Object.Object["spec"].(map[string]any)["role"] = "worker"
		}
	}
	out := t.TempDir()
	_, err = Build(Input{Docs: bad, IdentityDir: t.TempDir(), OutDir: out})
	if err == nil || !strings.Contains(err.Error(), `Unsupported value: "worker"`) {
		t.Errorf("invalid Machine: %v", err)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("a refused build wrote %d files", len(entries))
	}
}

func mustLoad(t *testing.T, p string) []manifest.Document {
	d, err := manifest.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return d
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
	real := build(t, filepath.Join(t.TempDir(), "identity"), t.TempDir())
	realBytes, _ := os.ReadFile(real.Layers[v1alpha1.RoleAgent])
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
	res := build(t, filepath.Join(t.TempDir(), "identity"), t.TempDir())
	dir := filepath.Join(t.TempDir(), "layer")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "stale"), []byte("old"), 0o644)
	f, _ := os.Open(res.Layers[v1alpha1.RoleAgent])
	defer f.Close()
	if _, err := Unpack(f, dir, DefaultLimits); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "stale")); err == nil {
		t.Errorf("a file of the previous layer survived")
	}
	if entries, _ := os.ReadDir(filepath.Dir(dir)); len(entries) != 1 {
		t.Errorf("unpacking left %d entries beside the layer", len(entries))
	}
}
