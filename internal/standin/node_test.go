package standin

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"

	apirelease "liken.dev/liken/api/release"
)

// TestContainerdConfig: the config parses as TOML, is version 3, and holds k3s's socket, root,
// state, snapshotter, sandbox image, CNI directories and runc runtime.
func TestContainerdConfig(t *testing.T) {
	n := &Node{NodeName: "m1"}
	var c map[string]any
	if err := toml.Unmarshal(n.ContainerdConfig(), &c); err != nil {
		t.Fatalf("containerd's config is not TOML: %v\n%s", err, n.ContainerdConfig())
	}
	get := func(path ...string) any {
		var v any = c
		for _, p := range path {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[p]
		}
		return v
	}
	const cri, images = "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"
	for _, tt := range []struct {
		path []string
		want any
	}{
		{[]string{"version"}, int64(3)},
		{[]string{"root"}, "/var/lib/rancher/k3s/agent/containerd"},
		{[]string{"state"}, "/run/k3s/containerd"},
		{[]string{"grpc", "address"}, "/run/k3s/containerd/containerd.sock"},
		{[]string{"plugins", images, "snapshotter"}, "overlayfs"},
		{[]string{"plugins", images, "pinned_images", "sandbox"}, "rancher/mirrored-pause:3.6"},
		{[]string{"plugins", images, "registry", "config_path"}, "/var/lib/rancher/k3s/agent/etc/containerd/certs.d"},
		{[]string{"plugins", cri, "cni", "conf_dir"}, "/var/lib/rancher/k3s/agent/etc/cni/net.d"},
		{[]string{"plugins", cri, "enable_unprivileged_ports"}, true},
		{[]string{"plugins", cri, "containerd", "runtimes", "runc", "runtime_type"}, "io.containerd.runc.v2"},
		{[]string{"plugins", cri, "containerd", "runtimes", "runc", "options", "SystemdCgroup"}, false},
	} {
		if got := get(tt.path...); got != tt.want {
			t.Errorf("%s = %v (%T), want %v", strings.Join(tt.path, "."), got, got, tt.want)
		}
	}
	if bins, _ := get("plugins", cri, "cni", "bin_dirs").([]any); len(bins) != 1 || bins[0] != "/var/lib/rancher/k3s/data/cni" {
		t.Errorf("CNI bin_dirs = %v, want [/var/lib/rancher/k3s/data/cni]", bins)
	}
	if bytes.Contains(n.ContainerdConfig(), []byte("restrict_oom_score_adj")) {
		t.Error("restrict_oom_score_adj set by default: k3s sets it for a rootless node only")
	}
	if r := (&Node{RestrictOOMScoreAdj: true}).ContainerdConfig(); !bytes.Contains(r, []byte("  restrict_oom_score_adj = true\n")) {
		t.Errorf("RestrictOOMScoreAdj not rendered:\n%s", r)
	}
	if got := n.ContainerdArgs(); !slices.Equal(got, []string{"-c", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"}) {
		t.Errorf("containerd's arguments %v", got)
	}
}

// TestKubeletConfig: every field of the drop-in is one the kubelet's KubeletConfiguration
// has (a misspelt one would be ignored by the kubelet), with k3s's values.
func TestKubeletConfig(t *testing.T) {
	for _, tt := range []struct {
		name        string
		node        Node
		healthz     string
		taints      int
		servingCert string
		wantErr     string
	}{
		{name: "IPv4", node: Node{NodeName: "m1", NodeIP: "192.168.76.10"}, healthz: "127.0.0.1"},
		{name: "serving certificate", node: Node{NodeName: "m1", ServingCert: true}, healthz: "127.0.0.1", servingCert: "/var/lib/rancher/k3s/agent/serving-kubelet.crt"},
		{name: "IPv6", node: Node{NodeName: "m1", NodeIP: "fd00::10"}, healthz: "::1"},
		{name: "taints", node: Node{NodeName: "m1", Taints: []string{"dedicated=db:NoSchedule", "gpu:NoExecute"}}, healthz: "127.0.0.1", taints: 2},
		{name: "bad taint", node: Node{NodeName: "m1", Taints: []string{"dedicated=db"}}, wantErr: "want KEY[=VALUE]:EFFECT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.node.KubeletConfig()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var c kubeletv1beta1.KubeletConfiguration
			d := json.NewDecoder(bytes.NewReader(b))
			d.DisallowUnknownFields()
			if err := d.Decode(&c); err != nil {
				t.Fatalf("not a KubeletConfiguration: %v\n%s", err, b)
			}
			if c.CgroupDriver != "cgroupfs" || c.ContainerRuntimeEndpoint != "unix:///run/k3s/containerd/containerd.sock" ||
				!slices.Equal(c.ClusterDNS, []string{"10.43.0.10"}) || c.ClusterDomain != "cluster.local" ||
				c.HealthzBindAddress != tt.healthz || c.StaticPodPath != "/var/lib/rancher/k3s/agent/pod-manifests" ||
				c.TLSCertFile != tt.servingCert || c.ServerTLSBootstrap != (tt.servingCert == "") || c.Authentication.X509.ClientCAFile != "/var/lib/rancher/k3s/agent/client-ca.crt" ||
				*c.Authentication.Anonymous.Enabled || c.Authorization.Mode != "Webhook" || *c.FailSwapOn || *c.SerializeImagePulls ||
				c.EvictionHard["nodefs.available"] != "5%" || len(c.RegisterWithTaints) != tt.taints {
				t.Errorf("the kubelet's config differs from k3s's:\n%s", b)
			}
		})
	}
}

