package initd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk/looptest"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

// testESP is a real ESP on a loop device, as install leaves it: slot A good and the
// default, slot B written and verified, both environment and slot-record copies. It is FAT
// as on a machine where this kernel has vfat; where it has not (some CI hosts), ext4, which
// the ESP's owner treats alike (what it proves is how mounts are shared, not FAT: the VM
// tier mounts the real FAT ESP).
func testESP(t *testing.T) (dev, fstype string) {
	t.Helper()
	looptest.Require(t, "mkfs.vfat", "mkfs.ext4")
	img := looptest.Image(t, 64<<20)
	fstype, mkfs := "vfat", []string{"mkfs.vfat", "-F", "32", img}
	if !kernelHas("vfat") {
		fstype, mkfs = "ext4", []string{"mkfs.ext4", "-q", "-F", img}
		t.Logf("this kernel has no vfat: the test ESP is %s", fstype)
	}
	if out, err := exec.Command(mkfs[0], mkfs[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v %s", mkfs[0], err, out)
	}
	dev = looptest.Attach(t, img, 0)
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, fstype, 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, 0)
	os.MkdirAll(filepath.Join(mnt, bootloader.ConfigDir), 0o755)
	e1, e2, err := bootloader.EnvCopies(bootloader.Env{bootloader.EnvDefaultSlot: bootloader.SlotA, bootloader.EnvKernelArgs: "quiet"})
	if err != nil {
		t.Fatal(err)
	}
	ready := func(v string) bootloader.SlotRecord {
		return bootloader.SlotRecord{State: bootloader.SlotReady, Version: v, Digest: "sha256:" + v, At: time.Unix(1785000000, 0).UTC()}
	}
	s1, s2, err := bootloader.SlotsCopies(bootloader.Slots{bootloader.SlotA: ready("a"), bootloader.SlotB: ready("b")})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{bootloader.EnvFile: e1, bootloader.EnvFile2: e2, bootloader.SlotsFile: s1, bootloader.SlotsFile2: s2} {
		if err := os.WriteFile(filepath.Join(mnt, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dev, fstype
}

func kernelHas(fs string) bool {
	exec.Command("modprobe", fs).Run()
	b, _ := os.ReadFile("/proc/filesystems")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[len(f)-1] == fs {
			return true
		}
	}
	return false
}

// trialBoot is init's boot control in the trial boot of slot B, on the ESP dev.
func trialBoot(t *testing.T, dev, fstype string) (*bootControl, *atomic.Int32) {
	t.Helper()
	esp := &espOwner{dir: filepath.Join(t.TempDir(), "esp"), log: testLog{t}, fstype: fstype, device: func() (string, error) { return dev, nil }}
	t.Cleanup(esp.release)
	reboots := &atomic.Int32{}
	b := &bootControl{log: testLog{t}, esp: esp, slot: bootloader.SlotB, trial: true, version: "b", bootID: "boot-1",
		boots: state.BootLog{Dir: t.TempDir()}, committedCh: make(chan struct{}), failedCh: make(chan struct{}), reboot: func(string) { reboots.Add(1) }}
	return b, reboots
}

type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) { l.t.Logf("%s", b); return len(b), nil }

// TestESPOneOwner: every path of init's that mounts the ESP (boot info, slot records,
// committing a trial, arming the next) runs at once from several goroutines while another
// process keeps looking at the mount point, as the agent's inventory does with statfs.
// Before the ESP had one owner, a busy unmount left the ESP mounted and every later mount
// failed with EBUSY until the machine was rebooted by hand.
func TestESPOneOwner(t *testing.T) {
	dev, fstype := testESP(t)
	b, reboots := trialBoot(t, dev, fstype)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The agent's inventory: statfs on the mount point, and now and then a file open in it.
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var st unix.Statfs_t
			unix.Statfs(b.esp.dir, &st)
			time.Sleep(time.Millisecond)
			if i%20 == 0 {
				if f, err := os.Open(filepath.Join(b.esp.dir, bootloader.ConfigDir)); err == nil {
					time.Sleep(5 * time.Millisecond)
					f.Close()
				}
			}
		}
	})
	var errs sync.Map
	fail := func(what string, err error) {
		if err != nil {
			errs.Store(what, err)
		}
	}
	var callers sync.WaitGroup
	for i := range 3 {
		callers.Go(func() {
			for range 15 {
				info, err := b.Info()
				fail("boot info", err)
				if err == nil && info.Slots[bootloader.SlotA].State != bootloader.SlotReady {
					t.Errorf("caller %d read slot A as %+v", i, info.Slots[bootloader.SlotA])
				}
			}
		})
	}
	callers.Go(func() {
		time.Sleep(50 * time.Millisecond)
		fail("commit", b.Commit())
		// Once committed, slot A (the old release) may be rewritten.
		for range 5 {
			fail("slot record", b.SetSlot(bootloader.SlotA, bootloader.SlotRecord{State: bootloader.SlotReady, Version: "a2", Digest: "sha256:a2"}))
		}
	})
	callers.Wait()
	fail("arming a trial", b.Reboot(supervisor.RebootRequest{TrialSlot: bootloader.SlotA, TrialArgs: "quiet x=1", Why: "test"}))
	close(stop)
	wg.Wait()
	errs.Range(func(k, v any) bool {
		t.Errorf("%s: %v", k, v)
		return true
	})

	info, err := b.Info()
	if err != nil {
		t.Fatalf("boot info after the storm: %v", err)
	}
	if !info.Committed || info.DefaultSlot != bootloader.SlotB || info.Slots[bootloader.SlotA].Version != "a2" || reboots.Load() != 1 {
		t.Errorf("after: committed %v, default slot %s, slot A %+v, reboots %d", info.Committed, info.DefaultSlot, info.Slots[bootloader.SlotA], reboots.Load())
	}
	b.withESP(func(e bootloader.ESP) error {
		env, err := e.Env()
		if err != nil || env[bootloader.EnvTrialSlot] != bootloader.SlotA || env[bootloader.EnvTrialArgs] != "quiet x=1" {
			t.Errorf("GRUB's environment after arming: %v %v", env, err)
		}
		return nil
	})
	if n := mountsAt(b.esp.dir); n != 1 {
		t.Errorf("%d mounts at the ESP's mount point after the calls, want only its private bind", n)
	}
}

