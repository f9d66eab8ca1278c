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
	"io"
	"os"
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

// Partition types (UEFI 2.10, 5.3.3; the Discoverable Partitions Specification).
var (
	TypeESP   = MustGUID("C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
	TypeLinux = MustGUID("0FC63DAF-8483-4772-8E79-3D69D8477DE4")
)

// Partition writes a new GPT on path (an image file or a block device) with the layout:
// each partition aligned to 1 MiB, as partitioning tools do, the state partition taking the
// rest. It is liken's own table writer (WriteTable), so the same code partitions a disk on
// an operator's host and on a machine booted from the installer image, which carries no
// partitioning tool.
func Partition(path string, l Layout) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("partitioning %s: %w", path, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("partitioning %s: %w", path, err)
	}
	// A new image file has no table to read its sectors from: 512. A block device says its own.
	sector := int64(512)
	if st, err := f.Stat(); err == nil && st.Mode()&os.ModeDevice != 0 {
		if sector, err = SectorSize(f); err != nil {
			return err
		}
	}
	entries, err := l.entries(size, sector)
	if err != nil {
		return fmt.Errorf("partitioning %s: %w", path, err)
	}
	if err := WriteTable(f, size, sector, RandomGUID(), entries); err != nil {
		return fmt.Errorf("partitioning %s: %w", path, err)
	}
	return nil
}

// entries are the layout's partitions on a disk of size bytes in sector-byte sectors.
func (l Layout) entries(size, sector int64) ([]Entry, error) {
	perMiB := int64(1<<20) / sector
	entrySectors := (int64(gptEntries*gptEntrySize) + sector - 1) / sector
	lastUsable := size/sector - 1 - entrySectors - 1
	var out []Entry
	next := perMiB
	for _, p := range []struct {
		name string
		typ  GUID
		mib  int
	}{{ESP, TypeESP, l.ESPMiB}, {SlotA, TypeLinux, l.SlotMiB}, {SlotB, TypeLinux, l.SlotMiB}, {Layer, TypeLinux, l.LayerMiB}, {State, TypeLinux, 0}} {
		last := next + int64(p.mib)*perMiB - 1
		if p.mib == 0 {
			last = lastUsable
		}
		if last > lastUsable || last < next {
			return nil, fmt.Errorf("the disk (%d MiB) is too small for the layout (at least %d MiB)", size>>20, l.MinSizeMiB())
		}
		out = append(out, Entry{Type: p.typ, GUID: RandomGUID(), First: next, Last: last, Name: p.name})
		next = last + 1
	}
	return out, nil
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
