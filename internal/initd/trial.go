package initd

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/initramfs"
)

const espMount = "/run/liken/esp"

// watchdogFed is cleared only by the hang test fault.
var watchdogFed = func() *atomic.Bool { var b atomic.Bool; b.Store(true); return &b }()

// commitSlot makes slot the boot loader's default: the trial succeeded. The environment
// block is rewritten in place (GRUB's format never changes size).
func commitSlot(slot string) error {
	dev, err := initramfs.WaitForDevice("PARTLABEL="+disk.ESP, 10*time.Second)
	if err != nil {
		return err
	}
	os.MkdirAll(espMount, 0o700)
	if err := unix.Mount(dev, espMount, "vfat", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting the ESP: %w", err)
	}
	defer unix.Unmount(espMount, 0)
	p := filepath.Join(espMount, bootloader.EnvFile)
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	env, err := bootloader.ParseEnv(b)
	if err != nil {
		return err
	}
	env["default_slot"], env["trial_slot"] = slot, ""
	nb, err := env.Encode()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(nb, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// trialDeadline is how long a trial boot may take to be found healthy
// (liken.trial.deadline=SECONDS; default 10 minutes).
func (s *system) trialDeadline() time.Duration {
	if n, err := strconv.Atoi(s.cmd["liken.trial.deadline"]); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 10 * time.Minute
}

// Watchdog ioctls (linux/watchdog.h).
const (
	wdiocKeepalive  = 0x80045705
	wdiocSetTimeout = 0xC0045706
)

// watchdog arms the hardware watchdog, when the machine has one, and pings it while init
// runs: a kernel or init that hangs stops the pings and the machine resets, which during a
// trial ends on the last good slot. stop disarms it for a clean shutdown.
func (s *system) watchdog() (stop func()) {
	f, err := os.OpenFile("/dev/watchdog", os.O_WRONLY, 0)
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: no watchdog (%v): a hang will not reset this machine\n", err)
		return func() {}
	}
	timeout := 60
	if n, err := strconv.Atoi(s.cmd["liken.watchdog"]); err == nil && n > 0 {
		timeout = n
	}
	t := int32(timeout)
	unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocSetTimeout, uintptr(unsafe.Pointer(&t)))
	fmt.Fprintf(s.log, "liken-init: watchdog armed, %d s\n", t)
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(time.Duration(t) * time.Second / 4)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if watchdogFed.Load() {
					unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocKeepalive, 0)
				}
			}
		}
	}()
	return func() {
		close(done)
		f.Write([]byte("V")) // the magic close: disarm
		f.Close()
	}
}

// injectTrialFault makes a trial boot fail the way the VM tests ask (liken.test.fail on the
// kernel command line), to prove every failure ends on the last good slot. Without the
// parameter it does nothing.
func (s *system) injectTrialFault() {
	switch f := s.cmd["liken.test.fail"]; f {
	case "":
	case "panic":
		fmt.Fprintln(s.log, "liken-init: test fault: kernel panic")
		os.WriteFile("/proc/sys/kernel/sysrq", []byte("1"), 0o644)
		os.WriteFile("/proc/sysrq-trigger", []byte("c"), 0o200)
	case "init-exit":
		fmt.Fprintln(s.log, "liken-init: test fault: init exits")
		os.Exit(1) // PID 1 exiting panics the kernel
	case "hang":
		fmt.Fprintln(s.log, "liken-init: test fault: the machine hangs (the watchdog is no longer fed)")
		// Freeze every other process and stop feeding the watchdog: only the watchdog can
		// end this boot.
		unix.Kill(-1, unix.SIGSTOP)
		watchdogFed.Store(false)
		select {}
	default:
		fmt.Fprintf(s.log, "liken-init: unknown test fault %q ignored\n", f)
	}
}
