package agent

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/state"
)

// readyForTrials starts agent n1 on a boot control, Ready with nothing pending, and returns
// a reader of its state file.
func readyForTrials(t *testing.T) (*fixture, *fakeBoot, *sim, func() *state.State) {
	f := setup(t, map[string]v1alpha1.Role{"n1": v1alpha1.RoleAgent})
	boot := f.bootedOnClusterRelease(t)
	s := newSim(t, "n1", v1alpha1.RoleAgent)
	s.bootCtl = boot
	s.boot(t, f)
	s.start(t)
	f.waitFor(t, "n1", "Ready with nothing pending", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return condTrue(m, v1alpha1.MachineReady) && len(m.Status.Pending) == 0
	})
	return f, boot, s, stateOf(t, s)
}

// stateOf reads a sim's state file.
func stateOf(t *testing.T, s *sim) func() *state.State {
	return func() *state.State {
		got, err := state.Store{Dir: filepath.Join(s.dir, "state")}.Load()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
}

// TestNetworkChangeIsATrial: an approved change of spec.network reboots into a trial of the
// same slot, which alone boots with the new settings (state.BootSettings). A trial that
// misses its deadline leaves the machine on its last good settings, with the failure and
// init's reason in status and an Event, and the same settings are not tried again; other
// settings are, and a trial that passes makes them the last good ones.
func TestNetworkChangeIsATrial(t *testing.T) {
	f, boot, s, st := readyForTrials(t)
	good := st().GoodNetwork
	if good == nil {
		t.Fatal("a boot outside a trial recorded no last good network")
	}

	bad := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", Addresses: []string{"10.0.3.15/24"}}}}
	f.editMachine("n1", func(m *v1alpha1.Machine) { m.Spec.Network = bad })
	f.waitFor(t, "n1", "the network staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return hasPending(m, "machine.spec.network") })
	// Staged and not on trial, a boot keeps the last good network (a power cut now).
	if n, _, _ := st().BootSettings(false, "A", nil); state.NetworkHash(n) != state.NetworkHash(good.Network) {
		t.Fatalf("a boot outside a trial would run %+v", n)
	}
	approve(f, "n1")
	waitCount(t, "a reboot request", func() bool { return boot.lastReboot() != nil })
	if r := boot.lastReboot(); r.TrialSlot != "A" || r.TrialArgs != "" {
		t.Fatalf("reboot request %+v; want a trial of slot A, the arguments unchanged", r)
	}
	if at := st().Attempt; at == nil || at.Network != state.NetworkHash(bad) || at.FromNetwork != state.NetworkHash(good.Network) {
		t.Fatalf("the trial remembered: %+v", at)
	}

	// The trial boot runs the new settings and never reaches the API: init's deadline ends
	// it, and the boot after is on the last good settings.
	s.stop()
	boot.boot("boot-2", "A", true, "")
	if n, _, _ := st().BootSettings(true, "A", nil); state.NetworkHash(n) != state.NetworkHash(bad) {
		t.Fatalf("the trial boot would run %+v", n)
	}
	const why = "not found healthy within 3m0s; the API server https://10.0.2.2:6443 is unreachable on this boot's network (dial tcp 10.0.2.2:6443: connect: network is unreachable)"
	boot.lastRecord(func(r *state.BootRecord) { r.End, r.Message = state.EndHealthDeadline, why })
	boot.boot("boot-3", "A", false, "")
	reboots := boot.rebootCount()
	s.start(t)
	f.waitFor(t, "n1", "the failed network trial reported", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineUpgradeFailed)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonHealthDeadline &&
			strings.Contains(c.Message, "spec.network failed their trial") && strings.Contains(c.Message, "unreachable") &&
			hasPending(m, "machine.spec.network") && condTrue(m, v1alpha1.MachineReady)
	})
	if g := st().GoodNetwork; g == nil || state.NetworkHash(g.Network) != state.NetworkHash(good.Network) {
		t.Errorf("after the fallback the last good network is %+v", g)
	}
	if fn := st().FailedNetwork; fn == nil || fn.Args != state.NetworkHash(bad) {
		t.Errorf("failed network: %+v", fn)
	}
	waitCount(t, "a TrialFailed Event naming the network", func() bool {
		list, err := f.admin.CoreV1().Events(authority.EventNamespace).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=n1"})
		if err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Reason == "TrialFailed" && strings.Contains(e.Message, "spec.network") && strings.Contains(e.Message, "unreachable") {
				return true
			}
		}
		return false
	})
	// Not tried again, whatever is approved, until spec.network changes. The status of the
	// approval's generation is the agent's decision (a reboot is taken within the pass that
	// writes it), and None asks the coordinator for no turn.
	approve(f, "n1")
	f.waitFor(t, "n1", "the approval taken in, and no reboot asked for the failed network", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootNone && strings.Contains(m.Status.Reboot.Message, "machine.spec.network failed a trial here")
	})
	if boot.rebootCount() != reboots {
		t.Fatalf("a network that failed its trial rebooted the machine again: %+v", boot.lastReboot())
	}
	// A disk k3s does not need, added meanwhile, waits with the failed network: the two boot
	// together, and status says so rather than blame the disk.
	data := v1alpha1.Disk{Device: "/dev/disk/by-id/virtio-data", Partitions: []v1alpha1.Partition{{Label: "data", Filesystem: "ext4", MountPoint: "/var/mnt/data"}}}
	f.editMachine("n1", func(m *v1alpha1.Machine) { m.Spec.Disks = []v1alpha1.Disk{data} })
	f.waitFor(t, "n1", "the disk waiting with the failed network", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.disks") && m.Status.Reboot.State == v1alpha1.RebootNone &&
			strings.Contains(m.Status.Reboot.Message, "machine.spec.network failed a trial here") &&
			strings.Contains(m.Status.Reboot.Message, "machine.spec.disks waits with the settings whose trial failed")
	})
	if boot.rebootCount() != reboots {
		t.Fatalf("the machine rebooted for a disk that waits with the failed network: %+v", boot.lastReboot())
	}

	// Other settings are tried, and commit.
	fixed := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true, MTU: 1400}}}
	f.editMachine("n1", func(m *v1alpha1.Machine) { m.Spec.Network, m.Spec.Reboot = fixed, nil })
	f.waitFor(t, "n1", "the new network staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.network") && !condTrue(m, v1alpha1.MachineUpgradeFailed)
	})
	n := boot.rebootCount()
	approve(f, "n1")
	waitCount(t, "the second trial's reboot", func() bool { return boot.rebootCount() == n+1 })
	if r := boot.lastReboot(); r.TrialSlot != "A" {
		t.Fatalf("reboot request %+v; want a trial", r)
	}
	s.stop()
	boot.boot("boot-4", "A", true, "")
	// The agent takes in the trial boot, and stops before it commits (its Node still reports
	// the boot before); the trial is committed meanwhile, as when the agent stops between
	// committing and recording the new good settings. Its next start records them.
	s.kubeletLate = true
	s.start(t)
	waitCount(t, "the trial boot taken in", func() bool { return st().BootID == "boot-4" })
	s.stop()
	if err := boot.CommitTrial(t.Context()); err != nil {
		t.Fatal(err)
	}
	if g := st().GoodNetwork; g == nil || state.NetworkHash(g.Network) == state.NetworkHash(fixed) {
		t.Fatalf("the new network is the last good one before the agent recorded the commit: %+v", g)
	}
	s.kubeletLate = false
	s.start(t)
	defer s.stop()
	f.waitFor(t, "n1", "the network committed", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return len(m.Status.Pending) == 0 && condTrue(m, v1alpha1.MachineReady) && !condTrue(m, v1alpha1.MachineUpgradeFailed)
	})
	if !boot.get().Committed {
		t.Fatal("the trial was not committed")
	}
	if g := st().GoodNetwork; g == nil || state.NetworkHash(g.Network) != state.NetworkHash(fixed) {
		t.Errorf("after the commit the last good network is %+v", g)
	}
}