func TestNodeArgs(t *testing.T) {
	n := &Node{NodeName: "m1", NodeIP: "192.168.76.10", Labels: []string{"a=b", "c=d"}, Args: map[string][]string{"kubelet": {"--v=2"}, "kube-proxy": {"--v=3"}}}
	for _, tt := range []struct {
		name string
		args []string
		want []string
		not  []string
	}{
		{"kubelet", n.KubeletArgs(), []string{"--config-dir=/var/lib/rancher/k3s/agent/etc/kubelet.conf.d",
			"--kubeconfig=/var/lib/rancher/k3s/agent/kubelet.kubeconfig", "--read-only-port=0", "--hostname-override=m1",
			"--node-labels=a=b,c=d", "--node-ip=192.168.76.10", "--v=2"}, []string{"--cloud-provider", "--containerd"}},
		{"kube-proxy", n.KubeProxyArgs(), []string{"--proxy-mode=iptables", "--healthz-bind-address=127.0.0.1",
			"--kubeconfig=/var/lib/rancher/k3s/agent/kubeproxy.kubeconfig", "--cluster-cidr=10.42.0.0/16",
			"--conntrack-max-per-core=0", "--hostname-override=m1", "--v=3"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, w := range tt.want {
				if !slices.Contains(tt.args, w) {
					t.Errorf("no %s in %v", w, tt.args)
				}
			}
			for _, a := range tt.args {
				for _, no := range tt.not {
					if strings.HasPrefix(a, no) {
						t.Errorf("%s given: %v", a, tt.args)
					}
				}
			}
		})
	}
}

