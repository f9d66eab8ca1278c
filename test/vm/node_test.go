package vm

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/qemu"
	"liken.dev/liken/test/apiserver"
	"liken.dev/liken/test/report"
)

// vmMachine is a server on QEMU's user network: the host, and so the test's API server, is
// 10.0.2.2.
const vmMachine = `apiVersion: liken.dev/v1alpha1
kind: Machine
metadata:
  name: vm-1
spec:
  role: server
  match:
    macs: ["52:54:00:12:34:01"]
  network:
    interfaces:
      - name: eth0
        mac: "52:54:00:12:34:01"
        addresses: ["10.0.2.15/24"]
    routes:
      - to: 0.0.0.0/0
        via: 10.0.2.2
    dns:
      nameservers: ["10.0.2.3"]
  nodeLabels:
    example.com/booted-by: liken
`

// joined is a cluster whose API server runs on the host, on the cluster's own identity,
// reached from each guest at 10.0.2.2, with its machines' disks installed.
type joined struct {
	env      *apiserver.Env
	admin    kubernetes.Interface
	lc       *kube.Client
	disk     string            // the first machine's disk (vm-1's)
	disks    map[string]string // every machine's disk, by name
	guestAPI string
	channel  *channelServer
	// layerDigests are each role's layer digest, as liken layer prints it.
	layerDigests map[v1alpha1.Role]string
}

// joinCluster sets up the API server, the Cluster, Machine vm-1 and its RBAC, and installs
// vm-1's disk with extraArgs on every boot's kernel command line. The Cluster's channel is
// served over HTTP from the host and pins the installed release (and any others given).
func joinCluster(t *testing.T, extraArgs string, moreVersions ...string) *joined {
	t.Helper()
	return joinClusterOn(t, 512, extraArgs, moreVersions...)
}

// joinClusterOn is joinCluster with vm-1's disk of sectorSize-byte logical sectors.
func joinClusterOn(t *testing.T, sectorSize int, extraArgs string, moreVersions ...string) *joined {
	t.Helper()
	return joinMachines(t, apiserver.Options{}, sectorSize, []string{vmMachine}, extraArgs, moreVersions...)
}

// joinAs is joinCluster with vm-1's manifest given.
func joinAs(t *testing.T, machineYAML, extraArgs string, moreVersions ...string) *joined {
	t.Helper()
	return joinMachines(t, apiserver.Options{}, 512, []string{machineYAML}, extraArgs, moreVersions...)
}

// joinMachines is joinCluster for the machines given (the first one's disk is j.disk), with
// the API server started with opts (the cluster's CAs are added).
func joinMachines(t *testing.T, opts apiserver.Options, sectorSize int, machineYAMLs []string, extraArgs string, moreVersions ...string) *joined {
	t.Helper()
	j, res, machines := prepareJoin(t, opts, machineYAMLs, moreVersions...)
	perRole := map[v1alpha1.Role]int{}
	for _, m := range machines {
		perRole[m.Spec.Role]++
	}
	for _, m := range machines {
		// A machine alone in its role's layer finds its Machine by MAC; several are each
		// bound to theirs (install refuses to put several machines' keys on one disk).
		bound := ""
		if perRole[m.Spec.Role] > 1 {
			bound = m.Name
		}
		d := filepath.Join(t.TempDir(), m.Name+".img")
		target, size, done := installTarget(t, d, testLayout.MinSizeMiB()+16, sectorSize)
		if _, err := install.Install(context.Background(), install.Options{
			Channel: "file://" + j.channel.dir, Pin: j.channel.pins[releaseA], Layer: res.Layers[m.Spec.Role], LayerDigest: res.Digests[m.Spec.Role], Disk: target, Machine: bound,
			SizeMiB: size, Layout: testLayout, KernelArgs: qemu.InstallArgs(false, "quiet liken.test.api="+j.guestAPI+" "+extraArgs),
		}); err != nil {
			t.Fatal(err)
		}
		done()
		j.disks[m.Name] = d
	}
	j.disk = j.disks["vm-1"]
	return j
}

