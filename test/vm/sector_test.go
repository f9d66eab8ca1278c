package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/internal/disk"
	"liken.dev/liken/test/report"
)

// TestDiskOf4096ByteSectors installs onto a disk whose logical sectors are 4096 bytes (a
// loop device made with --sector-size 4096 over an image file) and boots that image as such
// a disk (virtio-blk with logical_block_size=4096): the firmware finds GRUB on the ESP,
// GRUB and Linux read the slot, init mounts the state partition and starts k3s.
func TestDiskOf4096ByteSectors(t *testing.T) {
	img := filepath.Join(t.TempDir(), "4k.img")
	sizeMiB := testLayout.MinSizeMiB() + 16
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, int64(sizeMiB)<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--sector-size", "4096", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup --sector-size 4096: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	detached := false
	detach := func() {
		if !detached {
			exec.Command("losetup", "-d", loop).Run()
			detached = true
		}
	}
	defer detach()
	start := time.Now()
	installTo(t, loop, 0, "quiet liken.test=poweroff", "server-1", "server", nil)
	took := time.Since(start)
	detach()
	parts, err := disk.Read(img)
	if err != nil {
		t.Fatal(err)
	}
	if st := parts[disk.State]; st.SectorSize != 4096 || st.Offset%4096 != 0 {
		t.Fatalf("the image's GPT is not of 4096-byte sectors: %+v", st)
	}

	v := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: img, SectorSize: 4096}}})
	expect(t, v, "liken-grub: booting slot A (trial 0)", 180*time.Second)
	expect(t, v, "mounted root image from slot /dev/vda2", 120*time.Second)
	expect(t, v, "liken-init: state partition /dev/vda5 mounted on /var", 60*time.Second)
	k3s := expect(t, v, "liken-init: started k3s", 120*time.Second)
	expect(t, v, "liken-init: shutdown complete", 120*time.Second)
	v.Wait(60 * time.Second)
	if b, _ := exec.Command("cat", "/sys/block/"+filepath.Base(loop)+"/queue/logical_block_size").Output(); len(b) > 0 {
		t.Logf("loop device's logical block size was %s", strings.TrimSpace(string(b)))
	}
	report.Line("disk of 4096-byte sectors: install onto a 4096-byte-sector loop device %s; booted through GRUB to k3s in %s (TCG)", took.Round(100*time.Millisecond), k3s.Round(100*time.Millisecond))
}
