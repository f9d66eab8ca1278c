package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// dhcpFleet writes the example cluster into a directory with every server on DHCP and the
// Cluster given registrationAddress (none when empty), and returns the Cluster file and the
// Machines directory.
func dhcpFleet(t *testing.T, registrationAddress string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	machines := filepath.Join(dir, "machines")
	if err := os.MkdirAll(machines, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(examples)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(examples, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var o map[string]any
		if err := yaml.Unmarshal(b, &o); err != nil {
			t.Fatal(err)
		}
		spec := o["spec"].(map[string]any)
		path := filepath.Join(machines, e.Name())
		switch {
		case o["kind"] == "Cluster":
			path = filepath.Join(dir, e.Name())
			if registrationAddress != "" {
				spec["registrationAddress"] = registrationAddress
			}
		case spec["role"] == "server":
			eth0 := spec["network"].(map[string]any)["interfaces"].([]any)[0].(map[string]any)
			spec["network"] = map[string]any{"interfaces": []any{map[string]any{"name": eth0["name"], "mac": eth0["mac"], "dhcp": true}}}
		}
		if b, err = yaml.Marshal(o); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "cluster.yaml"), machines
}

// TestLayerRefusesMachinesThatCannotJoin: servers on DHCP with no registration address give
// the machines nowhere to join (before, --server let such layers be built: it reaches only
// admin.kubeconfig), so no layer is built, and the message says what to set.
func TestLayerRefusesMachinesThatCannotJoin(t *testing.T) {
	cluster, machines := dhcpFleet(t, "")
	out := filepath.Join(t.TempDir(), "out")
	code, _, errOut := run(t, "layer", "--cluster", cluster, "--machines", machines, "--out", out, "--server", "https://192.0.2.10:6443")
	want := "checking how the machines join the cluster: machine agent-1 has no server to join: the first server, server-1, has no static address, and the Cluster has no spec.registrationAddress"
	if code != exitFailed || !strings.Contains(errOut, want) || !strings.Contains(errOut, "give the Cluster a spec.registrationAddress, or the first server a static address") {
		t.Errorf("exit %d: %s\nwant it to say %q", code, errOut, want)
	}
	for _, f := range []string{"server.layer", "agent.layer", "admin.kubeconfig"} {
		if _, err := os.Stat(filepath.Join(out, f)); err == nil {
			t.Errorf("%s was written anyway", f)
		}
	}
}

// TestLayerWithRegistrationAddress: the same DHCP servers with a registration address make
// layers, and admin.kubeconfig names that address, which every server's certificate holds.
func TestLayerWithRegistrationAddress(t *testing.T) {
	cluster, machines := dhcpFleet(t, "k3s.example.com")
	out := filepath.Join(t.TempDir(), "out")
	code, _, errOut := run(t, "layer", "--cluster", cluster, "--machines", machines, "--out", out)
	if code != exitOK {
		t.Fatalf("layer: exit %d: %s", code, errOut)
	}
	kc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(out, "admin.kubeconfig"))
	if err != nil || kc.Host != "https://k3s.example.com:6443" {
		t.Errorf("admin.kubeconfig's server %v (%v), want https://k3s.example.com:6443", kc, err)
	}
}