// prepareJoin is joinMachines without the installs: the signed channel, the layers, the API
// server with the Cluster and the Machines; it returns the layers and the Machines.
func prepareJoin(t *testing.T, opts apiserver.Options, machineYAMLs []string, moreVersions ...string) (*joined, *identity.Result, []*v1alpha1.Machine) {
	t.Helper()
	ch := newChannelServer(t, append([]string{releaseA}, moreVersions...)...)
	manifests := t.TempDir()
	ex, _ := os.ReadFile(filepath.Join("..", "..", "docs", "examples", "cluster.yaml"))
	// The layers name the test's channel and its signed root, as an operator's name theirs:
	// install checks the release against that root.
	ex = regexp.MustCompile(`(?m)^  channelRoot: .*$`).ReplaceAll(ex, []byte("  channelRoot: "+ch.root))
	ex = regexp.MustCompile(`(?m)^  channel: .*$`).ReplaceAll(ex, []byte("  channel: "+ch.guestURL))
	os.WriteFile(filepath.Join(manifests, "cluster.yaml"), ex, 0o644)
	for i, y := range machineYAMLs {
		os.WriteFile(filepath.Join(manifests, fmt.Sprintf("machine-%d.yaml", i)), []byte(y), 0o644)
	}
	docs, err := manifest.Load(manifests)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	idDir := filepath.Join(out, "identity")
	if _, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: idDir, OutDir: out, StandInNodeCredentials: true, Server: "https://10.0.2.15:6443"}); err != nil {
		t.Fatal(err)
	}
	id, err := identity.LoadOrCreateIdentity(idDir)
	if err != nil {
		t.Fatal(err)
	}
	opts.ServerCA, opts.ClientCA = id.CAs["server-ca"], id.CAs["client-ca"]
	env, err := apiserver.Start(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Stop)
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: idDir, OutDir: out, StandInNodeCredentials: true, Server: "https://10.0.2.15:6443"})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := manifest.NewValidator()
	set := manifest.CheckSet(v, docs)
	var names, servers []string
	for _, m := range set.Machines {
		names = append(names, m.Name)
		if m.Spec.Role == v1alpha1.RoleServer {
			servers = append(servers, m.Name)
		}
	}
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	if err := authority.Install(t.Context(), admin, names...); err != nil {
		t.Fatal(err)
	}
	// Servers' agents run the reboot coordinator, which grants the turns, and bootstrap
	// (which finds the Cluster and Machines the test makes below).
	if err := authority.InstallServers(t.Context(), admin, servers...); err != nil {
		t.Fatal(err)
	}
	if err := authority.InstallBootstrap(t.Context(), admin); err != nil {
		t.Fatal(err)
	}
	// The example Cluster's registry settings name these Secrets; the agent in the VM reads them.
	for name, data := range map[string]map[string]string{
		"registry-mirror-credentials": {"username": "liken", "password": "s3cret"},
		"registry-mirror-ca":          {"ca.crt": "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"},
	} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.SecretNamespace}, StringData: data}
		if _, err := admin.CoreV1().Secrets(v1alpha1.SecretNamespace).Create(t.Context(), sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lc, _ := kube.NewClient(env.Admin)
	set.Cluster.ResourceVersion = ""
	set.Cluster.Spec.Channel, set.Cluster.Spec.ChannelRoot = ch.guestURL, v1alpha1.Digest(ch.root)
	set.Cluster.Spec.Releases = map[string]v1alpha1.Digest{}
	for v, pin := range ch.pins {
		set.Cluster.Spec.Releases[v] = v1alpha1.Digest(pin)
	}
	set.Cluster.Spec.Version = releaseA
	if _, err := lc.CreateCluster(t.Context(), set.Cluster); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(env.Host)
	guestAPI := "https://10.0.2.2:" + u.Port()
	j := &joined{env: env, admin: admin, lc: lc, disks: map[string]string{}, guestAPI: guestAPI, channel: ch, layerDigests: res.Digests}
	for _, m := range set.Machines {
		if _, err := lc.CreateMachine(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	return j, res, set.Machines
}

// vmMachineDHCP is vm-1 configured by DHCP: QEMU's user network runs a DHCP server that
// leases 10.0.2.15 with the host, 10.0.2.2, as the router.
const vmMachineDHCP = `apiVersion: liken.dev/v1alpha1
kind: Machine
metadata:
  name: vm-1
spec:
  role: server
  match:
    macs: ["52:54:00:12:34:01"]
  network:
    interfaces:
      - name: eth0
        mac: "52:54:00:12:34:01"
        dhcp: true
  nodeLabels:
    example.com/booted-by: liken
`

// TestInstalledMachineJoinsTheAPI installs a machine configured by DHCP, boots it, and
// watches it from a real API server on the host running on the cluster's own identity: the
// k3s stand-in in the VM registers the Node and keeps it Ready, and the agent in the VM
// reports the machine's hardware and applies its node label.
func TestInstalledMachineJoinsTheAPI(t *testing.T) {
	vmTest(t)
	j := joinAs(t, vmMachineDHCP, "")
	admin, lc, d := j.admin, j.lc, j.disk
	vm := bootUEFI(t, d, false, "52:54:00:12:34:01")
	defer vm.Kill()
	expect(t, vm, "liken-init: this is Machine vm-1 (server, found by MAC 52:54:00:12:34:01)", 180*time.Second)

	var nodeReady, machineReady time.Duration
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, firstBoot, true, func(ctx context.Context) (bool, error) {
		if nodeReady == 0 {
			if n, err := admin.CoreV1().Nodes().Get(ctx, "vm-1", metav1.GetOptions{}); err == nil {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
						nodeReady = time.Since(vm.start)
					}
				}
			}
		}
		m, err := lc.Machine(ctx, "vm-1")
		if err != nil {
			return false, nil
		}
		if machineReady == 0 && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady) && m.Status.Hardware != nil {
			machineReady = time.Since(vm.start)
		}
		return nodeReady > 0 && machineReady > 0, nil
	})
	if err != nil {
		m, _ := lc.Machine(t.Context(), "vm-1")
		t.Fatalf("the machine never became Ready in the API (node after %s, machine after %s); status %+v", nodeReady, machineReady, m.Status)
	}
	m, _ := lc.Machine(t.Context(), "vm-1")
	if m.Status.Hardware.System.Vendor != "QEMU" || m.Status.Hardware.CPU.Threads != int32(DefaultSpeed().CPUs) {
		t.Errorf("hardware reported from inside the VM: %+v", m.Status.Hardware)
	}
	if got, want := m.Status.Release.LayerDigest, j.layerDigests[v1alpha1.RoleServer]; got != want {
		t.Errorf("status.release.layerDigest = %q; want the layer's digest as built, %s", got, want)
	}
	if !strings.Contains(vm.Console(), "layer unpacked (") || !strings.Contains(vm.Console(), "as built "+j.layerDigests[v1alpha1.RoleServer]) {
		t.Errorf("init did not say it checked the layer against the digests install recorded")
	}
	n, _ := admin.CoreV1().Nodes().Get(t.Context(), "vm-1", metav1.GetOptions{})
	if n.Labels["example.com/booted-by"] != "liken" {
		t.Errorf("the agent in the VM did not apply the node label: %v", n.Labels)
	}
	if !strings.Contains(vm.Console(), "liken-init: eth0: DHCP lease 10.0.2.15/24 from 10.0.2.2") {
		t.Errorf("no DHCP lease from QEMU's DHCP server on the console")
	}
	if !strings.Contains(vm.Console(), `"msg":"bootstrap: done"`) {
		t.Errorf("no bootstrap on the console (the server's agent makes the Cluster and Machines where absent)")
	}
	if !strings.Contains(vm.Console(), "liken-init: started k3s") {
		t.Errorf("no k3s start on the console")
	}
	// The host checks k3s needs passed on the project's image: init's before k3s started,
	// the stand-in's (with iptables through the PATH k3s builds) as it started, and init's
	// check of k3s's PATH once k3s ran from its data directory.
	for _, line := range []string{"liken-init: preflight passed (4 checks)", "k3s-standin: preflight passed (5 checks)",
		"liken-init: preflight: iptables through k3s's PATH: ok", "liken-init: made this machine's ID"} {
		if !strings.Contains(vm.Console(), line) {
			t.Errorf("no %q on the console", line)
		}
	}
	made := regexp.MustCompile(`liken-init: made this machine's ID ([0-9a-f]{32}) `).FindStringSubmatch(vm.Console())
	if id := n.Status.NodeInfo.MachineID; made == nil || id != made[1] {
		t.Errorf("the Node's machine ID %q is not the one init made (/etc/machine-id): %q", id, made)
	}
	// The disks' partitions and the links, as the machine has them.
	var state *v1alpha1.PartitionInfo
	for _, d := range m.Status.Hardware.Disks {
		for i, p := range d.Partitions {
			if p.Label == "liken-state" {
				state = &d.Partitions[i]
			}
		}
	}
	if state == nil || state.Filesystem != "ext4" || state.MountPoint != "/var" || state.FreeBytes <= 0 || state.FreeBytes > state.SizeBytes {
		t.Errorf("status.hardware does not show the state partition mounted on /var: %+v", m.Status.Hardware.Disks)
	}
	eth0 := false
	if n := m.Status.Network; n != nil {
		for _, l := range n.Links {
			eth0 = eth0 || (l.Name == "eth0" && l.Kind == "port" && l.State == "up" && slices.Contains(l.Addresses, "10.0.2.15/24"))
		}
	}
	if !eth0 {
		t.Errorf("status.network does not show eth0 up with its DHCP address: %+v", m.Status.Network)
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineDegraded); c == nil || c.Reason == v1alpha1.ReasonPreflightFailed {
		t.Errorf("Degraded: %+v", c)
	}
	// Init started k3s without the registry credentials (they live in the API); the agent
	// rendered them in and restarted k3s in place once. Counted where init's supervisor
	// starts k3s: a registration is no count of starts (beside other tests, the first k3s
	// was once restarted before it had registered). Ready can come before the restart, so
	// wait for the second start and the agent's word that it restarted k3s, then give a
	// needless third start time to show itself.
	starts := func() int { return strings.Count(vm.Console(), "INFO started process=k3s ") }
	// Bound: seconds when the machine runs alone; beside other tests on a loaded host the
	// restart once came more than a minute after Ready.
	_ = wait.PollUntilContextTimeout(t.Context(), time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		return starts() >= 2 && strings.Contains(vm.Console(), `"msg":"k3s restarted in place"`), nil
	})
	time.Sleep(5 * time.Second)
	if c := starts(); c != 2 {
		t.Errorf("k3s started %d times; want 2 (boot, then one restart for the registry credentials)", c)
	}
	report.Line("installed VM joins the API (TCG, from QEMU start): Node Ready %s, Machine Ready with hardware %s", nodeReady.Round(time.Second), machineReady.Round(time.Second))
}
