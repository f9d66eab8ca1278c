package initd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/host/watchdog"
	"liken.dev/liken/internal/initramfs"
)

// trialDeadline is how long a trial boot may take to be found healthy
// (liken.trial.deadline=SECONDS; default 10 minutes).
func (s *system) trialDeadline() time.Duration {
	if n, err := strconv.Atoi(s.cmd["liken.trial.deadline"]); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 10 * time.Minute
}

// peerWait is how long a server's trial of new network settings, healthy on its own, waits
// for another machine to reach it (liken.trial.peerwait=SECONDS), passed to the agent; zero
// leaves the agent's default, three of the peers' Node Lease durations.
func (s *system) peerWait() time.Duration {
	if n, err := strconv.Atoi(s.cmd["liken.trial.peerwait"]); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 0
}

// armWatchdog arms the hardware watchdog, when the machine has one, and pings it while init
// runs: a kernel or init that hangs stops the pings and the machine resets, which during a
// trial ends on the last good slot. On a trial the initramfs armed it already and handed it
// over; opening it again keeps it armed.
func (s *system) armWatchdog() {
	d, err := watchdog.Arm(watchdog.Device, initramfs.WatchdogTimeout(s.cmd))
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: no watchdog (%v): a hang will not reset this machine\n", err)
		return
	}
	s.watchdog, s.watchdogReset = d, d.Reset
	fmt.Fprintf(s.log, "liken-init: watchdog armed, %s%s\n", d.Timeout, initramfs.WatchdogNote(d))
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
