package state

import (
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/host/k3s"
)

func TestBootSettings(t *testing.T) {
	good := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
	bad := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", Addresses: []string{"10.0.3.15/24"}}}}
	staged := func(n *v1alpha1.MachineNetwork) *change.Spec {
		return &change.Spec{Machine: v1alpha1.MachineSpec{Network: n}}
	}
	armed := &Attempt{Slot: "A", Network: NetworkHash(bad), FromNetwork: NetworkHash(good), BootID: "b1"}
	// The trial after b1 committed, and the agent stopped before it recorded the new good
	// settings: the boot log alone says so.
	committed := []BootRecord{{ID: "b1", Slot: "A", Armed: "A"}, {ID: "b2", Slot: "A", Trial: true, Reached: ReachedCommitted}, {ID: "b3", Slot: "A"}}
	failed := []BootRecord{{ID: "b1", Slot: "A", Armed: "A"}, {ID: "b2", Slot: "A", Trial: true, Reached: "k3s", End: EndHealthDeadline}, {ID: "b3", Slot: "A"}}
	for _, tc := range []struct {
		name  string
		st    State
		trial bool
		slot  string
		boots []BootRecord
		want  *v1alpha1.MachineNetwork
	}{
		{"nothing staged", State{}, false, "A", nil, nil},
		{"no good network known (older state)", State{Staged: staged(bad)}, false, "A", nil, bad},
		{"staged is the good one", State{Staged: staged(good), GoodNetwork: &GoodNetwork{good}}, false, "A", nil, good},
		{"staged, not on trial (a power cut)", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: armed}, false, "A", nil, good},
		{"the trial armed for it", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: armed}, true, "A", nil, bad},
		{"a trial of another slot", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: armed}, true, "B", nil, good},
		{"a trial armed for other settings", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: &Attempt{Slot: "A", Network: "sha256:other"}}, true, "A", nil, good},
		{"after the trial committed, by the boot log", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: armed}, false, "A", committed, bad},
		{"after the trial failed, by the boot log", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: armed}, false, "A", failed, good},
		{"a trial armed for no network", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: &Attempt{Slot: "A"}}, true, "A", nil, good},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, disks, how := tc.st.BootSettings(tc.trial, tc.slot, tc.boots)
			if NetworkHash(got) != NetworkHash(tc.want) || len(disks) != 0 || how == "" {
				t.Errorf("got %+v (%s), want %+v", got, how, tc.want)
			}
		})
	}
}

func TestNeedsTrial(t *testing.T) {
	for _, tc := range []struct {
		mount string
		want  bool
	}{
		{"/var/lib/rancher/k3s", true},
		{"/var/lib/rancher/k3s/", true},
		{"/var/lib/rancher", true},
		{"/var/lib", true},
		{"/var", true},
		{"/var/lib/rancher/k3s/agent/containerd", true},
		{"/var/lib/kubelet", true},
		{"/var/lib/kubelet/pods", true},
		{"/var/lib/rancher-data", false},
		{"/var/lib/kubelets", false},
		{"/var/mnt/data", false},
		{"", false},
	} {
		d := v1alpha1.Disk{Device: "/dev/vdb", Partitions: []v1alpha1.Partition{{Label: "a", Size: "1Gi"}, {Label: "b", MountPoint: tc.mount}}}
		if got := NeedsTrial(d); got != tc.want {
			t.Errorf("NeedsTrial(mount %q) = %v, want %v", tc.mount, got, tc.want)
		}
	}
	if k3s.DefaultPaths.DataDir != k3sData[0] {
		t.Errorf("k3s's data-dir is %s, the trial rule watches %s", k3s.DefaultPaths.DataDir, k3sData[0])
	}
}

// TestBootSettingsOfDisks: a change to a disk k3s's data needs is tried only in the trial
// armed for it, as a network change is; any other disk change is taken at the next boot.
func TestBootSettingsOfDisks(t *testing.T) {
	data := v1alpha1.Disk{Device: "/dev/disk/by-id/virtio-data", Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: "/var/mnt/data"}}}
	data2 := v1alpha1.Disk{Device: "/dev/disk/by-id/virtio-data", Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: "/var/mnt/other"}}}
	k3sDisk := v1alpha1.Disk{Device: "/dev/disk/by-id/virtio-fast", Partitions: []v1alpha1.Partition{{Label: "k3s", MountPoint: "/var/lib/rancher/k3s"}}}
	staged := func(d ...v1alpha1.Disk) *change.Spec { return &change.Spec{Machine: v1alpha1.MachineSpec{Disks: d}} }
	good := &GoodDisks{[]v1alpha1.Disk{data}}
	armed := &Attempt{Slot: "A", Network: TrialHash(nil, []v1alpha1.Disk{data, k3sDisk}), FromNetwork: TrialHash(nil, good.Disks)}
	for _, tc := range []struct {
		name  string
		st    State
		trial bool
		want  []v1alpha1.Disk
	}{
		{"no good disks known (older state)", State{Staged: staged(data, k3sDisk)}, false, []v1alpha1.Disk{data, k3sDisk}},
		{"a disk k3s does not need, changed", State{Staged: staged(data2), GoodDisks: good}, false, []v1alpha1.Disk{data2}},
		{"a disk for k3s's data, not on trial", State{Staged: staged(data, k3sDisk), GoodDisks: good, Attempt: armed}, false, good.Disks},
		{"a disk for k3s's data, the trial armed for it", State{Staged: staged(data, k3sDisk), GoodDisks: good, Attempt: armed}, true, []v1alpha1.Disk{data, k3sDisk}},
		{"a disk for k3s's data, a trial armed for the network alone", State{Staged: staged(data, k3sDisk), GoodDisks: good, Attempt: &Attempt{Slot: "A", Network: NetworkHash(nil)}}, true, good.Disks},
		{"the disk for k3s's data removed, not on trial", State{Staged: staged(data), GoodDisks: &GoodDisks{[]v1alpha1.Disk{data, k3sDisk}}}, false, []v1alpha1.Disk{data, k3sDisk}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, got, how := tc.st.BootSettings(tc.trial, "A", nil)
			if TrialHash(nil, got) != TrialHash(nil, tc.want) || !sameDisks(got, tc.want) || how == "" {
				t.Errorf("got %+v (%s), want %+v", got, how, tc.want)
			}
		})
	}
}

func sameDisks(a, b []v1alpha1.Disk) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Device != b[i].Device || a[i].Partitions[0].MountPoint != b[i].Partitions[0].MountPoint {
			return false
		}
	}
	return true
}
