package initramfs

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"liken.dev/liken/internal/host/watchdog"
)

// WatchdogTimeout is the timeout liken.watchdog gives (seconds), 60 s by default.
func WatchdogTimeout(cmd Cmdline) time.Duration {
	if n, err := strconv.Atoi(cmd["liken.watchdog"]); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 60 * time.Second
}

// armTrialWatchdog arms the hardware watchdog on a trial boot, so a hang before init runs
// (mounting the slot, say) resets the machine, and the boot after it is the last good slot.
// It is pinged while the initramfs works and handed over to init still armed. Nil when this
// boot is no trial, or without a watchdog.
func armTrialWatchdog(log io.Writer, cmd Cmdline) *watchdog.Dog {
	if cmd["liken.trial"] != "1" {
		return nil
	}
	d, err := watchdog.Arm(watchdog.Device, WatchdogTimeout(cmd))
	if err != nil {
		fmt.Fprintf(log, "liken-init: no watchdog in the initramfs (%v): a hang before init will not end this trial\n", err)
		return nil
	}
	fmt.Fprintf(log, "liken-init: trial boot: watchdog armed in the initramfs, %s%s\n", d.Timeout, note(d))
	return d
}

func note(d *watchdog.Dog) string {
	if d.Note == "" {
		return ""
	}
	return " (" + d.Note + ")"
}
