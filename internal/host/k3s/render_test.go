package k3s

import (
	"bytes"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"liken.dev/liken/api/v1alpha1"
)

func ptr[T any](v T) *T { return &v }

// Flags k3s defines for `k3s agent` (pkg/cli/cmds/agent.go) among those liken renders; any
// other key in an agent's file makes k3s agent refuse to start.
var agentFlags = map[string]bool{
	"server": true, "token": true, "token-file": true, "node-name": true, "node-ip": true,
	"node-label": true, "node-taint": true, "data-dir": true, "kubelet-arg": true,
	"private-registry": true, "disable-default-registry-endpoint": true, "protect-kernel-defaults": true,
}

func clusterSpec() v1alpha1.ClusterSpec {
	return v1alpha1.ClusterSpec{
		Network: v1alpha1.ClusterNetwork{ClusterCIDR: "10.42.0.0/16", ServiceCIDR: "10.43.0.0/16", ClusterDNS: "10.43.0.10", ClusterDomain: "cluster.local"},
		Features: v1alpha1.K3sFeatures{Traefik: ptr(false), MetricsServer: ptr(true), LocalStorage: ptr(true), CoreDNS: ptr(true),
			ServiceLB: ptr(false), NetworkPolicy: ptr(true), EmbeddedRegistry: ptr(true), SecretsEncryption: ptr(false), FlannelBackend: "vxlan"},
		Registries: &v1alpha1.Registries{
			Mirrors: []v1alpha1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"https://mirror.local:5000"}}},
			Configs: []v1alpha1.RegistryConfig{{Host: "mirror.local:5000", AuthSecret: &v1alpha1.SecretReference{Name: "creds"},
				TLS: &v1alpha1.RegistryTLS{Secret: &v1alpha1.SecretReference{Name: "ca"}}}},
		},
	}
}

var secrets = map[string]map[string][]byte{
	"creds": {"username": []byte("u"), "password": []byte("p")},
	"ca":    {"ca.crt": []byte("CERT")},
}

func keys(t *testing.T, b []byte) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRenderServer(t *testing.T) {
	out, err := Render(Input{Role: v1alpha1.RoleServer, NodeName: "s1", Cluster: clusterSpec(), Secrets: secrets, Paths: DefaultPaths})
	if err != nil {
		t.Fatal(err)
	}
	cfg := keys(t, out[DefaultPaths.Config])
	want := map[string]any{
		"node-name": "s1", "token-file": DefaultPaths.TokenFile, "data-dir": DefaultPaths.DataDir,
		"private-registry": DefaultPaths.Registries, "cluster-init": true,
		"cluster-cidr": "10.42.0.0/16", "service-cidr": "10.43.0.0/16", "cluster-dns": "10.43.0.10", "cluster-domain": "cluster.local",
		"flannel-backend": "vxlan", "embedded-registry": true, "write-kubeconfig-mode": "0600",
		"agent-token-file": DefaultPaths.AgentTokenFile,
	}
	for k, v := range want {
		if cfg[k] != v {
			t.Errorf("config %s = %v, want %v", k, cfg[k], v)
		}
	}
	got := cfg["disable"].([]any)
	if len(got) != 2 || got[0] != "servicelb" || got[1] != "traefik" {
		t.Errorf("disable = %v, want [servicelb traefik]", got)
	}
	if _, ok := cfg["disable-network-policy"]; ok {
		t.Errorf("network policy enabled but disable-network-policy rendered")
	}
	if !bytes.Contains(out[DefaultPaths.Config], []byte(`write-kubeconfig-mode: "0600"`)) {
		t.Errorf("write-kubeconfig-mode not quoted:\n%s", out[DefaultPaths.Config])
	}

	reg := keys(t, out[DefaultPaths.Registries])
	mirror := reg["mirrors"].(map[string]any)["docker.io"].(map[string]any)
	if ep := mirror["endpoint"].([]any); len(ep) != 1 || ep[0] != "https://mirror.local:5000" {
		t.Errorf("mirror endpoint = %v", ep)
	}
	conf := reg["configs"].(map[string]any)["mirror.local:5000"].(map[string]any)
	if a := conf["auth"].(map[string]any); a["username"] != "u" || a["password"] != "p" {
		t.Errorf("auth = %v", a)
	}
	caPath := filepath.Join(DefaultPaths.RegistryFiles, "mirror.local:5000", "ca.crt")
	if conf["tls"].(map[string]any)["ca_file"] != caPath || string(out[caPath]) != "CERT" {
		t.Errorf("tls = %v, file %q", conf["tls"], out[caPath])
	}
}

