// Package vmtest runs a package's Go tests as PID 1 of a QEMU machine booted with the
// release's Debian kernel, for tests that need what the host's kernel may lack (bonding,
// 802.1Q VLANs): test/vm builds the test binary, packs it as the initramfs's init with the
// modules it needs, boots it, and reads the verdict from the console. A package opts in
// from its TestMain:
//
//	func TestMain(m *testing.M) { vmtest.Main(m) }
package vmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/initramfs"
)

// ExitMarker starts the line the test binary prints as PID 1 before it powers off.
const ExitMarker = "vmtest: exit "

// Main runs the tests. As PID 1 it first mounts what tests need and loads the modules the
// initramfs lists, and at the end says the exit code and powers the machine off; otherwise
// it is m.Run.
func Main(m interface{ Run() int }) {
	if os.Getpid() != 1 {
		os.Exit(m.Run())
	}
	for _, mnt := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}, {"tmpfs", "/tmp", "tmpfs"}, {"tmpfs", "/run", "tmpfs"},
	} {
		os.MkdirAll(mnt.dst, 0o755)
		if err := unix.Mount(mnt.src, mnt.dst, mnt.fs, 0, ""); err != nil {
			fmt.Printf("vmtest: mounting %s: %v\n", mnt.dst, err)
		}
	}
	krel, _ := os.ReadFile("/etc/liken/kernel-release")
	if err := initramfs.LoadModules(os.Stdout, filepath.Join("/lib/modules", strings.TrimSpace(string(krel))), initramfs.BootModulesList); err != nil {
		fmt.Printf("vmtest: %v\n", err)
	}
	code := m.Run()
	fmt.Printf("%s%d\n", ExitMarker, code)
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
