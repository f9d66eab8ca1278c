package identity

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/test/apiserver"
)

// TestIdentityWithRealAPIServer runs a real API server on the identity liken layer made (its
// serving certificate from the layer's server CA, clients checked against its client CA) and
// uses what the layers carry: the admin kubeconfig, the RBAC k3s would apply, and a machine's
// own credential.
func TestIdentityWithRealAPIServer(t *testing.T) {
	identity := filepath.Join(t.TempDir(), "identity")
	build(t, identity, t.TempDir())
	id, err := LoadOrCreateIdentity(identity)
	if err != nil {
		t.Fatal(err)
	}
	env, err := apiserver.Start(t.Context(), apiserver.Options{ServerCA: id.CAs["server-ca"], ClientCA: id.CAs["client-ca"]})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	out := t.TempDir()
	res, err := BuildLayers(Input{Docs: examples(t), IdentityDir: identity, OutDir: out, Server: env.Host})
	if err != nil {
		t.Fatal(err)
	}
	unpack := func(role v1alpha1.Role) string {
		dir := filepath.Join(t.TempDir(), string(role))
		f, _ := os.Open(res.Layers[role])
		defer f.Close()
		if _, err := layer.Unpack(f, dir, layer.DefaultLimits); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	server, agent := unpack(v1alpha1.RoleServer), unpack(v1alpha1.RoleAgent)

	if _, err := env.KubectlWith(t.Context(), res.Kubeconfig, "get", "namespaces"); err != nil {
		t.Fatalf("the layer's admin kubeconfig does not work: %v", err)
	}
	for _, f := range []string{"k3s-manifests/liken-crds.yaml", "k3s-manifests/liken-rbac.yaml", "k3s-manifests/liken-policies.yaml", layer.ClusterManifest, layer.MachinesDir} {
		if _, err := env.KubectlWith(t.Context(), res.Kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(server, f)); err != nil {
			t.Fatalf("applying %s: %v", f, err)
		}
	}
	// The change warnings (issue 27 item 6) come with the CRDs: their policies and bindings.
	for _, name := range []string{"liken-change-warnings-clusters", "liken-change-warnings-machines"} {
		if _, err := env.KubectlWith(t.Context(), res.Kubeconfig, "get", "validatingadmissionpolicy/"+name, "validatingadmissionpolicybinding/"+name); err != nil {
			t.Errorf("the layer's policies did not install %s: %v", name, err)
		}
	}
	cert, _ := os.ReadFile(filepath.Join(agent, layer.CredentialsDir, "agent-1.crt"))
	key, _ := os.ReadFile(filepath.Join(agent, layer.CredentialsDir, "agent-1.key"))
	ca, _ := os.ReadFile(filepath.Join(agent, "tls/server-ca.crt"))
	c, err := kube.NewClient(&rest.Config{Host: env.Host, TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: cert, KeyData: key}})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := c.Machine(t.Context(), "agent-1"); err != nil || m.Spec.Role != v1alpha1.RoleAgent {
		t.Errorf("agent-1's own credential cannot read its Machine: %v", err)
	}
	if _, err := c.Machine(t.Context(), "agent-2"); !apierrors.IsForbidden(err) {
		t.Errorf("agent-1's credential read agent-2's Machine: %v", err)
	}
	if _, err := c.Cluster(t.Context()); err != nil {
		t.Errorf("agent-1 cannot read the Cluster: %v", err)
	}
	// The tokens name the CA this API server really serves with.
	token, _ := os.ReadFile(filepath.Join(agent, layer.TokenFile))
	if !strings.Contains(string(token), id.CAHash()) {
		t.Errorf("agent token does not carry the CA hash")
	}
}