func TestRenderAgentHasNoServerOnlyKey(t *testing.T) {
	out, err := Render(Input{Role: v1alpha1.RoleAgent, NodeName: "a1", NodeIP: "192.168.76.20", Join: "https://s1:6443", Cluster: clusterSpec(), Secrets: secrets, Paths: DefaultPaths})
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for k := range keys(t, out[DefaultPaths.Config]) {
		if !agentFlags[k] {
			bad = append(bad, k)
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("agent config carries keys k3s agent does not define: %v", bad)
	}
	if keys(t, out[DefaultPaths.Config])["server"] != "https://s1:6443" {
		t.Errorf("agent does not join its server")
	}
	if got := keys(t, out[DefaultPaths.Config])["node-ip"]; got != "192.168.76.20" {
		t.Errorf("node-ip %v, want the Machine's nodeIP 192.168.76.20", got)
	}
	if _, err := Render(Input{Role: v1alpha1.RoleAgent, NodeName: "a1", Cluster: clusterSpec(), Secrets: secrets, Paths: DefaultPaths}); err == nil {
		t.Errorf("an agent without a server to join rendered")
	}
}

// TestPackagedComponentChangesOnlyServers: switching a packaged component changes a server's
// files and not an agent's, so only servers restart k3s.
func TestPackagedComponentChangesOnlyServers(t *testing.T) {
	for _, role := range []v1alpha1.Role{v1alpha1.RoleServer, v1alpha1.RoleAgent} {
		before := clusterSpec()
		after := clusterSpec()
		after.Features.Traefik = ptr(true)
		in := Input{Role: role, NodeName: "n", Join: "https://s1:6443", Secrets: secrets, Paths: DefaultPaths}
		in.Cluster = before
		a, err := Render(in)
		if err != nil {
			t.Fatal(err)
		}
		in.Cluster = after
		b, err := Render(in)
		if err != nil {
			t.Fatal(err)
		}
		root := Root(t.TempDir())
		if err := root.Write(a); err != nil {
			t.Fatal(err)
		}
		changed, err := root.Changed(b)
		if err != nil {
			t.Fatal(err)
		}
		if role == v1alpha1.RoleServer && len(changed) != 1 {
			t.Errorf("server: changed files %v, want the config file", changed)
		}
		if role == v1alpha1.RoleAgent && len(changed) != 0 {
			t.Errorf("agent: changed files %v, want none", changed)
		}
	}
}

func TestRenderMissingSecret(t *testing.T) {
	_, err := Render(Input{Role: v1alpha1.RoleServer, NodeName: "s1", Cluster: clusterSpec(), Secrets: map[string]map[string][]byte{"ca": secrets["ca"]}, Paths: DefaultPaths})
	if err == nil || !strings.Contains(err.Error(), "Secret liken-system/creds (auth for mirror.local:5000) not found") {
		t.Errorf("missing Secret: %v", err)
	}
}

func TestRenderIsDeterministic(t *testing.T) {
	in := Input{Role: v1alpha1.RoleServer, NodeName: "s1", Cluster: clusterSpec(), Secrets: secrets, Paths: DefaultPaths}
	a, _ := Render(in)
	for i := 0; i < 20; i++ {
		b, _ := Render(in)
		for _, p := range a.Paths() {
			if !bytes.Equal(a[p], b[p]) {
				t.Fatalf("%s differs between renders", p)
			}
		}
	}
}

func TestRenderAtBootWithoutSecrets(t *testing.T) {
	out, err := Render(Input{Role: v1alpha1.RoleServer, NodeName: "s1", Cluster: clusterSpec(), AllowMissingSecrets: true, Paths: DefaultPaths})
	if err != nil {
		t.Fatal(err)
	}
	reg := string(out[DefaultPaths.Registries])
	if !strings.Contains(reg, "# auth for mirror.local:5000 omitted: Secret liken-system/creds not read yet") || strings.Contains(reg, "password") {
		t.Errorf("registries.yaml at boot:\n%s", reg)
	}
	if !strings.Contains(reg, "https://mirror.local:5000") {
		t.Errorf("the mirror itself must still be rendered:\n%s", reg)
	}
}

// TestSwapOnTellsTheKubelet: with swap on, servers and agents both render k3s's kubelet-arg
// fail-swap-on=false (a key k3s agent defines); without, neither does.
func TestSwapOnTellsTheKubelet(t *testing.T) {
	for _, role := range []v1alpha1.Role{v1alpha1.RoleServer, v1alpha1.RoleAgent} {
		for _, on := range []bool{false, true} {
			out, err := Render(Input{Role: role, NodeName: "n", Join: "https://s1:6443", Cluster: clusterSpec(), Secrets: secrets, Paths: DefaultPaths, SwapOn: on})
			if err != nil {
				t.Fatal(err)
			}
			got := keys(t, out[DefaultPaths.Config])["kubelet-arg"]
			want := any(nil)
			if on {
				want = []any{"fail-swap-on=false"}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s, swap on %v: kubelet-arg %v, want %v", role, on, got, want)
			}
		}
	}
	if !agentFlags["kubelet-arg"] {
		t.Error("kubelet-arg is not a k3s agent flag in the test's list")
	}
}

// TestKubeletLogsConfig: the node log query is on for every kubelet, and the feature gate is
// named only where the kubelet still has it (before Kubernetes 1.36, when it went GA and is
// to be removed).
func TestKubeletLogsConfig(t *testing.T) {
	for _, tt := range []struct {
		version string
		gate    bool
	}{
		{"v1.35.4+k3s1", true},
		{"v1.32.0+k3s1", true},
		{"v1.36.3+k3s1", false},
		{"v1.40.0+k3s2", false},
		{"", false}, // the stand-in's, newer
		{"not a version", false},
	} {
		c := string(KubeletLogsConfig(tt.version))
		if !strings.Contains(c, "kind: KubeletConfiguration\n") || !strings.Contains(c, "enableSystemLogQuery: true\n") || !strings.Contains(c, "enableSystemLogHandler: true\n") {
			t.Errorf("%q: the drop-in does not turn the log query on:\n%s", tt.version, c)
		}
		if got := strings.Contains(c, "NodeLogQuery: true"); got != tt.gate {
			t.Errorf("%q: feature gate named %v; want %v", tt.version, got, tt.gate)
		}
	}
}
