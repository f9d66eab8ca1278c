package vm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/cli"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/lab"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/test/apiserver"
	"liken.dev/liken/test/report"
)

// A cluster with no API server on the host: the server machine runs the control plane (the
// stand-in's, laid out as k3s's) and the machines reach each other on a private network. Each
// also has a NIC on QEMU's user network, by DHCP, for the release channel the host serves.
// The manifests are the lab's (lab.WriteManifests).

// standalone is a cluster of installed machines that stands up by itself.
type standalone struct {
	channel    *channelServer
	disks      map[string]string
	kubeconfig string // the admin kubeconfig liken layer wrote, to the server's forwarded API
	apiPort    int
	private    string // the private network's multicast address
	admin      kubernetes.Interface
	lc         *kube.Client
	manifests  string // the Cluster and Machines the layers were built from
	identity   string
}

func standaloneFleet(t *testing.T, machines ...lab.Machine) *standalone {
	t.Helper()
	ch := newChannelServer(t, releaseA)
	dir := t.TempDir()
	if err := lab.WriteManifests(dir, ch.guestURL, releaseA, ch.pins[releaseA], machines); err != nil {
		t.Fatal(err)
	}
	docs, err := manifest.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &standalone{channel: ch, disks: map[string]string{}, apiPort: apiserver.FreePort(),
		// The labs' private networks are on ports 20000-29999.
		private: fmt.Sprintf("230.0.0.1:%d", 30000+rand.IntN(10000)), manifests: dir, identity: filepath.Join(t.TempDir(), "identity")}
	res := s.layers(t, docs)
	s.kubeconfig = res.Kubeconfig
	for _, m := range machines {
		s.install(t, m, res)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 20 * time.Second
	s.admin = kubernetes.NewForConfigOrDie(cfg)
	s.lc, _ = kube.NewClient(cfg)
	return s
}

// layers builds the fleet's layers from docs, on the fleet's identity.
func (s *standalone) layers(t *testing.T, docs []manifest.Document) *identity.Result {
	t.Helper()
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: s.identity, OutDir: t.TempDir(),
		StandInNodeCredentials: true, Server: fmt.Sprintf("https://127.0.0.1:%d", s.apiPort)})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// install installs m's disk with its role's layer.
func (s *standalone) install(t *testing.T, m lab.Machine, res *identity.Result) {
	t.Helper()
	d := filepath.Join(t.TempDir(), m.Name+".img")
	// A server's state partition holds etcd, whose write-ahead log alone takes 64 MiB.
	// The image is sparse: only what is written takes room on the host.
	size := testLayout.MinSizeMiB() + 16
	if m.Role == "server" {
		size += 512
	}
	if _, err := install.Install(context.Background(), install.Options{
		Channel: "file://" + s.channel.dir, Pin: s.channel.pins[releaseA], Layer: res.Layers[v1alpha1.Role(m.Role)], LayerDigest: res.Digests[v1alpha1.Role(m.Role)],
		Disk: d, SizeMiB: size, Layout: testLayout, KernelArgs: "quiet", Machine: m.Name,
	}); err != nil {
		t.Fatal(err)
	}
	s.disks[m.Name] = d
}

// ready waits until each named machine's Node and Machine are Ready, with hardware and
// release reported, and returns when each was first seen so.
func (s *standalone) ready(t *testing.T, since time.Time, timeout time.Duration, names ...string) map[string]time.Duration {
	t.Helper()
	ready := map[string]time.Duration{}
	err := waitUntil(t, "Ready: "+strings.Join(names, ", "), 2*time.Second, timeout, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			if ready[name] > 0 {
				continue
			}
			n, err := s.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil || !kube.NodeReady(n) {
				continue
			}
			m, err := s.lc.Machine(ctx, name)
			if err == nil && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady) && m.Status.Hardware != nil && m.Status.Release != nil {
				ready[name] = time.Since(since)
			}
		}
		return len(ready) == len(names), nil
	})
	if err != nil {
		t.Fatalf("not every machine was Ready: %v (Ready: %v)", err, ready)
	}
	return ready
}