// TestESPLeftMounted: a mount that stays busy is detached, and one left behind (by a
// process killed while it held it) is taken down: the next call works either way.
func TestESPLeftMounted(t *testing.T) {
	dev, fstype := testESP(t)
	b, _ := trialBoot(t, dev, fstype)

	// A file held open in the ESP for longer than the unmount's retries.
	var held *os.File
	err := b.withESP(func(e bootloader.ESP) error {
		var err error
		held, err = os.Open(filepath.Join(e.Dir, bootloader.EnvFile))
		return err
	})
	if err != nil {
		t.Fatalf("a busy ESP: %v", err)
	}
	if _, err := b.Info(); err != nil {
		t.Errorf("boot info while the old mount is still held: %v", err)
	}
	held.Close()

	// A mount left on the mount point, as a crash between mount and unmount leaves it.
	if err := unix.Mount(dev, b.esp.dir, fstype, 0, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Info(); err != nil {
		t.Errorf("boot info with a mount left behind: %v", err)
	}
	if n := mountsAt(b.esp.dir); n != 1 {
		t.Errorf("%d mounts at the ESP's mount point, want only its private bind", n)
	}

	// A fresh owner (init restarted) finds the ESP mounted with no bind beneath.
	b.esp.release()
	if err := unix.Mount(dev, b.esp.dir, fstype, 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Errorf("commit with the ESP found mounted at the first use: %v", err)
	}
	if n := mountsAt(b.esp.dir); n != 1 {
		t.Errorf("%d mounts at the ESP's mount point, want only its private bind", n)
	}
}

// TestFailTrial: the agent ends a trial whose gates failed: the boot log says so, init
// reboots once (into the last good slot, which the boot loader made the next boot), the
// deadline's wait ends, and neither a commit nor a second end follows.
func TestFailTrial(t *testing.T) {
	b, reboots := trialBoot(t, "", "")
	b.record(func(r *state.BootRecord) { r.ID, r.Slot, r.Trial = b.bootID, b.slot, true })
	if err := b.FailTrial(state.EndGatesFailed, "gate smoke: Job smoke-x failed"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.failedCh:
	default:
		t.Error("the deadline's wait was not told the trial ended")
	}
	if n := reboots.Load(); n != 1 {
		t.Errorf("%d reboots; want 1", n)
	}
	boots, err := b.boots.Load()
	if err != nil || len(boots) == 0 {
		t.Fatalf("boot log: %v %v", boots, err)
	}
	if last := boots[len(boots)-1]; last.End != state.EndGatesFailed || last.Message != "gate smoke: Job smoke-x failed" {
		t.Errorf("boot record: end %q, message %q", last.End, last.Message)
	}
	if err := b.Commit(); err == nil || !strings.Contains(err.Error(), "the agent ended this trial") {
		t.Errorf("a commit after the end: %v", err)
	}
	if err := b.FailTrial(state.EndGatesFailed, "again"); err == nil || !strings.Contains(err.Error(), "already under way") {
		t.Errorf("a second end: %v", err)
	}
	if n := reboots.Load(); n != 1 {
		t.Errorf("%d reboots after the refused calls; want 1", n)
	}
	// An end the agent may not give is refused, and ends nothing.
	peers, _ := trialBoot(t, "", "")
	if err := peers.FailTrial(state.EndHealthDeadline, "x"); err == nil || !strings.Contains(err.Error(), "cannot end") {
		t.Errorf("an end the agent may not give: %v", err)
	}
	// A server's network trial no peer reached ends the same way, its record saying so.
	peers.record(func(r *state.BootRecord) { r.ID, r.Slot, r.Trial = peers.bootID, peers.slot, true })
	if err := peers.FailTrial(state.EndPeersUnreachable, "none of a1 renewed its Node Lease through it"); err != nil {
		t.Fatal(err)
	}
	if boots, err := peers.boots.Load(); err != nil || len(boots) == 0 || boots[len(boots)-1].End != state.EndPeersUnreachable {
		t.Errorf("boot log after a peers' end: %+v %v", boots, err)
	}
	notTrial := &bootControl{log: testLog{t}, boots: state.BootLog{Dir: t.TempDir()}, failedCh: make(chan struct{}), reboot: func(string) { reboots.Add(1) }}
	if err := notTrial.FailTrial(state.EndPeersUnreachable, "x"); err == nil || !strings.Contains(err.Error(), "not a trial") {
		t.Errorf("ending a boot that is no trial: %v", err)
	}
}
