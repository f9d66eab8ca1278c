package datadisk

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/disk/looptest"
)

func TestPlan(t *testing.T) {
	disk := func(parts ...v1alpha1.Partition) v1alpha1.Disk {
		return v1alpha1.Disk{Device: "/dev/x", Partitions: parts}
	}
	p := func(label, size string) v1alpha1.Partition { return v1alpha1.Partition{Label: label, Size: size} }
	for _, tc := range []struct {
		name         string
		d            v1alpha1.Disk
		size, sector int64
		want         [][2]int64 // first, last sector
		err          string
	}{
		{"sized and rest, 512", disk(p("a", "10Mi"), p("b", "")), 100 * mib, 512, [][2]int64{{2048, 22527}, {22528, 202751}}, ""},
		{"sized and rest, 4096", disk(p("a", "10Mi"), p("b", "")), 100 * mib, 4096, [][2]int64{{256, 2815}, {2816, 25343}}, ""},
		{"rounded up to a MiB", disk(p("a", "1500Ki"), p("b", "1M")), 100 * mib, 512, [][2]int64{{2048, 6143}, {6144, 8191}}, ""},
		{"does not fit", disk(p("a", "99Mi")), 100 * mib, 512, nil, "does not fit"},
		{"rest with nothing left", disk(p("a", "98Mi"), p("b", "")), 100 * mib, 512, nil, "does not fit"},
		{"size missing before the last", disk(p("a", ""), p("b", "1Mi")), 100 * mib, 512, nil, "not the last"},
		{"bad size", disk(p("a", "lots")), 100 * mib, 512, nil, "size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plan(tc.d, tc.size, tc.sector)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v", got)
			}
			for i, g := range got {
				if g.First != tc.want[i][0] || g.Last != tc.want[i][1] || g.Filesystem != "ext4" {
					t.Errorf("partition %d: %d-%d %s, want %v ext4", i, g.First, g.Last, g.Filesystem, tc.want[i])
				}
			}
		})
	}
}

func TestSignature(t *testing.T) {
	b := make([]byte, mib)
	copy(b[1080:], "\x53\xef")
	if s := signature(b); !strings.Contains(s, "ext") {
		t.Errorf("ext4: %s", s)
	}
	b = make([]byte, mib)
	b[510], b[511] = 0x55, 0xaa
	if s := signature(b); !strings.Contains(s, "MBR") {
		t.Errorf("mbr: %s", s)
	}
	b = make([]byte, mib)
	b[7] = 1
	if s := signature(b); !strings.Contains(s, "data") {
		t.Errorf("data: %s", s)
	}
}

// loopDisk attaches an image of sizeMiB as a loop device with partition scanning; the
// cleanup unmounts what the test mounted from it and detaches it.
func loopDisk(t *testing.T, sizeMiB int64, sector int) (dev, img string) {
	t.Helper()
	looptest.Require(t, "mke2fs", "mkfs.fat", "e2fsck", "blkid")
	img = looptest.Image(t, sizeMiB*mib)
	return looptest.Attach(t, img, sector), img
}

func hasFilesystem(name string) bool {
	b, _ := os.ReadFile("/proc/filesystems")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(strings.TrimPrefix(l, "nodev")) == name {
			return true
		}
	}
	return false
}

func swapCall(nr uintptr, path string) error {
	ptr, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(nr, uintptr(unsafe.Pointer(ptr)), 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// mountDir is a directory for a test's mount points; whatever is mounted under it is
// unmounted when the test ends, deepest first.
func mountDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() {
		for {
			b, _ := os.ReadFile("/proc/self/mounts")
			deepest := ""
			for _, l := range strings.Split(string(b), "\n") {
				if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") && len(f[1]) > len(deepest) {
					deepest = f[1]
				}
			}
			if deepest == "" || unix.Unmount(deepest, unix.MNT_DETACH) != nil {
				return
			}
		}
	})
	return dir
}

// mountedAt is the file system type and options mounted on dir, "" if none.
func mountedAt(dir string) string {
	b, _ := os.ReadFile("/proc/self/mounts")
	got := ""
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 3 && f[1] == dir {
			got = f[2] + " " + f[3] // the last one mounted there is the one seen
		}
	}
	return got
}

func hostEnv(log io.Writer) Env {
	return Env{Dev: "/dev", Sys: "/sys", Tools: Tools{Mke2fs: []string{"/sbin/mke2fs"}, MkfsFat: []string{"/sbin/mkfs.fat"}}, Wait: time.Second, Log: log}
}

