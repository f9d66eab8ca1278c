package vm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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
	vmTest(t)
	img := filepath.Join(t.TempDir(), "4k.img")
	target, _, done := installTarget(t, img, testLayout.MinSizeMiB()+16, 4096)
	publishedRelease(t) // built before the install is timed
	start := time.Now()
	installTo(t, target, 0, "quiet liken.test=poweroff", "server-1", "server", nil)
	took := time.Since(start)
	done()
	parts, err := disk.Read(img)
	if err != nil {
		t.Fatal(err)
	}
	if st := parts[disk.State]; st.SectorSize != 4096 {
		t.Fatalf("the image's GPT is not of 4096-byte sectors: %+v", st)
	}

	v := bootUEFI(t, img, false) // as a disk of 4096-byte sectors: its GPT says so
	expect(t, v, "liken-grub: booting slot A (trial 0)", 180*time.Second)
	expect(t, v, "mounted root image from slot /dev/vda2", 120*time.Second)
	expect(t, v, "liken-init: state partition /dev/vda5 mounted on /var", 60*time.Second)
	k3s := expect(t, v, "liken-init: started k3s", 120*time.Second)
	expect(t, v, "liken-init: shutdown complete", 120*time.Second)
	poweredOff(t, v)
	report.Line("disk of 4096-byte sectors: install onto a 4096-byte-sector loop device %s; booted through GRUB to k3s in %s (TCG)", took.Round(100*time.Millisecond), k3s.Round(100*time.Millisecond))
}

// installTarget makes the image file of a machine's disk, sizeMiB large, and returns what to
// install onto: the file (with its size for install), or, for 4096-byte sectors, a loop
// device of that sector size over it (size 0: install sizes the device), which done
// detaches. bootUEFI boots the file with the sector size its GPT was written for.
func installTarget(t *testing.T, path string, sizeMiB, sectorSize int) (target string, size int, done func()) {
	t.Helper()
	if sectorSize == 0 || sectorSize == 512 {
		return path, sizeMiB, func() {}
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, int64(sizeMiB)<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--sector-size", fmt.Sprint(sectorSize), path).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup --sector-size %d: %v: %s", sectorSize, err, out)
	}
	loop := strings.TrimSpace(string(out))
	var once sync.Once
	done = func() { once.Do(func() { exec.Command("losetup", "-d", loop).Run() }) }
	t.Cleanup(done)
	return loop, 0, done
}
