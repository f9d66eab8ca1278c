package identity

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/layer"
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

func build(t *testing.T, identityDir, out string) *Result {
	t.Helper()
	res, err := BuildLayers(Input{Docs: examples(t), IdentityDir: identityDir, OutDir: out})
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
	if !strings.Contains(string(kc), `server: "https://192.168.10.11:6443"`) {
		t.Errorf("admin kubeconfig does not name the first server:\n%s", kc)
	}
	for role, path := range res.Layers {
		dir := filepath.Join(t.TempDir(), "layer")
		f, _ := os.Open(path)
		idx, err := layer.Unpack(f, dir, layer.DefaultLimits)
		f.Close()
		if err != nil {
			t.Fatalf("%s layer: %v", role, err)
		}
		has := func(p string) bool { _, err := os.Stat(filepath.Join(dir, p)); return err == nil }
		mode := func(p string) os.FileMode { st, _ := os.Stat(filepath.Join(dir, p)); return st.Mode().Perm() }
		if has("admin.kubeconfig") {
			t.Errorf("%s layer holds the admin kubeconfig", role)
		}
		for _, p := range []string{layer.ClusterManifest, layer.MachinesDir + "/server-1.yaml", layer.MachinesDir + "/agent-2.yaml", "tls/server-ca.crt", "tls/client-ca.crt", "tls/etcd/peer-ca.crt", layer.TokenFile} {
			if !has(p) {
				t.Errorf("%s layer lacks %s", role, p)
			}
		}
		token, _ := os.ReadFile(filepath.Join(dir, layer.TokenFile))
		ca, _ := os.ReadFile(filepath.Join(dir, "tls/server-ca.crt"))
		sum := sha256.Sum256(ca)
		wantPrefix := "K10" + hex.EncodeToString(sum[:]) + "::"
		if !strings.HasPrefix(string(token), wantPrefix) {
			t.Errorf("%s token %q does not carry the server CA hash %s", role, token, wantPrefix)
		}
		if mode(layer.TokenFile) != 0o600 {
			t.Errorf("%s token mode %o, want 0600", role, mode(layer.TokenFile))
		}
		switch role {
		case v1alpha1.RoleServer:
			if !strings.Contains(string(token), "::server:") || !has(layer.AgentTokenFile) {
				t.Errorf("server layer: token %q, agent token present %v", token, has(layer.AgentTokenFile))
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
			if !has("k3s-manifests/liken-crds.yaml") || !has("k3s-manifests/liken-rbac.yaml") || !has("k3s-manifests/liken-policies.yaml") {
				t.Errorf("server layer lacks the manifests k3s applies")
			}
			if strings.Join(idx.Machines, ",") != "server-1,server-2,server-3" {
				t.Errorf("server layer credentials for %v", idx.Machines)
			}
		case v1alpha1.RoleAgent:
			if !strings.Contains(string(token), "::node:") || has(layer.AgentTokenFile) {
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
	_, err := BuildLayers(Input{Docs: docs, IdentityDir: t.TempDir(), OutDir: t.TempDir()})
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
	_, err = BuildLayers(Input{Docs: bad, IdentityDir: t.TempDir(), OutDir: out})
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

// TestStandInCredentials: a test layer for the k3s stand-in carries each machine's node
// identity and the node components' identities (kube-proxy's and flannel's k3s-controller),
// client certificates of the cluster's client CA for the users k3s gives them; a layer
// narrowed to one machine keeps the components' and drops the other machines' node identities.
func TestStandInCredentials(t *testing.T) {
	out := t.TempDir()
	res, err := BuildLayers(Input{Docs: examples(t), IdentityDir: filepath.Join(t.TempDir(), "identity"), OutDir: out, StandInNodeCredentials: true})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(res.Layers[v1alpha1.RoleAgent])
	if err != nil {
		t.Fatal(err)
	}
	narrowed, _, err := layer.Narrow(data, "agent-1")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layer")
	if _, err := layer.Unpack(bytes.NewReader(narrowed), dir, layer.DefaultLimits); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "tls", "client-ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	for stem, user := range map[string]string{
		layer.StandInDir + "/agent-1":                  "system:node:agent-1",
		layer.StandInComponentsDir + "/kube-proxy":     "system:kube-proxy",
		layer.StandInComponentsDir + "/k3s-controller": "system:k3s-controller",
	} {
		certPEM, err1 := os.ReadFile(filepath.Join(dir, stem+".crt"))
		keyPEM, err2 := os.ReadFile(filepath.Join(dir, stem+".key"))
		if err := errors.Join(err1, err2); err != nil {
			t.Errorf("the narrowed layer lacks %s: %v", stem, err)
			continue
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Errorf("%s: %v", stem, err)
			continue
		}
		cert, _ := x509.ParseCertificate(pair.Certificate[0])
		if cert.Subject.CommonName != user {
			t.Errorf("%s is for %q, want %q", stem, cert.Subject.CommonName, user)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s is not a client certificate of the cluster's client CA: %v", stem, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, layer.StandInDir, "agent-2.crt")); err == nil {
		t.Error("the layer narrowed to agent-1 keeps agent-2's node identity")
	}
}
