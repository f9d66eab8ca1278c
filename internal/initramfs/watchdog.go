package initramfs

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watchdog ioctls (linux/watchdog.h).
const (
	wdiocKeepalive  = 0x80045705
	wdiocSetTimeout = 0xC0045706
)

// trialWatchdog is the hardware watchdog armed by a trial boot's initramfs, so a hang before
// init runs (mounting the slot, say) resets the machine, and the boot after it is the last
// good slot. It is pinged while the initramfs works and handed over to init still armed.
type trialWatchdog struct {
	f    *os.File
	done chan struct{}
	// fed is cleared only by the test fault that hangs the initramfs.
	fed atomic.Bool
}

// armTrialWatchdog arms the watchdog with the timeout liken.watchdog gives (seconds, default
// 60, as init's) when this boot is a trial; nil otherwise, or without a watchdog.
func armTrialWatchdog(log io.Writer, cmd Cmdline) *trialWatchdog {
	if cmd["liken.trial"] != "1" {
		return nil
	}
	f, err := os.OpenFile("/dev/watchdog", os.O_WRONLY, 0)
	if err != nil {
		fmt.Fprintf(log, "liken-init: no watchdog in the initramfs (%v): a hang before init will not end this trial\n", err)
		return nil
	}
	t := int32(60)
	if n, err := strconv.Atoi(cmd["liken.watchdog"]); err == nil && n > 0 {
		t = int32(n)
	}
	unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocSetTimeout, uintptr(unsafe.Pointer(&t)))
	w := &trialWatchdog{f: f, done: make(chan struct{})}
	w.fed.Store(true)
	go func() {
		tick := time.NewTicker(time.Duration(t) * time.Second / 4)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-tick.C:
				if w.fed.Load() {
					unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocKeepalive, 0)
				}
			}
		}
	}()
	fmt.Fprintf(log, "liken-init: trial boot: watchdog armed in the initramfs, %d s\n", t)
	return w
}

// handOver pings once more and closes the device without the magic character, so the
// watchdog stays armed ("watchdog did not stop!") until init opens and pings it.
func (w *trialWatchdog) handOver() {
	if w == nil {
		return
	}
	close(w.done)
	unix.Syscall(unix.SYS_IOCTL, w.f.Fd(), wdiocKeepalive, 0)
	w.f.Close()
}
