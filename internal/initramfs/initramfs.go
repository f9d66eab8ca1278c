// Package initramfs is the first stage of liken's init, /init in the initramfs (PID 1): it
// mounts the kernel's filesystems, loads the boot modules (Debian's kernel builds in no
// storage or filesystem driver), finds the slot the boot loader named, mounts it and the
// root image inside it read-only, and switches into the root image, whose /sbin/init
// (internal/initd) runs the machine. It is its own small program so the initramfs stays
// small: under emulation every megabyte of initramfs costs boot time.
package initramfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/host/console"
	"liken.dev/liken/internal/kmod"
)

// Paths inside the initramfs and the root image.
const (
	BootModulesList = "/etc/liken/boot-modules" // one file per line, relative to ModulesDir
	VersionFile     = "/etc/liken/version"
	KernelRelease   = "/etc/liken/kernel-release"
	newRoot         = "/newroot"
	// slotDir is under /run so that it moves into the booted system with /run.
	slotDir = "/run/liken/slot"
)

// Cmdline is the kernel command line's liken.* parameters.
type Cmdline map[string]string

// ParseCmdline reads key=value words; a bare word is "true".
func ParseCmdline(s string) Cmdline {
	c := Cmdline{}
	for _, w := range strings.Fields(s) {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			v = "true"
		}
		c[k] = v
	}
	return c
}

// Main runs the first stage; it never returns.
func Main() {
	con := console.New(os.Stdout)
	Fail(con, initramfsStage(con))
}

// Fail reports why the boot failed. A trial boot reboots: the boot loader already chose the
// last good slot for the next boot. Any other boot keeps PID 1 alive (exiting would panic
// the kernel) and waits for an operator: rebooting the last good slot would only fail again.
func Fail(log io.Writer, err error) {
	fmt.Fprintf(log, "liken-init: %v\n", err)
	b, _ := os.ReadFile("/proc/cmdline")
	if ParseCmdline(string(b))["liken.trial"] == "1" {
		fmt.Fprintln(log, "liken-init: this trial boot failed; rebooting into the last good slot in 5 s")
		unix.Sync()
		time.Sleep(5 * time.Second)
		unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	}
	fmt.Fprintln(log, "liken-init: boot failed; waiting for an operator")
	for {
		time.Sleep(time.Hour)
	}
}

// Uptime is the time since the kernel started, as "12.34s".
func Uptime() string {
	b, _ := os.ReadFile("/proc/uptime")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0] + "s"
}

func initramfsStage(log *console.Writer) error {
	for _, m := range []struct{ src, dst, fs string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"tmpfs", "/run", "tmpfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mounting %s: %w", m.dst, err)
		}
	}
	log.FindActive() // with /sys and /dev mounted: init's lines on the screen too
	krel, _ := os.ReadFile(KernelRelease)
	version, _ := os.ReadFile(VersionFile)
	fmt.Fprintf(log, "liken-init: initramfs stage at %s, release %s, kernel %s\n", Uptime(), strings.TrimSpace(string(version)), strings.TrimSpace(string(krel)))
	cmdlineRaw, _ := os.ReadFile("/proc/cmdline")
	cmd := ParseCmdline(string(cmdlineRaw)).WithoutTestSwitches(log)
	if err := LoadModules(log, filepath.Join("/lib/modules", strings.TrimSpace(string(krel))), BootModulesList); err != nil {
		return err
	}
	wd := armTrialWatchdog(log, cmd) // the watchdog driver is one of the boot modules
	injectFault(log, cmd, wd)        // VM tests only: liken.test.fail=initramfs-hang
	root := cmd["liken.root"]
	var dev string
	var err error
	if slot := cmd["liken.install"]; slot != "" {
		// The installer image's GRUB booted the release's kernel from the slot image it
		// carries (internal/installer): that image is the slot, and the booted system runs
		// its install mode.
		root = "the installer's " + slot
		if dev, err = mountInstaller(log, slot); err != nil {
			return err
		}
	} else {
		if root == "" {
			return errors.New("no liken.root= on the kernel command line: the boot loader names the slot to boot")
		}
		if dev, err = WaitForDevice(root, 60*time.Second); err != nil {
			return err
		}
	}
	// The slot is a FAT filesystem with the release's files; the root image inside it is
	// attached to a loop device. Both stay mounted read-only while the system runs, so the
	// running slot is in use and can never be written.
	os.MkdirAll(slotDir, 0o755)
	if err := unix.Mount(dev, slotDir, "vfat", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "utf8=0"); err != nil {
		return fmt.Errorf("mounting the slot %s: %w", dev, err)
	}
	loop, err := attachLoop(filepath.Join(slotDir, "rootfs.squashfs"))
	if err != nil {
		return err
	}
	os.MkdirAll(newRoot, 0o755)
	if err := unix.Mount(loop, newRoot, "squashfs", unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mounting the root image from %s: %w", loop, err)
	}
	fmt.Fprintf(log, "liken-init: mounted root image from slot %s (%s) read-only at %s\n", dev, root, Uptime())
	wd.HandOver()
	return switchRoot(newRoot, "/sbin/init")
}