// TestK3sDataDiskChangeIsATrial: a disk added for k3s's data boots once as a trial, as a
// network change does; when the trial fails (init found no such disk, so k3s had nothing to
// start on), the boot after runs the last good disks, status says which settings failed and
// why, and they are not tried again. A change to a disk k3s does not need is no trial.
func TestK3sDataDiskChangeIsATrial(t *testing.T) {
	f, boot, s, st := readyForTrials(t)
	if g := st().GoodDisks; g == nil || len(g.Disks) != 0 {
		t.Fatalf("a boot outside a trial recorded last good disks %+v; want none", g)
	}

	k3sDisk := v1alpha1.Disk{Device: "/dev/disk/by-id/virtio-missing", Partitions: []v1alpha1.Partition{{Label: "k3s", Filesystem: "ext4", MountPoint: "/var/lib/rancher/k3s"}}}
	f.editMachine("n1", func(m *v1alpha1.Machine) { m.Spec.Disks = []v1alpha1.Disk{k3sDisk} })
	f.waitFor(t, "n1", "the disk staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return hasPending(m, "machine.spec.disks") })
	if _, d, _ := st().BootSettings(false, "A", nil); len(d) != 0 {
		t.Fatalf("a boot outside a trial would run disks %+v", d)
	}
	approve(f, "n1")
	waitCount(t, "a reboot request", func() bool { return boot.lastReboot() != nil })
	if r := boot.lastReboot(); r.TrialSlot != "A" {
		t.Fatalf("reboot request %+v; want a trial of slot A", r)
	}
	want := state.TrialHash(nil, []v1alpha1.Disk{k3sDisk})
	if at := st().Attempt; at == nil || at.Network != want {
		t.Fatalf("the trial remembered: %+v; want settings %s", at, want)
	}

	s.stop()
	boot.boot("boot-2", "A", true, "")
	if _, d, _ := st().BootSettings(true, "A", nil); len(d) != 1 {
		t.Fatalf("the trial boot would run disks %+v", d)
	}
	const why = "not found healthy within 3m0s; the API server https://10.0.2.2:6443 was reachable; data disks not ready: /dev/disk/by-id/virtio-missing: NotFound"
	boot.lastRecord(func(r *state.BootRecord) { r.End, r.Message = state.EndHealthDeadline, why })
	boot.boot("boot-3", "A", false, "")
	reboots := boot.rebootCount()
	s.start(t)
	f.waitFor(t, "n1", "the failed disk trial reported", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineUpgradeFailed)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonHealthDeadline &&
			strings.Contains(c.Message, "the disks of spec.disks that k3s's data needs failed their trial") && strings.Contains(c.Message, "NotFound") &&
			!strings.Contains(c.Message, "spec.network") && hasPending(m, "machine.spec.disks") && condTrue(m, v1alpha1.MachineReady)
	})
	if r := boot.get().Report; r == nil || len(r.Disks) != 0 {
		t.Errorf("the boot after the failed trial ran disks %+v; want the last good ones (none)", r)
	}
	// The status of the approval's generation is the agent's decision (see
	// TestNetworkChangeIsATrial).
	approve(f, "n1")
	f.waitFor(t, "n1", "the approval taken in, and no reboot asked for the failed disks", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootNone && strings.Contains(m.Status.Reboot.Message, "machine.spec.disks failed a trial here")
	})
	if boot.rebootCount() != reboots {
		t.Fatalf("disks that failed their trial rebooted the machine again: %+v", boot.lastReboot())
	}

	// A disk k3s does not need: no trial, and the next boot takes it.
	data := v1alpha1.Disk{Device: "/dev/disk/by-id/virtio-data", Partitions: []v1alpha1.Partition{{Label: "data", Filesystem: "ext4", MountPoint: "/var/mnt/data"}}}
	f.editMachine("n1", func(m *v1alpha1.Machine) { m.Spec.Disks, m.Spec.Reboot = []v1alpha1.Disk{data}, nil })
	f.waitFor(t, "n1", "the other disk staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.disks") && !condTrue(m, v1alpha1.MachineUpgradeFailed)
	})
	n := boot.rebootCount()
	approve(f, "n1")
	waitCount(t, "the reboot for the other disk", func() bool { return boot.rebootCount() == n+1 })
	if r := boot.lastReboot(); r.TrialSlot != "" {
		t.Fatalf("reboot request %+v; a disk k3s does not need is no trial", r)
	}
	s.stop()
	boot.boot("boot-4", "A", false, "")
	s.start(t)
	defer s.stop()
	f.waitFor(t, "n1", "the other disk applied", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return len(m.Status.Pending) == 0 && condTrue(m, v1alpha1.MachineReady) && len(m.Status.Disks) == 1 && m.Status.Disks[0].Phase == v1alpha1.DiskReady
	})
	if g := st().GoodDisks; g == nil || len(g.Disks) != 1 || g.Disks[0].Device != data.Device {
		t.Errorf("the last good disks are %+v", g)
	}
}