func fileHash(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func blkid(t *testing.T, dev string) string {
	t.Helper()
	out, _ := exec.Command("blkid", "-p", "-o", "export", dev).CombinedOutput()
	return string(out)
}

// TestPrepareThenMountAgain prepares an empty disk of each sector size (ext4 and vfat
// mounted, swap and an unformatted partition), checks the result with e2fsprogs and blkid,
// writes a file, and prepares it again as the next boot would: nothing is formatted and the
// file is still there.
func TestPrepareThenMountAgain(t *testing.T) {
	for _, sector := range []int{512, 4096} {
		t.Run(strconv.Itoa(sector), func(t *testing.T) {
			dev, _ := loopDisk(t, 200, sector)
			mnt := mountDir(t)
			fat := ""
			if hasFilesystem("vfat") {
				fat = mnt + "/data/fat"
			} else {
				t.Log("this host's kernel mounts no vfat: the FAT partition is made, not mounted (the VM tier mounts one)")
			}
			spec := []v1alpha1.Disk{{Device: v1alpha1.DevicePath(dev), Partitions: []v1alpha1.Partition{
				{Label: "data", Size: "64Mi", Filesystem: "ext4", MountPoint: mnt + "/data"},
				{Label: "boot-stuff", Size: "40Mi", Filesystem: "vfat", MountPoint: fat},
				{Label: "swap", Size: "16Mi", Filesystem: "swap"},
				{Label: "raw", Size: "8Mi", Filesystem: "none"},
				{Label: "logs", MountPoint: mnt + "/logs"},
			}}}
			var log bytes.Buffer
			st := hostEnv(&log).Apply(spec)
			if st[0].Phase != v1alpha1.DiskReady || st[0].Reason != v1alpha1.DiskPrepared || !strings.HasPrefix(st[0].ContentID, "gpt:") {
				t.Fatalf("first boot: %+v\n%s", st[0], log.String())
			}
			if !strings.Contains(st[0].Message, "5 of 5 partitions formatted") {
				t.Errorf("message: %s", st[0].Message)
			}
			p := func(n int) string { return dev + "p" + strconv.Itoa(n) }
			for n, want := range map[int][]string{
				1: {`TYPE="ext4"`, `LABEL="data"`, `PART_ENTRY_NAME="data"`, "PART_ENTRY_TYPE=0fc63daf-8483-4772-8e79-3d69d8477de4"},
				2: {`TYPE="vfat"`, `LABEL="BOOT-STUFF"`, "PART_ENTRY_TYPE=ebd0a0a2-b9e5-4433-87c0-68b6b72699c7"},
				3: {`TYPE="swap"`, `LABEL="swap"`, "PART_ENTRY_TYPE=0657fd6d-a4ab-43c4-84e5-0933c84b4f4f"},
				5: {`TYPE="ext4"`, `LABEL="logs"`},
			} {
				got := blkid(t, p(n))
				for _, w := range want {
					if !strings.Contains(strings.ReplaceAll(got, `"`, ""), strings.ReplaceAll(w, `"`, "")) {
						t.Errorf("%s: blkid says\n%s\nwant %s", p(n), got, w)
					}
				}
			}
			for _, l := range strings.Split(blkid(t, p(4)), "\n") {
				if strings.HasPrefix(l, "TYPE=") {
					t.Errorf("the unformatted partition holds a file system: %s", l)
				}
			}
			// The kernel takes the swap header as one.
			switch err := swapon(p(3)); {
			case errors.Is(err, unix.EPERM):
				t.Logf("swapon %s: %v: this host does not allow swap; blkid's reading stands", p(3), err)
			case err != nil:
				t.Errorf("swapon %s: %v", p(3), err)
			default:
				swapCall(unix.SYS_SWAPOFF, p(3))
			}
			kept := []string{mnt + "/logs/keep.txt"}
			if fat != "" {
				kept = append(kept, fat+"/keep.txt")
			}
			for _, f := range kept {
				if err := os.WriteFile(f, []byte("kept"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			looptest.UnmountFrom(dev)
			for _, n := range []int{1, 5} {
				if out, err := exec.Command("e2fsck", "-fn", p(n)).CombinedOutput(); err != nil {
					t.Errorf("e2fsck -fn %s: %v\n%s", p(n), err, out)
				}
			}
			if !strings.Contains(st[0].Message, "swap (not activated: the Cluster's features.swap is off)") {
				t.Errorf("features.swap off: %s", st[0].Message)
			}
			// The next boot, with the Cluster's features.swap on: the swap area is activated.
			log.Reset()
			env := hostEnv(&log)
			env.Swap = true
			st = env.Apply(spec)
			if st[0].Phase != v1alpha1.DiskReady || st[0].Reason != v1alpha1.DiskMounted || !strings.HasPrefix(st[0].Message, "nothing formatted") {
				t.Fatalf("second boot: %+v\n%s", st[0], log.String())
			}
			swaps, _ := os.ReadFile("/proc/swaps")
			switch {
			case strings.Contains(st[0].Message, "swap (activating it failed: operation not permitted)"):
				t.Logf("this host does not allow swap: %s", st[0].Message)
			case !strings.Contains(st[0].Message, p(3)+" swap, on") || !strings.Contains(string(swaps), p(3)):
				t.Errorf("features.swap on: %s\n/proc/swaps:\n%s", st[0].Message, swaps)
			default:
				if err := swapCall(unix.SYS_SWAPOFF, p(3)); err != nil {
					t.Errorf("swapoff: %v", err)
				}
			}
			for _, f := range kept {
				if b, err := os.ReadFile(f); err != nil || string(b) != "kept" {
					t.Errorf("%s after the second boot: %q, %v", f, b, err)
				}
			}
		})
	}
}

// TestLeftUntouched: a disk with another layout, one with a file system and no table,
// liken's own disk and a disk named twice are each refused, and not one byte of them
// changes.
func TestLeftUntouched(t *testing.T) {
	other, otherImg := loopDisk(t, 64, 512)
	if out, err := exec.Command("sgdisk", "--new=1:0:+20M", "--change-name=1:data", other).CombinedOutput(); err != nil {
		t.Fatalf("sgdisk: %v: %s", err, out)
	}
	raw, rawImg := loopDisk(t, 64, 512)
	if out, err := exec.Command("mke2fs", "-q", "-F", "-t", "ext4", raw).CombinedOutput(); err != nil {
		t.Fatalf("mke2fs: %v: %s", err, out)
	}
	install, installImg := loopDisk(t, 64, 512)
	twice, twiceImg := loopDisk(t, 64, 512)
	link := filepath.Join(t.TempDir(), "by-id-twice")
	os.Symlink(twice, link)
	mine, mineImg := loopDisk(t, 64, 512)
	if out, err := exec.Command("sgdisk", "--new=1:0:+20M", "--change-name=1:liken-state", mine).CombinedOutput(); err != nil {
		t.Fatalf("sgdisk: %v: %s", err, out)
	}
	images := []string{otherImg, rawImg, installImg, twiceImg, mineImg}
	before := map[string]string{}
	for _, img := range images {
		before[img] = fileHash(t, img)
	}
	want := func(dev string) v1alpha1.Disk {
		return v1alpha1.Disk{Device: v1alpha1.DevicePath(dev), Partitions: []v1alpha1.Partition{{Label: "data", Size: "30Mi"}, {Label: "more"}}}
	}
	env := hostEnv(io.Discard)
	env.InstallDisk = install
	st := env.Apply([]v1alpha1.Disk{want(other), want(raw), want(install), want(twice), want(link), want(mine), want("/dev/no-such-disk")})
	for i, w := range []struct {
		reason, says string
	}{
		{v1alpha1.DiskLayoutDiffers, `found a GPT with 1 partitions: "data" 20 MiB at 1 MiB; the spec wants "data" 30 MiB at 1 MiB, ext4, "more" 32 MiB at 31 MiB, ext4`},
		{v1alpha1.DiskHoldsData, "found an ext2/3/4 file system"},
		{v1alpha1.DiskInstallDisk, "the disk liken is installed on"},
		{v1alpha1.DiskNamedTwice, "2 entries"},
		{v1alpha1.DiskNamedTwice, "2 entries"},
		{v1alpha1.DiskInstallDisk, `liken's own partition "liken-state"`},
		{v1alpha1.DiskNotFound, "no disk /dev/no-such-disk appeared"},
	} {
		if st[i].Phase != v1alpha1.DiskRefused || st[i].Reason != w.reason || !strings.Contains(st[i].Message, w.says) {
			t.Errorf("disk %d: %+v; want Refused %s saying %q", i, st[i], w.reason, w.says)
		}
	}
	if !strings.Contains(st[0].Message, "set wipe {serial: \""+otherImg+"\", contentID: \"gpt:") {
		t.Errorf("the refusal does not say how to wipe: %s", st[0].Message)
	}
	for _, img := range images {
		if got := fileHash(t, img); got != before[img] {
			t.Errorf("%s changed", img)
		}
	}
}

// TestWipeOnlyTheDiskItNames: a wipe naming another disk's serial, or what this disk held
// before, erases nothing; the one naming this disk's serial and content does, once.
func TestWipeOnlyTheDiskItNames(t *testing.T) {
	a, aImg := loopDisk(t, 64, 512)
	b, bImg := loopDisk(t, 64, 512)
	for _, d := range []string{a, b} {
		if out, err := exec.Command("mke2fs", "-q", "-F", "-t", "ext4", d).CombinedOutput(); err != nil {
			t.Fatalf("mke2fs: %v: %s", err, out)
		}
	}
	mnt := mountDir(t)
	spec := func(dev, mp string, w *v1alpha1.DiskWipe) v1alpha1.Disk {
		return v1alpha1.Disk{Device: v1alpha1.DevicePath(dev), Wipe: w, Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: mnt + mp}}}
	}
	env := hostEnv(io.Discard)
	st := env.Apply([]v1alpha1.Disk{spec(a, "/a", nil), spec(b, "/b", nil)})
	aID, bID := st[0].ContentID, st[1].ContentID
	if st[0].Reason != v1alpha1.DiskHoldsData || st[0].Serial != aImg || !strings.HasPrefix(aID, "sha256:") || aID == bID {
		t.Fatalf("refusals: %+v", st)
	}
	bBefore := fileHash(t, bImg)
	aBefore := fileHash(t, aImg)
	// Copied to the other disk's entry: b's entry names a's serial and content.
	st = env.Apply([]v1alpha1.Disk{spec(b, "/b", &v1alpha1.DiskWipe{Serial: aImg, ContentID: aID})})
	if st[0].Phase != v1alpha1.DiskRefused || fileHash(t, bImg) != bBefore {
		t.Fatalf("a wipe naming another disk: %+v", st[0])
	}
	// The right serial, but content that is not what the disk holds.
	st = env.Apply([]v1alpha1.Disk{spec(a, "/a", &v1alpha1.DiskWipe{Serial: aImg, ContentID: bID})})
	if st[0].Phase != v1alpha1.DiskRefused || fileHash(t, aImg) != aBefore {
		t.Fatalf("a wipe naming other content: %+v", st[0])
	}
	w := &v1alpha1.DiskWipe{Serial: aImg, ContentID: aID}
	st = env.Apply([]v1alpha1.Disk{spec(a, "/a", w), spec(b, "/b", nil)})
	if st[0].Phase != v1alpha1.DiskReady || st[0].Reason != v1alpha1.DiskWiped || st[0].ContentID == aID {
		t.Fatalf("the wipe: %+v", st[0])
	}
	if st[1].Phase != v1alpha1.DiskRefused || fileHash(t, bImg) != bBefore {
		t.Fatalf("the other disk: %+v", st[1])
	}
	os.WriteFile(mnt+"/a/keep.txt", []byte("kept"), 0o644)
	looptest.UnmountFrom(a)
	// The same spec at the next boot: the wipe no longer names what the disk holds.
	st = env.Apply([]v1alpha1.Disk{spec(a, "/a", w)})
	if st[0].Reason != v1alpha1.DiskMounted {
		t.Fatalf("the next boot: %+v", st[0])
	}
	if b, err := os.ReadFile(mnt + "/a/keep.txt"); string(b) != "kept" {
		t.Errorf("the wipe ran again: %q, %v", b, err)
	}
	// A wipe copied from the status of a disk that is ready, and names it exactly, erases
	// nothing: a disk as the spec says needs no wipe.
	looptest.UnmountFrom(a)
	st = env.Apply([]v1alpha1.Disk{spec(a, "/a", &v1alpha1.DiskWipe{Serial: aImg, ContentID: st[0].ContentID})})
	if st[0].Reason != v1alpha1.DiskMounted {
		t.Fatalf("a wipe of a ready disk: %+v", st[0])
	}
	if b, err := os.ReadFile(mnt + "/a/keep.txt"); string(b) != "kept" {
		t.Errorf("a wipe erased a disk that is as the spec says: %q, %v", b, err)
	}
}

// TestNothingWrittenUnderAMissingDisk: the mount points of a disk not ready get an empty
// read-only file system, so nothing meant for the disk lands on the state partition.
func TestNothingWrittenUnderAMissingDisk(t *testing.T) {
	held, _ := loopDisk(t, 64, 512)
	if out, err := exec.Command("mke2fs", "-q", "-F", "-t", "ext4", held).CombinedOutput(); err != nil {
		t.Fatalf("mke2fs: %v: %s", err, out)
	}
	mnt := mountDir(t)
	st := hostEnv(io.Discard).Apply([]v1alpha1.Disk{
		{Device: v1alpha1.DevicePath(held), Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: mnt + "/k3s"}}},
		{Device: "/dev/no-such-disk", Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: mnt + "/other"}}},
	})
	for i, dir := range []string{mnt + "/k3s", mnt + "/other"} {
		if st[i].Phase != v1alpha1.DiskRefused {
			t.Errorf("disk %d: %+v", i, st[i])
		}
		if got := mountedAt(dir); !strings.HasPrefix(got, "tmpfs ro,") {
			t.Errorf("%s: mounted %q; want an empty read-only tmpfs", dir, got)
		}
		if err := os.WriteFile(dir+"/x", nil, 0o644); err == nil {
			t.Errorf("%s took a write", dir)
		}
	}
}