func LoadModules(log io.Writer, dir, list string) error {
	f, err := os.Open(list)
	if err != nil {
		return fmt.Errorf("reading the module list: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n, absent := 0, 0
	start := time.Now()
	for sc.Scan() {
		file := strings.TrimSpace(sc.Text())
		if file == "" {
			continue
		}
		if err := kmod.Load(dir, file, ""); err != nil {
			// One module failing must not stop the boot. A driver whose hardware is not
			// there (sp5100_tco on an Intel board) refuses to load with ENODEV: expected,
			// counted, not shown as a failure.
			if errors.Is(err, unix.ENODEV) {
				absent++
				continue
			}
			fmt.Fprintf(log, "liken-init: %v\n", err)
			continue
		}
		n++
	}
	fmt.Fprintf(log, "liken-init: loaded %d modules in %s", n, time.Since(start).Round(time.Millisecond))
	if absent > 0 {
		fmt.Fprintf(log, " (%d more without their hardware here)", absent)
	}
	fmt.Fprintln(log)
	return sc.Err()
}

// WaitForDevice resolves PARTLABEL=name (a GPT partition name) or a /dev path, waiting for
// the kernel to find the disk.
func WaitForDevice(spec string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if label, ok := strings.CutPrefix(spec, "PARTLABEL="); ok {
			if dev := findPartLabel(label); dev != "" {
				return dev, nil
			}
		} else if _, err := os.Stat(spec); err == nil {
			return spec, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the root device %s did not appear within %s", spec, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func findPartLabel(label string) string {
	entries, _ := os.ReadDir("/sys/class/block")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/sys/class/block", e.Name(), "uevent"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l == "PARTNAME="+label {
				return "/dev/" + e.Name()
			}
		}
	}
	return ""
}

// switchRoot moves the kernel filesystems into root, makes root "/", and executes init
// there as PID 1. The initramfs is the kernel's rootfs and cannot be unmounted or
// pivoted away from; its files are deleted to free their memory (u-root's switch_root
// does the same).
func switchRoot(root, init string) error {
	for _, m := range []string{"/dev", "/proc", "/sys", "/run"} {
		os.MkdirAll(filepath.Join(root, m), 0o755)
		if err := unix.Mount(m, filepath.Join(root, m), "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("moving %s into the root image: %w", m, err)
		}
	}
	freeInitramfs(root)
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the root image to /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	env := append(os.Environ(), "LIKEN_STAGE=system")
	return fmt.Errorf("executing %s: %w", init, syscall.Exec(init, []string{init}, env))
}

// freeInitramfs deletes the initramfs's own files, staying on its device.
func freeInitramfs(keep string) {
	var st unix.Stat_t
	if unix.Stat("/", &st) != nil {
		return
	}
	dev := st.Dev
	filepath.Walk("/", func(p string, info os.FileInfo, err error) error {
		if err != nil || p == "/" {
			return nil
		}
		if p == keep || p == InitrdMedium {
			return filepath.SkipDir // the new root; a network-booted installer's files, in use
		}
		var s unix.Stat_t
		if unix.Lstat(p, &s) != nil || s.Dev != dev {
			return filepath.SkipDir
		}
		if !info.IsDir() {
			os.Remove(p)
		}
		return nil
	})
}
