package agent

import (
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"liken.dev/liken/api/v1alpha1"
)

// TestStatusFollowsTheInventory: status.network and status.hardware follow the machine as
// it changes (here a link that goes down); the readings are the host side of the test.
func TestStatusFollowsTheInventory(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"i1": v1alpha1.RoleAgent})
	var state atomic.Value
	state.Store("up")
	i1 := newSim(t, "i1", v1alpha1.RoleAgent)
	i1.inventory = func() (*v1alpha1.Hardware, *v1alpha1.NetworkStatus) {
		return &v1alpha1.Hardware{Disks: []v1alpha1.DiskInfo{{Name: "vda", Partitions: []v1alpha1.PartitionInfo{{Name: "vda5", MountPoint: "/var", FreeBytes: 1 << 30}}}}},
			&v1alpha1.NetworkStatus{Links: []v1alpha1.LinkInfo{{Name: "eth0", Kind: "port", State: state.Load().(string), Addresses: []string{"192.0.2.10/24"}}}}
	}
	i1.boot(t, f)
	i1.start(t)
	defer i1.stop()
	f.waitFor(t, "i1", "eth0 up in status", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		n := m.Status.Network
		return n != nil && len(n.Links) == 1 && n.Links[0].State == "up" && m.Status.Hardware != nil && m.Status.Hardware.Disks[0].Partitions[0].MountPoint == "/var"
	})
	state.Store("down")
	f.waitFor(t, "i1", "eth0 down in status", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		n := m.Status.Network
		return n != nil && len(n.Links) == 1 && n.Links[0].State == "down"
	})
}