func TestFlannelConfigs(t *testing.T) {
	n := &Node{NodeName: "m1"}
	var list struct {
		Name       string `json:"name"`
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(n.FlannelCNIConfig(), &list); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Type)
	}
	if list.Name != "cbr0" || list.CNIVersion != "1.0.0" || !slices.Equal(types, []string{"flannel", "portmap", "bandwidth"}) {
		t.Errorf("the CNI network list differs from k3s's: %s", n.FlannelCNIConfig())
	}
	b, err := n.FlannelNetConf()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"Network":"10.42.0.0/16","EnableIPv6":false,"EnableIPv4":true,"IPv6Network":"::/0","Backend":{"Type":"vxlan"}}`; string(b) != want {
		t.Errorf("net-conf.json %s, want k3s's %s", b, want)
	}
	if _, err := (&Node{ClusterCIDR: "10.42.0.0"}).FlannelNetConf(); err == nil {
		t.Error("a cluster CIDR without a prefix length was taken")
	}
}

// TestNodeFilesLaidOutAsK3s: before it starts anything, a stand-in node writes k3s's agent
// files (containerd's config, the kubelet's drop-in, the network list, flannel's net-conf,
// the components' kubeconfigs from beside the node's, the client CA), renders the registries
// file afresh (a mirror gone from it leaves no hosts.toml), and links the programs and CNI
// plugins where k3s unpacks its own; a node without the components' credentials says what
// it lacks.
func TestNodeFilesLaidOutAsK3s(t *testing.T) {
	dir := t.TempDir()
	parts, creds := filepath.Join(dir, "parts"), filepath.Join(dir, "creds")
	for _, f := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc", "cni/bridge", "cni/host-local"} {
		os.MkdirAll(filepath.Dir(filepath.Join(parts, f)), 0o755)
		os.WriteFile(filepath.Join(parts, f), nil, 0o755)
	}
	os.MkdirAll(creds, 0o700)
	for _, f := range []string{"node.kubeconfig", apirelease.StandInKubeProxyKubeconfig, apirelease.StandInControllerKubeconfig, apirelease.StandInClientCA} {
		os.WriteFile(filepath.Join(creds, f), []byte(f), 0o600)
	}
	n := &Node{DataDir: filepath.Join(dir, "k3s"), NodeName: "m1",
		Registries: map[string]any{"mirrors": map[string]any{"docker.io": map[string]any{"endpoint": []any{"http://10.0.2.2:5000"}}}}}
	in := NodeInput{Parts: parts, Kubeconfig: filepath.Join(creds, "node.kubeconfig"), Hash: "h1"}
	stale := filepath.Join(n.DataDir, "agent", "etc", "containerd", "certs.d", "gone.example", "hosts.toml")
	os.MkdirAll(filepath.Dir(stale), 0o755)
	os.WriteFile(stale, nil, 0o644)
	if err := n.nodeFiles(in); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"agent/kubelet.kubeconfig":       "node.kubeconfig",
		"agent/kubeproxy.kubeconfig":     apirelease.StandInKubeProxyKubeconfig,
		"agent/k3scontroller.kubeconfig": apirelease.StandInControllerKubeconfig,
		"agent/client-ca.crt":            apirelease.StandInClientCA,
	} {
		if b, err := os.ReadFile(filepath.Join(n.DataDir, path)); string(b) != want {
			t.Errorf("%s: %q %v, want the content of %s", path, b, err, want)
		}
	}
	for _, path := range []string{"agent/etc/containerd/config.toml", "agent/etc/kubelet.conf.d/00-k3s-defaults.conf",
		"agent/etc/cni/net.d/10-flannel.conflist", "agent/etc/flannel/net-conf.json", "agent/etc/containerd/certs.d/docker.io/hosts.toml"} {
		if _, err := os.Stat(filepath.Join(n.DataDir, path)); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	if _, err := os.Stat(stale); err == nil {
		t.Errorf("a mirror no longer in the registries file kept its hosts.toml")
	}
	self, _ := os.Executable()
	for link, want := range map[string]string{
		"data/h1/bin/runc":    filepath.Join(parts, "runc"),
		"data/h1/bin/bridge":  filepath.Join(parts, "cni", "bridge"),
		"data/h1/bin/flannel": self,
		"data/cni/host-local": filepath.Join(parts, "cni", "host-local"),
		"data/cni/flannel":    self,
	} {
		if got, err := os.Readlink(filepath.Join(n.DataDir, link)); got != want {
			t.Errorf("%s -> %q (%v), want %s", link, got, err, want)
		}
	}
	os.Remove(filepath.Join(creds, apirelease.StandInKubeProxyKubeconfig))
	if err := n.nodeFiles(in); err == nil || !strings.Contains(err.Error(), "--stand-in-node-credentials") {
		t.Errorf("without kube-proxy's credentials: %v, want an error naming the layer option", err)
	}
}