// serverNetworkTrial boots a server s1 and an agent a1, stages a new MTU on s1 and approves
// its reboot, then boots s1's trial with a1 away (its agent and k3s stopped): s1 is healthy
// on its own and waits for a peer, as status says. peerWait is s1's agent's PeerWait.
func serverNetworkTrial(t *testing.T, peerWait time.Duration) (f *fixture, boot *fakeBoot, s1, a1 *sim, mtu *v1alpha1.MachineNetwork) {
	f = setup(t, map[string]v1alpha1.Role{"s1": v1alpha1.RoleServer, "a1": v1alpha1.RoleAgent})
	boot = f.bootedOnClusterRelease(t)
	s1, a1 = newSim(t, "s1", v1alpha1.RoleServer), newSim(t, "a1", v1alpha1.RoleAgent)
	s1.bootCtl, s1.peerWait = boot, peerWait
	for _, s := range []*sim{s1, a1} {
		s.boot(t, f)
		s.start(t)
		f.waitFor(t, s.name, "Ready with nothing pending", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return condTrue(m, v1alpha1.MachineReady) && len(m.Status.Pending) == 0
		})
	}
	t.Cleanup(a1.stop)
	st := stateOf(t, s1)
	mtu = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true, MTU: 1400}}}
	f.editMachine("s1", func(m *v1alpha1.Machine) { m.Spec.Network = mtu })
	f.waitFor(t, "s1", "the network staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return hasPending(m, "machine.spec.network") })
	approve(f, "s1")
	waitCount(t, "a reboot request", func() bool { return boot.lastReboot() != nil })
	if at := st().Attempt; at == nil || len(at.Peers) != 1 || at.Peers[0] != "a1" {
		t.Fatalf("the trial remembered: %+v; want it to wait for peer a1", at)
	}

	// The trial boot, with the agent machine away (its agent and its k3s stopped): s1 is
	// Ready, and does not commit.
	s1.stop()
	a1.stop()
	if err := a1.k3s.Stop(); err != nil {
		t.Fatal(err)
	}
	boot.boot("boot-2", "A", true, "")
	s1.start(t)
	t.Cleanup(s1.stop)
	waiting := func(m *v1alpha1.Machine) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeTrial && strings.Contains(m.Status.Upgrade.Message, "none of a1 renewed its Node Lease") &&
			strings.Contains(m.Status.Upgrade.Message, "the trial ends if none has within")
	}
	f.waitFor(t, "s1", "the trial waiting for a peer, said in status", func(m *v1alpha1.Machine, n *corev1.Node) bool {
		return kube.NodeReady(n) && waiting(m)
	})
	// The pass that said so may be the first look at a1's Lease, which only notes it: a
	// pass after it looked again, and found it not renewed.
	s1.reconciled(t, "the trial waiting for a peer, in status", func(m *v1alpha1.Machine, _ *v1alpha1.Cluster, _ *corev1.Node) bool { return waiting(m) })
	if boot.get().Committed {
		t.Fatal("the server's network trial committed with no other machine reaching it")
	}
	return f, boot, s1, a1, mtu
}