// TestGrownDiskStillMatches: a disk prepared with a partition taking the rest, grown since
// (a cloud volume resized), is mounted as it is, nothing formatted.
func TestGrownDiskStillMatches(t *testing.T) {
	dev, img := loopDisk(t, 64, 512)
	mnt := mountDir(t)
	spec := []v1alpha1.Disk{{Device: v1alpha1.DevicePath(dev), Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: mnt + "/data"}}}}
	if st := hostEnv(io.Discard).Apply(spec); st[0].Reason != v1alpha1.DiskPrepared {
		t.Fatalf("first: %+v", st[0])
	}
	looptest.UnmountFrom(dev)
	if err := os.Truncate(img, 96*mib); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "--set-capacity", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup --set-capacity: %v: %s", err, out)
	}
	if st := hostEnv(io.Discard).Apply(spec); st[0].Reason != v1alpha1.DiskMounted {
		t.Fatalf("after growing: %+v", st[0])
	}
}

// TestResumesAfterACutInTheTableWrite: a power cut after the backup table was written and
// before the primary one leaves a disk whose first MiB is zeros and whose end holds the
// table; it reads as the table (from its backup), and the next boot prepares the disk.
func TestResumesAfterACutInTheTableWrite(t *testing.T) {
	dev, _ := loopDisk(t, 64, 512)
	mnt := mountDir(t)
	spec := []v1alpha1.Disk{{Device: v1alpha1.DevicePath(dev), Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: mnt + "/data"}}}}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Plan(spec[0], 64*mib, 512)
	if err != nil {
		t.Fatal(err)
	}
	if err := disk.WriteTable(f, 64*mib, 512, disk.RandomGUID(), []disk.Entry{{Type: typePending, GUID: disk.RandomGUID(), First: plan[0].First, Last: plan[0].Last, Name: "data"}}); err != nil {
		t.Fatal(err)
	}
	if err := disk.ZeroRange(f, 0, mib); err != nil { // the primary never written
		t.Fatal(err)
	}
	f.Close()
	st := hostEnv(io.Discard).Apply(spec)
	if st[0].Phase != v1alpha1.DiskReady || st[0].Reason != v1alpha1.DiskPrepared {
		t.Fatalf("after the cut: %+v", st[0])
	}
}