// boot starts a machine of the fleet; the server's API is forwarded to the host.
func (s *standalone) boot(t *testing.T, m lab.Machine, memMiB int) *VM {
	t.Helper()
	opts := Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: s.disks[m.Name]}}, AllowReboot: true,
		NICs: []string{m.MAC}, Private: s.private, PrivateMAC: m.PrivateMAC, MemoryMiB: memMiB,
		Speed: Speed{CPUs: 1, Icount: DefaultSpeed().Icount}}
	if m.Role == "server" {
		opts.Forward = []string{fmt.Sprintf("tcp:127.0.0.1:%d-:6443", s.apiPort)}
	}
	if os.Getenv("LIKEN_VM_CONSOLE") != "" {
		opts.Log = os.Stderr
	}
	v, err := Boot(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s's console:\n%s", m.Name, v.Console())
		}
		v.Kill()
	})
	return v
}

func (s *standalone) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(apiserver.ToolsDir(), "kubectl"), append([]string{"--kubeconfig", s.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var (
	labServer = lab.Machine{Name: "lab-server", Role: "server", MAC: "52:54:00:12:34:01", PrivateMAC: "52:54:00:76:00:10", IP: "192.168.76.10"}
	labAgent  = lab.Machine{Name: "lab-agent", Role: "agent", MAC: "52:54:00:12:34:02", PrivateMAC: "52:54:00:76:00:20", IP: "192.168.76.20"}
)

// TestClusterStandsUpByItself: from a stand-in release and the layers liken layer builds, a
// server and an agent boot with no API server on the host. The server runs the control
// plane, bootstrap makes the Cluster and Machines from its layer, the agent joins over the
// private network, and through the layer's admin kubeconfig kubectl shows both Nodes and
// both Machines with their hardware and slot. A sysctl edit then applies live on the agent.
// Then the layers are built again with one more Machine: the server boots with the newer
// layer and makes only that Machine (an operator's edits to the Cluster and to lab-agent
// stand), and the new agent joins.
func TestClusterStandsUpByItself(t *testing.T) {
	vmTest(t)
	s := standaloneFleet(t, labServer, labAgent)
	start := time.Now()
	vms := map[string]*VM{
		"lab-server": s.boot(t, labServer, 2048),
		"lab-agent":  s.boot(t, labAgent, 1024),
	}
	apiUp := expect(t, vms["lab-server"], "k3s-standin: kube-apiserver ready", 8*time.Minute)
	ready := s.ready(t, start, 8*time.Minute, "lab-server", "lab-agent")
	nodes := s.kubectl(t, "get", "nodes", "-o", "wide")
	machines := s.kubectl(t, "get", "machines")
	t.Logf("kubectl get nodes:\n%s\nkubectl get machines:\n%s", nodes, machines)
	for _, name := range []string{"lab-server", "lab-agent"} {
		if !strings.Contains(nodes, name) || !strings.Contains(machines, name) {
			t.Errorf("kubectl does not show %s", name)
		}
		m, _ := s.lc.Machine(t.Context(), name)
		if m.Status.Hardware.System.Vendor != "QEMU" || m.Status.Release.Slot != "A" || m.Status.Release.Version != releaseA {
			t.Errorf("%s: hardware %+v, release %+v", name, m.Status.Hardware.System, m.Status.Release)
		}
	}
	if c, err := s.lc.Cluster(t.Context()); err != nil || c.Spec.Version != releaseA {
		t.Errorf("the Cluster bootstrap made: %+v, %v", c, err)
	}
	if !strings.Contains(vms["lab-server"].Console(), `"msg":"bootstrap: done"`) {
		t.Errorf("no bootstrap on the server's console")
	}
	// The agent renders k3s's configuration as init did: nothing to restart k3s for.
	if c := vms["lab-server"].Console(); strings.Contains(c, "k3s configuration changed") {
		t.Errorf("the server's agent restarted k3s after boot: its k3s configuration differs from init's")
	}
	if strings.Contains(vms["lab-agent"].Console(), "liken.test.api") {
		t.Errorf("the agent was given the test's API server")
	}

	// A sysctl edit applies live on the agent: no reboot, nothing pending.
	edited := time.Now()
	m, err := s.lc.Machine(t.Context(), "lab-agent")
	if err != nil {
		t.Fatal(err)
	}
	if m.Spec.Sysctls == nil {
		m.Spec.Sysctls = v1alpha1.Sysctls{}
	}
	m.Spec.Sysctls["vm.swappiness"] = "13"
	if m, err = s.lc.UpdateMachine(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	gen := m.Generation
	err = wait.PollUntilContextTimeout(t.Context(), time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := s.lc.Machine(ctx, "lab-agent")
		return err == nil && m.Status.AppliedGeneration >= gen && len(m.Status.Pending) == 0, nil
	})
	if err != nil {
		t.Fatalf("the sysctl edit was not applied live on lab-agent: %v", err)
	}
	liveTook := time.Since(edited)
	if strings.Contains(vms["lab-agent"].Console(), "liken-init: reboot: ") {
		t.Errorf("lab-agent rebooted for a live change")
	}
	// The agent says what it applied, and how, in an Event (sent soon after, not before).
	var applied []string
	wait.PollUntilContextTimeout(t.Context(), time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		events, err := s.admin.CoreV1().Events(authority.EventNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=lab-agent"})
		applied = nil
		for _, e := range events.Items {
			if e.Reason == "Applied" {
				applied = append(applied, e.Message)
			}
		}
		return err == nil && slices.ContainsFunc(applied, func(m string) bool { return strings.Contains(m, "applied live") && strings.Contains(m, "sysctls") }), nil
	})
	if !slices.ContainsFunc(applied, func(m string) bool { return strings.Contains(m, "applied live") && strings.Contains(m, "sysctls") }) {
		t.Errorf("no Applied Event saying the sysctl edit was applied live on lab-agent within a minute; Applied Events: %q", applied)
	}
	// Bootstrap with a newer layer. An operator edits the Cluster, then builds the layers again
	// with one more Machine; the server boots with the new layer (a power cycle here), and
	// makes lab-agent-3 without touching what exists; lab-agent-3 then joins.
	extra := "sha256:" + strings.Repeat("e", 64)
	c, err := s.lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	c.Spec.Releases["2026.12.31-001"] = v1alpha1.Digest(extra)
	if c.Spec.Sysctls == nil {
		c.Spec.Sysctls = v1alpha1.Sysctls{}
	}
	c.Spec.Sysctls["vm.max_map_count"] = "262144"
	if _, err := s.lc.UpdateCluster(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	third := lab.Machine{Name: "lab-agent-3", Role: "agent", MAC: "52:54:00:12:34:03", PrivateMAC: "52:54:00:76:00:30", IP: "192.168.76.30"}
	if err := lab.WriteManifests(s.manifests, s.channel.guestURL, releaseA, s.channel.pins[releaseA], []lab.Machine{labServer, labAgent, third}); err != nil {
		t.Fatal(err)
	}
	docs, err := manifest.Load(s.manifests)
	if err != nil {
		t.Fatal(err)
	}
	newer := s.layers(t, docs)
	var stdout, stderr strings.Builder
	if code := cli.Run(t.Context(), []string{"install", "--layer-only", "--layer", newer.Layers[v1alpha1.RoleServer], "--layer-digest", newer.Digests[v1alpha1.RoleServer],
		"--disk", s.disks["lab-server"]}, &stdout, &stderr); code != 0 {
		t.Fatalf("liken install --layer-only: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	vms["lab-server"].Kill()
	rebooted := time.Now()
	vms["lab-server"] = s.boot(t, labServer, 2048)
	s.install(t, third, newer)
	vms["lab-agent-3"] = s.boot(t, third, 1024)
	back := s.ready(t, rebooted, 10*time.Minute, "lab-server", "lab-agent", "lab-agent-3")
	c, err = s.lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if c.Spec.Releases["2026.12.31-001"] != v1alpha1.Digest(extra) || c.Spec.Sysctls["vm.max_map_count"] != "262144" {
		t.Errorf("the operator's Cluster edits did not stand the server's boot with a newer layer: releases %v, sysctls %v", c.Spec.Releases, c.Spec.Sysctls)
	}
	if m, _ := s.lc.Machine(t.Context(), "lab-agent"); m.Spec.Sysctls["vm.swappiness"] != "13" {
		t.Errorf("lab-agent's edit did not stand: sysctls %v", m.Spec.Sysctls)
	}
	if !strings.Contains(vms["lab-server"].Console(), `"created":["Machine lab-agent-3"]`) {
		t.Errorf("bootstrap did not say it made only lab-agent-3")
	}
	report.Line("bootstrap with a newer layer (TCG): after the server's power cycle, server Ready %s, lab-agent-3 (new) Ready %s",
		back["lab-server"].Round(time.Second), back["lab-agent-3"].Round(time.Second))
	report.Line("cluster stands up by itself (TCG, 1 vCPU each, from QEMU start): server API ready %s, server Ready %s, agent Ready %s; a live sysctl edit applied in %s",
		apiUp.Round(time.Second), ready["lab-server"].Round(time.Second), ready["lab-agent"].Round(time.Second), liveTook.Round(time.Second))
}
