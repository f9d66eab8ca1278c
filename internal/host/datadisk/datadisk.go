// Package datadisk prepares the disks a Machine's spec.disks names: at boot, before k3s,
// init partitions and formats an empty disk, mounts what is there on a disk prepared
// before, and leaves every other disk untouched.
//
// Never losing data is the rule everything here follows:
//   - A disk is formatted only when it is empty (its first and last MiB are zeros, which
//     is how disks leave the factory and clouds hand them out), or when the spec's one-time
//     wipe names its serial and what it holds now.
//   - A disk with a partition table is used only if its partitions are exactly the ones
//     the spec asks for, each holding the file system the spec names.
//   - A half-prepared disk is recognised by the "pending" partition type liken writes
//     first and replaces only once each file system is made: a power cut part-way resumes
//     on the next boot instead of being mistaken for data, or for a finished disk.
//   - Liken's own install disk, and a disk two entries name, are refused.
//
// The GPT is liken's own (internal/disk); file systems are made by the e2fsprogs and
// dosfstools the release image carries (see ToolsDir); a swap area's header is written
// here (its format is a page with a magic at its end).
package datadisk

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
)

// ToolsDir holds the release image's mke2fs and mkfs.fat with the libraries they link and
// their loader: run through that loader, they need nothing else from the image.
const ToolsDir = "/usr/libexec/liken/mkfs"

// ImageTools runs the release image's tools.
func ImageTools() Tools {
	run := func(name string) []string {
		return []string{filepath.Join(ToolsDir, "ld.so"), "--library-path", filepath.Join(ToolsDir, "lib"), filepath.Join(ToolsDir, name)}
	}
	return Tools{Mke2fs: run("mke2fs"), MkfsFat: run("mkfs.fat")}
}

// Tools are the commands that make file systems, each as the argv before its arguments.
type Tools struct {
	Mke2fs, MkfsFat []string
}

// Partition type GUIDs (UEFI and the Discoverable Partitions Specification).
var (
	typeLinux = disk.MustGUID("0FC63DAF-8483-4772-8E79-3D69D8477DE4")
	typeBasic = disk.MustGUID("EBD0A0A2-B9E5-4433-87C0-68B6B72699C7") // FAT
	typeSwap  = disk.MustGUID("0657FD6D-A4AB-43C4-84E5-0933C84B4F4F")
	// typePending marks a partition liken made on an empty disk and has not formatted yet.
	typePending = disk.MustGUID("405CD35B-C1EE-45D6-805A-066F45030AAA")
)

const mib = 1 << 20

// Env is where disks are found and prepared: the real ones at boot, loop devices in tests.
type Env struct {
	Dev, Sys string // "/dev", "/sys"
	Tools    Tools
	// InstallDisk is liken's own disk (a whole-disk device such as /dev/vda); it is refused.
	InstallDisk string
	// Wait is how long a disk the spec names may take to appear.
	Wait time.Duration
	// Swap activates swap partitions (the Cluster's features.swap).
	Swap bool
	Log  io.Writer
}

// Part is one partition the spec asks for, placed on a disk.
type Part struct {
	v1alpha1.Partition
	First, Last int64 // sectors, inclusive
}

// Plan places the spec's partitions on a disk of size bytes and sector-byte sectors: the
// first at 1 MiB, each after the one before, each size rounded up to a whole MiB; one
// without a size ends at the last whole MiB before the backup table.
func Plan(d v1alpha1.Disk, size, sector int64) ([]Part, error) {
	perMiB := mib / sector
	end := (size/mib - 1) * perMiB // first sector of the last MiB, kept for the backup table
	next := perMiB
	var out []Part
	for i, p := range d.Partitions {
		if p.Filesystem == "" {
			p.Filesystem = v1alpha1.Filesystem("ext4")
		}
		var n int64
		if p.Size == "" {
			if i != len(d.Partitions)-1 {
				return nil, fmt.Errorf("partition %s has no size and is not the last", p.Label)
			}
			n = end - next
		} else {
			q, err := resource.ParseQuantity(p.Size)
			if err != nil {
				return nil, fmt.Errorf("partition %s: size %q: %w", p.Label, p.Size, err)
			}
			n = (q.Value() + mib - 1) / mib * perMiB
		}
		if n <= 0 || next+n > end {
			return nil, fmt.Errorf("partition %s does not fit: the disk has %d MiB", p.Label, size/mib)
		}
		out = append(out, Part{Partition: p, First: next, Last: next + n - 1})
		next += n
	}
	return out, nil
}

