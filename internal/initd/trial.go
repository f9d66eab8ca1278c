package initd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchdogFed is cleared only by the hang test fault.
var watchdogFed = func() *atomic.Bool { var b atomic.Bool; b.Store(true); return &b }()

// trialDeadline is how long a trial boot may take to be found healthy
// (liken.trial.deadline=SECONDS; default 10 minutes).
func (s *system) trialDeadline() time.Duration {
	if n, err := strconv.Atoi(s.cmd["liken.trial.deadline"]); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 10 * time.Minute
}

// Watchdog ioctls and flags (linux/watchdog.h).
const (
	wdiocGetBootStatus = 0x80045702
	wdiocKeepalive     = 0x80045705
	wdiocSetTimeout    = 0xC0045706
	wdiofCardReset     = 0x0020 // the watchdog reset the machine before this boot
)

// watchdog arms the hardware watchdog, when the machine has one, and pings it while init
// runs: a kernel or init that hangs stops the pings and the machine resets, which during a
// trial ends on the last good slot. stop disarms it for a clean shutdown; reset says the
// watchdog reset the machine before this boot, when the device can tell.
func (s *system) watchdog() (stop func(), reset bool) {
	f, err := os.OpenFile("/dev/watchdog", os.O_WRONLY, 0)
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: no watchdog (%v): a hang will not reset this machine\n", err)
		return func() {}, false
	}
	var status int32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocGetBootStatus, uintptr(unsafe.Pointer(&status))); e == 0 {
		reset = status&wdiofCardReset != 0
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
	}, reset
}

// readPstore returns the kernel log a panic left in the firmware's store (efi_pstore) and
// removes it, freeing the firmware's variable space. Empty when there is none.
func readPstore(log io.Writer) string {
	const dir = "/sys/fs/pstore"
	if err := unix.Mount("pstore", dir, "pstore", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		fmt.Fprintf(log, "liken-init: no pstore (%v): a panic's log will not survive the reboot\n", err)
		return ""
	}
	entries, _ := os.ReadDir(dir)
	var parts []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "dmesg-") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if b, err := os.ReadFile(p); err == nil {
			parts = append(parts, string(b))
		}
		os.Remove(p)
	}
	if len(parts) == 0 {
		return ""
	}
	// Each record holds the end of the log; keep the lines that say why.
	text := strings.Join(parts, "\n")
	// The panic's own line first, then what led to it; never the call trace ("+0x").
	var panics, keep []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.Contains(l, "+0x"):
		case strings.Contains(l, "Kernel panic"):
			panics = append(panics, l)
		case strings.Contains(l, "Attempted to kill init") || strings.Contains(l, "BUG:") || strings.Contains(l, "Oops"):
			keep = append(keep, l)
		}
	}
	keep = append(panics, keep...)
	if len(keep) == 0 {
		keep = []string{"a kernel log was kept but says no more"}
	}
	if len(keep) > 8 {
		keep = keep[len(keep)-8:]
	}
	msg := strings.Join(keep, "\n")
	fmt.Fprintf(log, "liken-init: the previous boot ended in a kernel panic:\n%s\n", msg)
	return msg
}