// TestServerNetworkTrialWaitsForAPeer: a server's agent reaches its own k3s over loopback,
// so its trial of new network settings commits only once another machine that was Ready
// reaches it (its kubelet renews its Node Lease through it): while the agent machine is
// away, the trial waits, and says so.
func TestServerNetworkTrialWaitsForAPeer(t *testing.T) {
	_, boot, s1, a1, mtu := serverNetworkTrial(t, 0)
	st := stateOf(t, s1)
	// The agent machine comes back and reaches the server: the trial commits.
	if _, err := a1.k3s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	a1.start(t)
	waitCount(t, "the trial committed", func() bool { return boot.get().Committed })
	// The agent records the new good network right after it commits.
	waitCount(t, "the new network recorded as the last good one", func() bool {
		g := st().GoodNetwork
		return g != nil && state.NetworkHash(g.Network) == state.NetworkHash(mtu) && st().Attempt == nil
	})
}

// TestServerNetworkTrialEndsWhenNoPeerReachesIt: healthy on its own, a server's network
// trial that no peer reaches within the agent's PeerWait ends then, not at init's deadline:
// the boot log and an Event say no peer reached it, and back on the last good boot the
// failure's reason is PeersUnreachable, naming the peer it waited for.
func TestServerNetworkTrialEndsWhenNoPeerReachesIt(t *testing.T) {
	// 10 s: serverNetworkTrial watches two passes of the wait (2 s apart) before it ends,
	// with room for a host several times slower.
	f, boot, s1, _, _ := serverNetworkTrial(t, 10*time.Second)
	waitCount(t, "the trial ended by the agent", func() bool { return boot.rebootCount() == 2 }) // the first: the approved reboot
	last := boot.get().Boots
	if r := last[len(last)-1]; r.End != state.EndPeersUnreachable || !strings.Contains(r.Message, "none of a1 renewed its Node Lease") || !strings.Contains(r.Message, "in 10s of being healthy itself") {
		t.Errorf("the trial's boot record: %+v", r)
	}
	if boot.get().Committed {
		t.Fatal("a trial no peer reached was committed")
	}
	waitCount(t, "a PeersUnreachable Event on s1", func() bool {
		evs, err := f.admin.CoreV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=s1,reason=" + v1alpha1.ReasonPeersUnreachable})
		return err == nil && len(evs.Items) > 0 && strings.Contains(evs.Items[0].Message, "falls back to its last good network")
	})
	// The next boot is the last good one (init armed no trial): the failure is reported.
	s1.stop()
	boot.bootAsArmed("boot-3")
	s1.start(t)
	f.waitFor(t, "s1", "UpgradeFailed with PeersUnreachable, naming a1", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineUpgradeFailed)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonPeersUnreachable && strings.Contains(c.Message, "none of a1 renewed") &&
			!strings.Contains(c.Message, "the agent was waiting")
	})
}