func partType(fs v1alpha1.Filesystem) disk.GUID {
	switch fs {
	case "vfat":
		return typeBasic
	case "swap":
		return typeSwap
	}
	return typeLinux
}

// Apply prepares each disk of the spec, in order, and says what became of each. It never
// returns early: one disk's trouble leaves the others to be prepared.
func (e Env) Apply(disks []v1alpha1.Disk) []v1alpha1.DiskStatus {
	out := make([]v1alpha1.DiskStatus, len(disks))
	devs := make([]string, len(disks))
	byDev := map[uint64][]int{}
	for i, d := range disks {
		out[i] = v1alpha1.DiskStatus{Device: d.Device}
		dev, rdev, err := e.Resolve(string(d.Device))
		if err != nil {
			out[i].Phase, out[i].Reason, out[i].Message = v1alpha1.DiskRefused, v1alpha1.DiskNotFound, err.Error()
			continue
		}
		devs[i], out[i].Path = dev, dev
		out[i].Serial = e.Serial(dev)
		byDev[rdev] = append(byDev[rdev], i)
	}
	var install uint64
	if e.InstallDisk != "" {
		if _, rdev, err := e.Resolve(e.InstallDisk); err == nil {
			install = rdev
		}
	}
	for rdev, idx := range byDev {
		for _, i := range idx {
			switch {
			case len(idx) > 1:
				out[i].Phase, out[i].Reason = v1alpha1.DiskRefused, v1alpha1.DiskNamedTwice
				out[i].Message = fmt.Sprintf("%s is %s, which %d entries of spec.disks name: each is left untouched", disks[i].Device, devs[i], len(idx))
			case rdev == install:
				out[i].Phase, out[i].Reason = v1alpha1.DiskRefused, v1alpha1.DiskInstallDisk
				out[i].Message = fmt.Sprintf("%s is %s, the disk liken is installed on", disks[i].Device, devs[i])
			}
		}
	}
	mounts := make([][]mountReq, len(disks))
	for i, d := range disks {
		if out[i].Phase != "" {
			e.logf("disk %s: %s: %s", d.Device, out[i].Reason, out[i].Message)
			continue
		}
		start := time.Now()
		e.prepare(d, devs[i], &out[i], &mounts[i])
		e.logf("disk %s (%s): %s, %s in %s: %s", d.Device, devs[i], out[i].Phase, out[i].Reason, time.Since(start).Round(time.Millisecond), out[i].Message)
	}
	e.mountAll(disks, out, mounts)
	return out
}