// TestResumesAfterACutPartWay: formatting fails part-way (as a power cut would leave it);
// the table says pending, and the next boot formats what is pending and finishes.
func TestResumesAfterACutPartWay(t *testing.T) {
	dev, _ := loopDisk(t, 64, 4096)
	mnt := mountDir(t)
	spec := []v1alpha1.Disk{{Device: v1alpha1.DevicePath(dev), Partitions: []v1alpha1.Partition{
		{Label: "one", Size: "20Mi", MountPoint: mnt + "/one"},
		{Label: "two", Filesystem: "vfat"},
	}}}
	env := hostEnv(io.Discard)
	env.Tools.MkfsFat = []string{"/bin/false"}
	st := env.Apply(spec)
	if st[0].Phase != v1alpha1.DiskFailed || !strings.Contains(st[0].Message, "formatting") {
		t.Fatalf("cut: %+v", st[0])
	}
	if got := blkid(t, dev+"p2"); !strings.Contains(got, "405cd35b-c1ee-45d6-805a-066f45030aaa") {
		t.Errorf("after the cut partition 2 is not pending: %s", got)
	}
	st = hostEnv(io.Discard).Apply(spec)
	if st[0].Phase != v1alpha1.DiskReady || st[0].Reason != v1alpha1.DiskPrepared {
		t.Fatalf("next boot: %+v", st[0])
	}
	if got := blkid(t, dev+"p2"); !strings.Contains(got, "TYPE=vfat") {
		t.Errorf("partition 2: %s", got)
	}
}
