package kmod

import (
	"strings"
	"testing"
)

const depFile = `kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
`

func TestResolveOrdersDependenciesFirst(t *testing.T) {
	d, err := ParseDeps(strings.NewReader(depFile))
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Resolve("virtio_pci", "virtio_blk", "virtio-rng")
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, f := range got {
		if _, dup := pos[Name(f)]; dup {
			t.Errorf("%s listed twice", f)
		}
		pos[Name(f)] = i
	}
	for mod, deps := range map[string][]string{
		"virtio_pci": {"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev"},
		"virtio_blk": {"virtio", "virtio_ring"},
		"virtio":     {"virtio_ring"},
		"virtio_rng": {"virtio"},
	} {
		for _, dep := range deps {
			if pos[dep] > pos[mod] {
				t.Errorf("%s loads before its dependency %s: %v", mod, dep, got)
			}
		}
	}
	if len(got) != 7 {
		t.Errorf("resolved %d files, want 7: %v", len(got), got)
	}
	if _, err := d.Resolve("virtio_blk", "no_such_mod"); err == nil || !strings.Contains(err.Error(), "no_such_mod") {
		t.Errorf("a missing module: %v", err)
	}
}