// mountAll mounts every disk's file systems, shallowest mount point first, whichever disk
// they are on, so none hides another. Over the mount point of each partition whose disk is
// not ready goes an empty read-only tmpfs: nothing (k3s's data above all) is then written
// under it onto the state partition, to be hidden once the disk comes back.
func (e Env) mountAll(disks []v1alpha1.Disk, out []v1alpha1.DiskStatus, mounts [][]mountReq) {
	type owned struct {
		mountReq
		disk int
	}
	var all []owned
	for i, d := range disks {
		if out[i].Phase == v1alpha1.DiskReady {
			for _, m := range mounts[i] {
				all = append(all, owned{m, i})
			}
			continue
		}
		for _, p := range d.Partitions {
			if p.MountPoint != "" {
				all = append(all, owned{mountReq{dev: "none", dir: p.MountPoint, fs: "tmpfs"}, i})
			}
		}
	}
	sort.SliceStable(all, func(a, b int) bool {
		return strings.Count(filepath.Clean(all[a].dir), "/") < strings.Count(filepath.Clean(all[b].dir), "/")
	})
	for _, m := range all {
		st := &out[m.disk]
		if m.fs == "tmpfs" {
			if err := placeholder(m.dir); err != nil {
				e.logf("disk %s: %v", disks[m.disk].Device, err)
			} else {
				e.logf("disk %s is not ready: %s holds an empty read-only file system meanwhile", disks[m.disk].Device, m.dir)
			}
			continue
		}
		if st.Phase != v1alpha1.DiskReady {
			continue // failed on an earlier mount
		}
		if err := mount(m.dev, m.dir, m.fs); err != nil {
			st.Phase, st.Reason, st.Message = v1alpha1.DiskFailed, v1alpha1.DiskSetupFailed, err.Error()
			e.logf("disk %s: %v", disks[m.disk].Device, err)
			if err := placeholder(m.dir); err != nil {
				e.logf("disk %s: %v", disks[m.disk].Device, err)
			}
		}
	}
}

// placeholder mounts an empty read-only tmpfs on dir.
func placeholder(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making the mount point %s: %w", dir, err)
	}
	if err := unix.Mount("none", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555"); err != nil {
		return fmt.Errorf("mounting an empty read-only file system on %s: %w", dir, err)
	}
	return nil
}

// capText shortens s to at most n bytes, saying so.
func capText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + " ..."
}

func (e Env) logf(format string, args ...any) {
	if e.Log != nil {
		fmt.Fprintf(e.Log, "liken-init: "+format+"\n", args...)
	}
}

