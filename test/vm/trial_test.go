package vm

import (
	"os"
	"testing"
	"time"

	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/test/report"
)

// copySlot copies slot A's contents into slot B on a disk image: B then holds a release
// that boots (the upgrade flow writes it from the channel; these tests need only a bootable B).
func copySlot(t *testing.T, diskPath string) {
	t.Helper()
	parts, err := disk.Read(diskPath)
	if err != nil {
		t.Fatal(err)
	}
	a, b := parts[disk.SlotA], parts[disk.SlotB]
	f, err := os.OpenFile(diskPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, a.Size)
	if _, err := f.ReadAt(buf, a.Offset); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(buf, b.Offset); err != nil {
		t.Fatal(err)
	}
}

// TestTrialCommitsWhenHealthy boots slot B as a one-shot trial: once k3s (the stand-in) is
// healthy, the Node Ready in the API and the agent has applied the spec, the agent asks init
// to commit, and B becomes the default. A power cut right after changes nothing.
func TestTrialCommitsWhenHealthy(t *testing.T) {
	j := joinCluster(t, "liken.trial.deadline=300")
	copySlot(t, j.disk)
	espEnv(t, j.disk, bootloader.Env{"trial_slot": "B"})
	vm := bootUEFI(t, j.disk, false, "52:54:00:12:34:01")
	expect(t, vm, "liken-grub: booting slot B (trial 1)", 120*time.Second)
	expect(t, vm, "liken-init: mounted root image from slot /dev/vda3 (PARTLABEL=liken-slot-b)", 120*time.Second)
	expect(t, vm, "liken-init: trial boot of slot B; health deadline 5m0s", 60*time.Second)
	expect(t, vm, "liken-init: watchdog armed", 60*time.Second)
	committed := expect(t, vm, "liken-init: trial of slot B committed", 240*time.Second)
	vm.Kill() // a power cut once committed
	env := espEnv(t, j.disk, nil)
	if env["default_slot"] != "B" || env["trial_slot"] != "" {
		t.Errorf("after the commit the environment is %v; want default B and no trial", env)
	}
	report.Line("trial boot of slot B committed %s after QEMU start (TCG)", committed.Round(time.Second))
}

// TestTrialMissesHealthDeadline boots slot B as a trial whose k3s never gets ready: the agent
// never commits, init's health deadline reboots, and GRUB boots the last good slot A.
func TestTrialMissesHealthDeadline(t *testing.T) {
	j := joinCluster(t, "liken.trial.deadline=40 liken.test.k3s-fault=never-ready")
	copySlot(t, j.disk)
	espEnv(t, j.disk, bootloader.Env{"trial_slot": "B"})
	vm, err := Boot(Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: j.disk}}, AllowReboot: true, NICs: []string{"52:54:00:12:34:01"}})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Kill()
	defer func() {
		if t.Failed() {
			t.Logf("console:\n%s", vm.Console())
		}
	}()
	expect(t, vm, "liken-grub: booting slot B (trial 1)", 120*time.Second)
	expect(t, vm, "liken-init: trial of slot B missed its health deadline; rebooting into the last good slot", 240*time.Second)
	back := expect(t, vm, "liken-grub: booting slot A (trial 0)", 180*time.Second)
	expect(t, vm, "liken-init: system stage", 120*time.Second)
	env := espEnv(t, j.disk, nil)
	if env["default_slot"] != "A" || env["trial_slot"] != "" {
		t.Errorf("after the failed trial the environment is %v; want default A and no trial", env)
	}
	report.Line("trial that missed its 40 s health deadline was back on slot A %s after QEMU start (TCG)", back.Round(time.Second))
}

// TestEveryTrialFailureEndsOnSlotA boots slot B as a trial that fails in each way the issue
// names; each must end with the machine booting the last good slot A. The faults come from
// liken.test.fail on the kernel command line (init's test switches); the power cut is QEMU
// killed during the trial.
func TestEveryTrialFailureEndsOnSlotA(t *testing.T) {
	for _, tc := range []struct {
		fault, marker string
	}{
		{"panic", "Kernel panic"},
		{"init-exit", "Attempted to kill init"},
		{"hang", "liken-init: test fault: the machine hangs"},
		{"power-cut", "liken-init: trial boot of slot B"},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			args := "liken.watchdog=20"
			if tc.fault != "power-cut" {
				args += " liken.test.fail=" + tc.fault
			}
			j := joinCluster(t, args)
			copySlot(t, j.disk)
			espEnv(t, j.disk, bootloader.Env{"trial_slot": "B"})
			start := time.Now()
			vm, err := Boot(Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: j.disk}}, AllowReboot: true, NICs: []string{"52:54:00:12:34:01"}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if t.Failed() {
					t.Logf("console:\n%s", vm.Console())
				}
				vm.Kill()
			}()
			expect(t, vm, "liken-grub: booting slot B (trial 1)", 120*time.Second)
			expect(t, vm, tc.marker, 180*time.Second)
			if tc.fault == "power-cut" {
				vm.Kill()
				if vm, err = Boot(Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: j.disk}}, NICs: []string{"52:54:00:12:34:01"}}); err != nil {
					t.Fatal(err)
				}
			}
			expect(t, vm, "liken-grub: booting slot A (trial 0)", 240*time.Second)
			expect(t, vm, "liken-init: system stage", 120*time.Second)
			if env := espEnv(t, j.disk, nil); env["default_slot"] != "A" || env["trial_slot"] != "" {
				t.Errorf("after the failed trial the environment is %v", env)
			}
			report.Line("trial failure %q: back on slot A in %s (TCG)", tc.fault, time.Since(start).Round(time.Second))
		})
	}
}
