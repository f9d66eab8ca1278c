//go:build likentest

package initd

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

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