// Resolve waits for a device path to name a whole-disk block device and returns its
// canonical path and device number.
func (e Env) Resolve(path string) (string, uint64, error) {
	deadline := time.Now().Add(e.Wait)
	for {
		dev, err := filepath.EvalSymlinks(path)
		if err == nil {
			var st unix.Stat_t
			if err := unix.Stat(dev, &st); err != nil {
				return "", 0, fmt.Errorf("%s: %w", dev, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFBLK {
				return "", 0, fmt.Errorf("%s is not a block device", dev)
			}
			sys := fmt.Sprintf("%s/dev/block/%d:%d", e.Sys, unix.Major(st.Rdev), unix.Minor(st.Rdev))
			if _, err := os.Stat(sys + "/partition"); err == nil {
				return "", 0, fmt.Errorf("%s is a partition, not a whole disk", dev)
			}
			return dev, st.Rdev, nil
		}
		if time.Now().After(deadline) {
			return "", 0, fmt.Errorf("no disk %s appeared within %s", path, e.Wait)
		}
		if strings.HasPrefix(path, filepath.Join(e.Dev, "disk", "by-id")+"/") {
			LinkByID(e.Dev, e.Sys) // for a disk that appeared since
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (e Env) sysDir(dev string) string {
	return filepath.Join(e.Sys, "class", "block", filepath.Base(dev))
}

// Serial is a disk's serial number as status.disks shows it (a loop device's: its backing file).
func (e Env) Serial(dev string) string {
	// A loop device's identity is its backing file.
	for _, f := range []string{"device/serial", "serial", "device/wwid", "loop/backing_file"} {
		if b, err := os.ReadFile(filepath.Join(e.sysDir(dev), f)); err == nil && strings.TrimSpace(string(b)) != "" {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

// Found is what a disk holds, read before anything is written.
type Found struct {
	Empty bool
	Table *disk.Table // its GPT, if it has one
	// What describes the content in words ("an ext4 file system", "a GPT with ...").
	What string
	// ContentID: gpt:<disk GUID>, or sha256 of the first and last MiB; empty when Empty.
	ContentID string
}

// Inspect reads what a disk holds.
func Inspect(f *os.File, size int64) (Found, error) {
	head, tail := make([]byte, mib), make([]byte, mib)
	if _, err := f.ReadAt(head, 0); err != nil {
		return Found{}, fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	if _, err := f.ReadAt(tail, size-mib); err != nil {
		return Found{}, fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	if t, err := disk.ReadTable(f); err == nil {
		return Found{Table: t, What: describeTable(t), ContentID: "gpt:" + t.DiskGUID.String()}, nil
	} else if !errors.Is(err, disk.ErrNoGPT) {
		// A GPT header that does not check out: data of some kind, never "empty".
		return Found{What: "a damaged GPT (" + err.Error() + ")", ContentID: contentHash(head, tail)}, nil
	}
	if disk.AllZero(head) && disk.AllZero(tail) {
		return Found{Empty: true, What: "an empty disk"}, nil
	}
	return Found{What: signature(head), ContentID: contentHash(head, tail)}, nil
}

// contentHash identifies a disk without a GPT by its first and last MiB.
func contentHash(head, tail []byte) string {
	h := sha256.New()
	h.Write(head)
	h.Write(tail)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// at says whether b holds magic at off.
func at(b []byte, off int, magic string) bool {
	return off+len(magic) <= len(b) && string(b[off:off+len(magic)]) == magic
}

// signature names what the first MiB of a disk without a GPT holds, as far as liken can
// tell; whatever it is, it is data.
func signature(b []byte) string {
	switch {
	case at(b, 1080, "\x53\xef"):
		return "an ext2/3/4 file system"
	case at(b, 0, "XFSB"):
		return "an XFS file system"
	case at(b, 0x10040, "_BHRfS_M"):
		return "a btrfs file system"
	case at(b, 0, "LUKS\xba\xbe"):
		return "a LUKS encrypted volume"
	case at(b, 512, "LABELONE") || at(b, 1024, "LABELONE"):
		return "an LVM physical volume"
	case at(b, 4086, "SWAPSPACE2"):
		return "a swap area"
	case at(b, 0x8001, "CD001"):
		return "an ISO 9660 image"
	case at(b, 0x36, "FAT") || at(b, 0x52, "FAT32"):
		return "a FAT file system"
	case at(b, 510, "\x55\xaa"):
		return "an MBR partition table"
	}
	return "data (its first or last MiB is not zeros)"
}

func describeTable(t *disk.Table) string {
	var parts []string
	for _, en := range sortedEntries(t) {
		kind := ""
		switch en.Type {
		case typePending:
			kind = ", not yet formatted by liken"
		case typeSwap:
			kind = ", swap"
		case typeBasic:
			kind = ", basic data"
		}
		parts = append(parts, fmt.Sprintf("%q %s at %s%s", en.Name, mibs(en.Size(t.SectorSize)), mibs(en.Offset(t.SectorSize)), kind))
	}
	if len(parts) == 0 {
		return "a GPT with no partitions"
	}
	return fmt.Sprintf("a GPT with %d partitions: %s", len(parts), strings.Join(parts, ", "))
}

func describePlan(parts []Part, sector int64) string {
	var s []string
	for _, p := range parts {
		s = append(s, fmt.Sprintf("%q %s at %s, %s", p.Label, mibs((p.Last-p.First+1)*sector), mibs(p.First*sector), p.Filesystem))
	}
	return strings.Join(s, ", ")
}

func mibs(n int64) string { return strconv.FormatInt(n/mib, 10) + " MiB" }

func sortedEntries(t *disk.Table) []disk.Entry {
	es := append([]disk.Entry{}, t.Entries...)
	sort.Slice(es, func(i, j int) bool { return es[i].First < es[j].First })
	return es
}

// matches says whether a GPT is the plan's, each partition of the planned type or still
// pending, and which partitions are pending.
func matches(t *disk.Table, plan []Part) (ok bool, pending []int) {
	es := sortedEntries(t)
	if len(es) != len(plan) {
		return false, nil
	}
	for i, en := range es {
		p := plan[i]
		last := en.Last == p.Last
		if p.Size == "" {
			// Taking the rest of a disk that has grown since (a cloud volume resized): the
			// partition ends where the disk ended then.
			last = en.Last <= p.Last
		}
		if en.Name != p.Label || en.First != p.First || !last {
			return false, nil
		}
		switch en.Type {
		case partType(p.Filesystem):
		case typePending:
			pending = append(pending, i)
		default:
			return false, nil
		}
	}
	return true, pending
}

// mountReq is a file system to mount once every disk is prepared.
type mountReq struct{ dev, dir, fs string }

// prepare does one disk, filling st, and adds what to mount to mounts.
func (e Env) prepare(d v1alpha1.Disk, dev string, st *v1alpha1.DiskStatus, mounts *[]mountReq) {
	refuse := func(reason, msg string) { st.Phase, st.Reason, st.Message = v1alpha1.DiskRefused, reason, msg }
	fail := func(err error) {
		st.Phase, st.Reason, st.Message = v1alpha1.DiskFailed, v1alpha1.DiskSetupFailed, err.Error()
	}
	f, err := openExclusive(dev)
	if err != nil {
		fail(err)
		return
	}
	// Closed before formatting: mke2fs wants its partition to itself.
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		fail(err)
		return
	}
	sector, err := disk.SectorSize(f)
	if err != nil {
		fail(err)
		return
	}
	plan, err := Plan(d, size, sector)
	if err != nil {
		refuse(v1alpha1.DiskTooSmall, err.Error())
		return
	}
	found, err := Inspect(f, size)
	if err != nil {
		fail(err)
		return
	}
	st.ContentID = found.ContentID
	if found.Table != nil {
		for _, en := range found.Table.Entries {
			if strings.HasPrefix(en.Name, "liken-") {
				refuse(v1alpha1.DiskInstallDisk, fmt.Sprintf("%s holds liken's own partition %q: it is a liken install disk", dev, en.Name))
				return
			}
		}
	}
	// What would make liken leave the disk alone; only then may a wipe that names the disk
	// and its content exactly clear it.
	var pending []int
	var parts []string
	reason, msg := "", ""
	switch {
	case found.Empty:
	case found.Table == nil:
		reason, msg = v1alpha1.DiskHoldsData, fmt.Sprintf("found %s; the spec wants %s", found.What, describePlan(plan, sector))
	default:
		ok, p := matches(found.Table, plan)
		if !ok {
			reason, msg = v1alpha1.DiskLayoutDiffers, fmt.Sprintf("found %s; the spec wants %s", found.What, describePlan(plan, sector))
			break
		}
		pending = p
		if parts, err = e.partitions(f, dev); err != nil {
			fail(err)
			return
		}
		// Each file system the table says is there must be there, as the spec names it.
		for i, p := range plan {
			if got := probe(parts[i]); !slices.Contains(pending, i) && !fsMatches(got, p.Filesystem) {
				reason, msg = v1alpha1.DiskLayoutDiffers, fmt.Sprintf("partition %q (%s) holds %s; the spec wants %s", p.Label, parts[i], orNothing(got), p.Filesystem)
				break
			}
		}
	}
	wiped := false
	if w := d.Wipe; reason != "" && w != nil {
		switch {
		case w.Serial != st.Serial:
			e.logf("disk %s: the wipe names serial %q, this disk's is %q: not wiping", d.Device, w.Serial, st.Serial)
		case w.ContentID != found.ContentID:
			e.logf("disk %s: the wipe names content %s, the disk holds %s: not wiping", d.Device, w.ContentID, found.ContentID)
		default:
			e.logf("disk %s: wiping %s (%s), as spec.disks' wipe asks", d.Device, dev, found.What)
			if err := wipe(f, size); err != nil {
				fail(err)
				return
			}
			found, wiped, reason, pending, parts = Found{Empty: true, What: "an empty disk"}, true, "", nil, nil
		}
	} else if w != nil && !found.Empty {
		e.logf("disk %s: the disk is as the spec says: its wipe is not needed, and nothing is erased", d.Device)
	}
	if reason != "" {
		hint := fmt.Sprintf("to reuse this disk, set wipe {serial: %q, contentID: %q} on it", st.Serial, found.ContentID)
		if st.Serial == "" {
			hint = "this disk reports no serial number, so no wipe can name it: to reuse it, erase its first and last MiB by other means"
		}
		refuse(reason, capText(msg, 2048)+". Nothing was written: "+hint)
		return
	}
	if found.Empty {
		// Pending first: only once every file system is made does the table say so.
		var entries []disk.Entry
		for i, p := range plan {
			entries = append(entries, disk.Entry{Type: typePending, GUID: disk.RandomGUID(), First: p.First, Last: p.Last, Name: p.Label})
			pending = append(pending, i)
		}
		if err := disk.WriteTable(f, size, sector, disk.RandomGUID(), entries); err != nil {
			fail(err)
			return
		}
		t, err := disk.ReadTable(f)
		if err != nil {
			fail(fmt.Errorf("reading back the table just written: %w", err))
			return
		}
		found.Table = t
	}
	st.ContentID = "gpt:" + found.Table.DiskGUID.String()
	if parts == nil {
		if parts, err = e.partitions(f, dev); err != nil {
			fail(err)
			return
		}
	}
	f.Close()
	f = nil
	for _, i := range pending {
		if err := e.format(parts[i], plan[i].Partition); err != nil {
			fail(fmt.Errorf("formatting %s (%q) as %s: %w", parts[i], plan[i].Label, plan[i].Filesystem, err))
			return
		}
	}
	if len(pending) > 0 {
		t := found.Table
		for i, en := range sortedEntries(t) {
			for j := range t.Entries {
				if t.Entries[j].Index == en.Index {
					t.Entries[j].Type = partType(plan[i].Filesystem)
				}
			}
		}
		sort.Slice(t.Entries, func(i, j int) bool { return t.Entries[i].Index < t.Entries[j].Index })
		if f, err = openExclusive(dev); err != nil {
			fail(err)
			return
		}
		if err := disk.WriteTable(f, size, sector, t.DiskGUID, t.Entries); err != nil {
			fail(err)
			return
		}
		f.Close()
		f = nil
	}
	var did []string
	for i, p := range plan {
		switch p.Filesystem {
		case "ext4", "vfat":
			if p.MountPoint == "" {
				did = append(did, fmt.Sprintf("%s %s (not mounted)", parts[i], p.Filesystem))
				continue
			}
			*mounts = append(*mounts, mountReq{dev: parts[i], dir: p.MountPoint, fs: string(p.Filesystem)})
			did = append(did, fmt.Sprintf("%s %s on %s", parts[i], p.Filesystem, p.MountPoint))
		case "swap":
			switch {
			case !e.Swap:
				did = append(did, fmt.Sprintf("%s swap (not activated: the Cluster's features.swap is off)", parts[i]))
			default:
				if err := swapon(parts[i]); err != nil {
					did = append(did, fmt.Sprintf("%s swap (activating it failed: %v)", parts[i], err))
				} else {
					did = append(did, fmt.Sprintf("%s swap, on", parts[i]))
				}
			}
		default:
			did = append(did, fmt.Sprintf("%s unformatted", parts[i]))
		}
	}
	st.Phase, st.Reason = v1alpha1.DiskReady, v1alpha1.DiskMounted
	switch {
	case wiped:
		st.Reason = v1alpha1.DiskWiped
	case len(pending) > 0:
		st.Reason = v1alpha1.DiskPrepared
	}
	formatted := "nothing formatted"
	if len(pending) > 0 {
		formatted = fmt.Sprintf("%d of %d partitions formatted", len(pending), len(plan))
	}
	st.Message = formatted + ": " + strings.Join(did, ", ")
}

// openExclusive opens a whole disk for writing, refused while anything has it (or one of
// its partitions) mounted or open exclusively.
func openExclusive(dev string) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_EXCL, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", dev, err)
	}
	return f, nil
}

func orNothing(s string) string {
	if s == "" {
		return "no file system liken knows"
	}
	return s
}

// wipe erases what identifies a disk's content: its first and last MiB (partition tables,
// most file system and volume signatures), so it reads as empty.
func wipe(f *os.File, size int64) error {
	if err := disk.ZeroRange(f, 0, mib); err != nil {
		return err
	}
	return disk.ZeroRange(f, size-mib, mib)
}

// partitions has the kernel read the disk's table again and returns the device of each
// partition, in the table's order on the disk. A kernel that parses no GPT (built without
// its partition parser) is given the partitions one by one, as partx would.
func (e Env) partitions(f *os.File, dev string) ([]string, error) {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKRRPART, 0); errno != 0 {
		return nil, fmt.Errorf("having the kernel read the partition table of %s: %w", dev, errno)
	}
	t, err := disk.ReadTable(f)
	if err != nil {
		return nil, err
	}
	es := sortedEntries(t)
	known := e.kernelPartitions(dev)
	for _, en := range es {
		if known[en.Index] != "" {
			continue
		}
		p := unix.BlkpgPartition{Start: en.Offset(t.SectorSize), Length: en.Size(t.SectorSize), Pno: int32(en.Index)}
		arg := unix.BlkpgIoctlArg{Op: unix.BLKPG_ADD_PARTITION, Datalen: int32(unsafe.Sizeof(p)), Data: (*byte)(unsafe.Pointer(&p))}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKPG, uintptr(unsafe.Pointer(&arg))); errno != 0 {
			return nil, fmt.Errorf("adding partition %d of %s to the kernel: %w", en.Index, dev, errno)
		}
		e.logf("disk %s: the kernel did not read partition %d from the table; added it", dev, en.Index)
	}
	out := make([]string, len(es))
	deadline := time.Now().Add(10 * time.Second)
	for {
		known, missing := e.kernelPartitions(dev), ""
		for i, en := range es {
			if out[i] = known[en.Index]; out[i] == "" {
				missing = fmt.Sprintf("partition %d", en.Index)
			} else if _, err := os.Stat(out[i]); err != nil {
				missing = out[i]
			}
		}
		if missing == "" {
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: %s did not appear after the kernel read the table", dev, missing)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kernelPartitions maps the partition numbers the kernel has for a disk to their devices.
func (e Env) kernelPartitions(dev string) map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir(e.sysDir(dev))
	for _, en := range entries {
		b, err := os.ReadFile(filepath.Join(e.sysDir(dev), en.Name(), "partition"))
		if err != nil {
			continue
		}
		if k, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			out[k] = filepath.Join(e.Dev, en.Name())
		}
	}
	return out
}

// probe names the file system on a partition: ext4, vfat, swap, or "".
func probe(dev string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 65536)
	n, _ := f.ReadAt(b, 0)
	b = b[:n]
	switch {
	case at(b, 1080, "\x53\xef"):
		return "ext4"
	case at(b, 510, "\x55\xaa") && (at(b, 0x36, "FAT") || at(b, 0x52, "FAT32")):
		return "vfat"
	}
	for _, page := range []int{4096, 8192, 16384, 65536} {
		if at(b, page-10, "SWAPSPACE2") {
			return "swap"
		}
	}
	return ""
}

func fsMatches(got string, want v1alpha1.Filesystem) bool {
	if want == "none" {
		return true
	}
	return got == string(want)
}

// format makes a partition's file system. It zeros the partition's first MiB first, so no
// signature of what was there before survives under an unformatted or swap partition.
func (e Env) format(dev string, p v1alpha1.Partition) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err == nil {
		err = disk.ZeroRange(f, 0, min(size, mib))
	}
	if err == nil && p.Filesystem == "swap" {
		err = writeSwapHeader(f, size, p.Label)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	var tool, args []string
	switch p.Filesystem {
	case "ext4", "":
		// lazy_itable_init: the kernel zeroes the inode tables in the background, so a
		// large disk is ready in seconds; the block groups are flagged until it has.
		tool, args = e.Tools.Mke2fs, []string{"-q", "-F", "-t", "ext4", "-L", fsLabel(p.Label, 16), "-E", "lazy_itable_init=1", dev}
	case "vfat":
		tool, args = e.Tools.MkfsFat, []string{"-n", strings.ToUpper(fsLabel(p.Label, 11)), dev}
	default:
		return nil
	}
	if len(tool) == 0 {
		return fmt.Errorf("no tool to make %s", p.Filesystem)
	}
	cmd := exec.Command(tool[0], append(tool[1:], args...)...)
	cmd.Env = []string{"PATH=/nonexistent"} // the image's tools need nothing from it
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", filepath.Base(tool[len(tool)-1]), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func fsLabel(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// writeSwapHeader writes a version 1 swap header (union swap_header in the kernel's
// include/linux/swap.h) on a partition of size bytes: the page size the kernel runs with,
// the last usable page, a UUID and a label, and SWAPSPACE2 at the end of the first page.
func writeSwapHeader(f *os.File, size int64, label string) error {
	page := int64(os.Getpagesize())
	if size < 10*page {
		return fmt.Errorf("a swap area needs at least 10 pages, the partition has %d bytes", size)
	}
	h := make([]byte, page)
	le := func(off int, v uint32) {
		h[off], h[off+1], h[off+2], h[off+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	le(1024, 1)                            // version
	le(1028, uint32(size/page-1))          // last_page
	le(1032, 0)                            // nr_badpages
	u := disk.RandomGUID()                 // the UUID's bytes, in the order blkid shows them
	copy(h[1036:1052], u[:])               // sws_uuid
	copy(h[1052:1068], fsLabel(label, 16)) // sws_volume
	copy(h[page-10:], "SWAPSPACE2")
	if _, err := f.WriteAt(h, 0); err != nil {
		return err
	}
	return f.Sync()
}

func mount(dev, dir, fs string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making the mount point %s: %w", dir, err)
	}
	if err := unix.Mount(dev, dir, fs, 0, ""); err != nil {
		return fmt.Errorf("mounting %s (%s) on %s: %w", dev, fs, dir, err)
	}
	return nil
}

// MountPoints are the mount points of the spec's partitions: where Apply mounted a file
// system, or a placeholder for a disk not ready. A shutdown unmounts everything under them.
func MountPoints(disks []v1alpha1.Disk) []string {
	var points []string
	for _, d := range disks {
		for _, p := range d.Partitions {
			if p.MountPoint != "" {
				points = append(points, p.MountPoint)
			}
		}
	}
	return points
}

// WholeDisk names the disk a partition device is on (/dev/vda for /dev/vda3), "" if it
// cannot tell.
func WholeDisk(sys, dev, part string) string {
	real, err := filepath.EvalSymlinks(filepath.Join(sys, "class", "block", filepath.Base(part)))
	if err != nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(real, "partition")); err != nil {
		return ""
	}
	return filepath.Join(dev, filepath.Base(filepath.Dir(real)))
}

// swapon activates a swap area (swapon(2)); one already active is left as it is.
func swapon(dev string) error {
	p, err := unix.BytePtrFromString(dev)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(p)), 0, 0); errno != 0 && errno != unix.EBUSY {
		return errno
	}
	return nil
}
