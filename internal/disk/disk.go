// Package disk is the layout of a liken machine's disk and the tools to make and read it.
//
// Layout (GPT, UEFI), each partition found by its GPT name (PARTLABEL), never by device name:
//
//	1 liken-esp     FAT32 EFI system partition: GRUB (EFI/BOOT/BOOTX64.EFI), its grub.cfg and
//	                environment block (EFI/liken/grubenv: default and trial slot)
//	2 liken-slot-a  slot A: a release's slot image (FAT: vmlinuz, initramfs.img, rootfs.squashfs)
//	3 liken-slot-b  slot B: the same for the other release
//	4 liken-layer   the deployment layer (see internal/layer), behind a small header
//	5 liken-state   ext4: k3s data, /etc/rancher/node, liken's own state; kept across upgrades
//
// A slot holds everything its release boots, kernel included, so writing one never touches
// the other.
package disk

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// Partition labels.
const (
	ESP   = "liken-esp"
	SlotA = "liken-slot-a"
	SlotB = "liken-slot-b"
	Layer = "liken-layer"
	State = "liken-state"
)

// SlotLabel returns the partition label of slot "A" or "B".
func SlotLabel(slot string) string { return "liken-slot-" + strings.ToLower(slot) }

// Layout gives the partition sizes in MiB; the state partition takes the rest.
type Layout struct {
	ESPMiB, SlotMiB, LayerMiB, MinStateMiB int
}

// DefaultLayout leaves room for releases to grow.
var DefaultLayout = Layout{ESPMiB: 64, SlotMiB: 1024, LayerMiB: 16, MinStateMiB: 1024}

// MinSizeMiB is the smallest disk the layout fits on.
func (l Layout) MinSizeMiB() int { return 2 + l.ESPMiB + 2*l.SlotMiB + l.LayerMiB + l.MinStateMiB }

// Partition writes a new GPT on path (an image file or a block device) with the layout.
func Partition(path string, l Layout) error {
	args := []string{"--clear",
		fmt.Sprintf("--new=1:0:+%dM", l.ESPMiB), "--typecode=1:ef00", "--change-name=1:" + ESP,
		fmt.Sprintf("--new=2:0:+%dM", l.SlotMiB), "--typecode=2:8300", "--change-name=2:" + SlotA,
		fmt.Sprintf("--new=3:0:+%dM", l.SlotMiB), "--typecode=3:8300", "--change-name=3:" + SlotB,
		fmt.Sprintf("--new=4:0:+%dM", l.LayerMiB), "--typecode=4:8300", "--change-name=4:" + Layer,
		"--new=5:0:0", "--typecode=5:8300", "--change-name=5:" + State,
		path}
	if out, err := exec.Command("sgdisk", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("partitioning %s: %w: %s", path, err, out)
	}
	return nil
}

// Extent is where a partition lies, in bytes from the start of the disk.
type Extent struct {
	Index        int // 1-based partition number
	Offset, Size int64
	Label        string
	// SectorSize is the disk's logical sector size: a file system in the partition needs
	// sectors at least this large.
	SectorSize int64
}

// SectorSize is a disk's logical sector size: the device's own for a block device; for an
// image file, the one its GPT was written for (its header is at LBA 1: byte 512 or 4096),
// else 512.
func SectorSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if fi.Mode()&os.ModeDevice != 0 {
		n, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET)
		if err != nil {
			return 0, fmt.Errorf("reading the sector size of %s: %w", f.Name(), err)
		}
		return int64(n), nil
	}
	for _, size := range []int64{512, 4096} {
		sig := make([]byte, 8)
		if _, err := f.ReadAt(sig, size); err == nil && string(sig) == "EFI PART" {
			return size, nil
		}
	}
	return 512, nil
}

// Read reads the GPT of a disk (the primary header at LBA 1, in the disk's sectors) and
// returns its partitions by label.
func Read(path string) (map[string]Extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := ReadTable(f)
	if err != nil {
		return nil, err
	}
	out := map[string]Extent{}
	for _, e := range t.Entries {
		out[e.Name] = Extent{Index: e.Index, Offset: e.Offset(t.SectorSize), Size: e.Size(t.SectorSize), Label: e.Name, SectorSize: t.SectorSize}
	}
	return out, nil
}

// AllZero says whether b holds only zeros.
func AllZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
