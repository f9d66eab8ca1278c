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
	fmt.Fprintf(log, "liken-init: trial boot: watchdog armed in the initramfs, %s%s\n", d.Timeout, WatchdogNote(d))
	return d
}

// WatchdogNote says which watchdog is armed, and what differed from the request, for the
// console line that says it was armed: ", i6300ESB timer", or softdog's warning that it
// does not end a hang of the kernel itself.
func WatchdogNote(d *watchdog.Dog) string {
	out := ""
	switch {
	case d.Identity == "":
		out = ", a driver that does not say its name"
	case watchdog.Software(d.Identity):
		out = ", " + d.Identity + " (softdog: no hardware watchdog liken drives was found; a hang of the kernel itself will not reset the machine)"
	default:
		out = ", " + d.Identity
	}
	if d.Note != "" {
		out += " (" + d.Note + ")"
	}
	return out
}
