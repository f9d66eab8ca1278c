package vm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"liken.dev/liken/api/v1alpha1"
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
}

type standaloneSpec = lab.Machine

func standaloneFleet(t *testing.T, machines ...standaloneSpec) *standalone {
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
		private: fmt.Sprintf("230.0.0.1:%d", 20000+rand.IntN(10000))}
	out := t.TempDir()
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(out, "identity"), OutDir: out,
		StandInNodeCredentials: true, Server: fmt.Sprintf("https://127.0.0.1:%d", s.apiPort)})
	if err != nil {
		t.Fatal(err)
	}
	s.kubeconfig = res.Kubeconfig
	for _, m := range machines {
		d := filepath.Join(t.TempDir(), m.Name+".img")
		// A server's state partition holds etcd, whose write-ahead log alone takes 64 MiB.
		// The image is sparse: only what is written takes room on the host.
		size := testLayout.MinSizeMiB() + 16
		if m.Role == "server" {
			size += 512
		}
		if _, err := install.Install(context.Background(), install.Options{
			Channel: "file://" + ch.dir, Pin: ch.pins[releaseA], Layer: res.Layers[v1alpha1.Role(m.Role)], LayerDigest: res.Digests[v1alpha1.Role(m.Role)],
			Disk: d, SizeMiB: size, Layout: testLayout, KernelArgs: "quiet",
		}); err != nil {
			t.Fatal(err)
		}
		s.disks[m.Name] = d
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

// boot starts a machine of the fleet; the server's API is forwarded to the host.
func (s *standalone) boot(t *testing.T, m standaloneSpec, memMiB int) *VM {
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
	labServer = standaloneSpec{Name: "lab-server", Role: "server", MAC: "52:54:00:12:34:01", PrivateMAC: "52:54:00:76:00:10", IP: "192.168.76.10"}
	labAgent  = standaloneSpec{Name: "lab-agent", Role: "agent", MAC: "52:54:00:12:34:02", PrivateMAC: "52:54:00:76:00:20", IP: "192.168.76.20"}
)

// TestClusterStandsUpByItself: from a stand-in release and the layers liken layer builds, a
// server and an agent boot with no API server on the host. The server runs the control
// plane, bootstrap makes the Cluster and Machines from its layer, the agent joins over the
// private network, and through the layer's admin kubeconfig kubectl shows both Nodes and
// both Machines with their hardware and slot. A sysctl edit then applies live on the agent.
func TestClusterStandsUpByItself(t *testing.T) {
	s := standaloneFleet(t, labServer, labAgent)
	start := time.Now()
	vms := map[string]*VM{
		"lab-server": s.boot(t, labServer, 2048),
		"lab-agent":  s.boot(t, labAgent, 1024),
	}
	apiUp := expect(t, vms["lab-server"], "k3s-standin: kube-apiserver ready", 8*time.Minute)
	ready := map[string]time.Duration{}
	err := wait.PollUntilContextTimeout(t.Context(), 2*time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, name := range []string{"lab-server", "lab-agent"} {
			if ready[name] > 0 {
				continue
			}
			n, err := s.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil || !kube.NodeReady(n) {
				continue
			}
			m, err := s.lc.Machine(ctx, name)
			if err == nil && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady) && m.Status.Hardware != nil && m.Status.Release != nil {
				ready[name] = time.Since(start)
			}
		}
		return len(ready) == 2, nil
	})
	if err != nil {
		t.Fatalf("the cluster did not come up by itself (Ready: %v)", ready)
	}
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
	if strings.Contains(vms["lab-agent"].Console(), "liken-init: reboot: ") {
		t.Errorf("lab-agent rebooted for a live change")
	}
	events, _ := s.admin.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=lab-agent"})
	var reasons []string
	for _, e := range events.Items {
		reasons = append(reasons, e.Reason)
	}
	t.Logf("lab-agent's Events: %v", reasons)
	report.Line("cluster stands up by itself (TCG, 1 vCPU each, from QEMU start): server API ready %s, server Ready %s, agent Ready %s; a live sysctl edit applied in %s",
		apiUp.Round(time.Second), ready["lab-server"].Round(time.Second), ready["lab-agent"].Round(time.Second), time.Since(edited).Round(time.Second))
}
