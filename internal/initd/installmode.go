package initd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/host/hardware"
	"liken.dev/liken/internal/initramfs"
	"liken.dev/liken/internal/installer"
)

// installMode is this boot when the installer image booted it (liken.install=): the
// machine is installed from the image (internal/installer) and rebooted into what was
// installed; a refusal says why on every console and powers the machine off after a
// while, with nothing written. Nothing of a booted system runs: no state partition, no
// network, no k3s.
func (s *system) installMode() error {
	go reap()
	fmt.Fprintf(s.log, "liken-init: this is liken's installer, release %s: it installs this machine from the image and reboots into it\n", s.version)
	if err := unix.Mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mounting /tmp: %w", err)
	}
	// The network drivers too: a Machine is matched by its MACs.
	for _, step := range []struct {
		name string
		fn   func() error
	}{{"loading the system modules", s.modules}, {"loading the drivers of the hardware present", s.coldplug}} {
		if err := step.fn(); err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
	}
	hw := hardware.Default.Read()
	env := installer.Env{Medium: initramfs.MediumDir, ManifestDigest: s.cmd["liken.install.manifest"], Dev: "/dev", Sys: "/sys", MACs: LocalMACs(), Serial: hw.System.Serial,
		Disks: hw.Disks, Tools: installer.ImageTools(), Log: s.log}
	plan, err := installer.Decide(env)
	if err == nil {
		fmt.Fprintf(s.log, "liken-installer: this is Machine %s (%s, found by %s); installing release %s on %s (%s)%s\n",
			plan.Machine.Name, plan.Machine.Spec.Role, plan.How, plan.Manifest.Version, plan.Disk, plan.Why, wipeNote(plan.Wipe))
		start := time.Now()
		release := holdReaper() // mke2fs and mkfs.fat are waited for by install
		_, err = installer.Install(context.Background(), env, plan)
		release()
		if err == nil {
			unix.Sync()
			fmt.Fprintf(s.log, "liken-installer: installed Machine %s on %s in %s; rebooting into it in 5 s\n", plan.Machine.Name, plan.Disk, time.Since(start).Round(100*time.Millisecond))
			time.Sleep(5 * time.Second)
			return unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
		}
	}
	wait := 60 * time.Second
	if v, perr := strconv.Atoi(s.cmd["liken.test.installer-wait"]); perr == nil {
		wait = time.Duration(v) * time.Second // VM tests: a refusal's wait, shortened
	}
	var refused *installer.Refusal
	if errors.As(err, &refused) {
		fmt.Fprintf(s.log, "liken-installer: refused: %v\n", err)
	} else {
		fmt.Fprintf(s.log, "liken-installer: the install failed: %v\n", err)
	}
	fmt.Fprintf(s.log, "liken-installer: powering off in %s\n", wait)
	time.Sleep(wait)
	unix.Sync()
	os.Stdout.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

func wipeNote(w bool) string {
	if w {
		return "; erasing what it holds, as the Machine's wipe allows"
	}
	return ""
}
