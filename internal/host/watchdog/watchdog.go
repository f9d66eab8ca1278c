// Package watchdog drives the hardware watchdog (/dev/watchdog): armed, it resets the
// machine unless pinged within its timeout. The initramfs arms it on a trial boot and hands
// it to init still armed; init pings it while the system runs, and until a deadline through
// its shutdown, so a hang anywhere, a shutdown's included, ends in a reset.
package watchdog

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctls and flags (linux/watchdog.h).
const (
	wdiocGetSupport    = 0x80285700 // struct watchdog_info: options, firmware version, identity[32]
	wdiocGetBootStatus = 0x80045702
	wdiocKeepalive     = 0x80045705
	wdiocSetTimeout    = 0xC0045706
	wdiocGetTimeout    = 0x80045707
	wdiofCardReset     = 0x0020
)

// Device is the watchdog's device.
const Device = "/dev/watchdog"

// Dog is an armed watchdog and the goroutine pinging it.
type Dog struct {
	f *os.File
	// Timeout is the timeout the driver took, which may differ from the one asked for.
	Timeout time.Duration
	// Reset says the watchdog reset the machine before this boot, when the device can tell.
	Reset bool
	// Note says what differed from the request (a timeout the driver would not take).
	Note string
	// Identity is the driver's name for the watchdog ("i6300ESB timer", "iTCO_wdt",
	// "Software Watchdog"): whether a hang resets the board or only a kernel still running.
	Identity string

	fed   atomic.Bool
	until atomic.Pointer[time.Time] // pings stop after this (monotonic); nil: no deadline
	done  chan struct{}
	once  sync.Once
}

// Arm opens the watchdog, which arms it, asks for a timeout of want, and pings it at a
// quarter of the timeout the driver reports. Opening it again after a hand-over keeps it
// armed without a gap.
func Arm(path string, want time.Duration) (*Dog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	d := &Dog{f: f, done: make(chan struct{})}
	var info struct {
		options, firmware uint32
		identity          [32]byte
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocGetSupport, uintptr(unsafe.Pointer(&info))); e == 0 {
		d.Identity = Identity(info.identity[:])
	}
	var status int32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocGetBootStatus, uintptr(unsafe.Pointer(&status))); e == 0 {
		d.Reset = status&wdiofCardReset != 0
	}
	t := int32(want / time.Second)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocSetTimeout, uintptr(unsafe.Pointer(&t))); e != 0 {
		d.Note = fmt.Sprintf("the driver refused a %s timeout (%v)", want, e)
	}
	var got int32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), wdiocGetTimeout, uintptr(unsafe.Pointer(&got))); e == 0 && got > 0 {
		d.Timeout = time.Duration(got) * time.Second
	}
	d.fed.Store(true)
	go d.ping(interval(d.Timeout))
	return d, nil
}

// Identity is a driver's identity as the kernel gives it (NUL-padded, at most 32 bytes).
func Identity(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return strings.TrimSpace(string(b))
}

// Software says whether identity is the kernel's softdog, which resets the machine only
// while the kernel still runs its timers: no protection from a kernel that hangs.
func Software(identity string) bool { return identity == SoftdogIdentity }

// SoftdogIdentity is softdog's identity (drivers/watchdog/softdog.c), as the API's
// v1alpha1.SoftwareWatchdog says it; kept here so that the initramfs's init does not link
// the API's packages (megabytes, under emulation seconds of every boot).
const SoftdogIdentity = "Software Watchdog"

// interval pings four times per timeout; an unknown timeout is pinged every second, which
// no driver's timeout is shorter than.
func interval(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		return time.Second
	}
	return timeout / 4
}

func (d *Dog) ping(every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-d.done:
			return
		case <-tick.C:
			if d.feeding(time.Now()) {
				unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), wdiocKeepalive, 0)
			}
		}
	}
}

// feeding says whether a ping is due at now: not once starved, nor past the deadline.
func (d *Dog) feeding(now time.Time) bool {
	u := d.until.Load()
	return d.fed.Load() && (u == nil || now.Before(*u))
}

// Starve stops the pings for good: only the watchdog can end this boot (the hang test
// faults).
func (d *Dog) Starve() {
	if d != nil {
		d.fed.Store(false)
	}
}

// PingUntil keeps pinging only until deadline (a time.Now() plus a duration, so a clock
// step does not move it): what hangs past it (a shutdown that never ends) is reset by the
// watchdog one timeout later.
func (d *Dog) PingUntil(deadline time.Time) {
	if d != nil {
		d.until.Store(&deadline)
	}
}

// HandOver pings once more and closes the device without the magic character, so the
// watchdog stays armed ("watchdog did not stop!") until the next program opens it.
func (d *Dog) HandOver() {
	if d == nil {
		return
	}
	d.once.Do(func() {
		close(d.done)
		unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), wdiocKeepalive, 0)
		d.f.Close()
	})
}

// Disarm stops the pings and closes the device with the magic character, which disarms it.
func (d *Dog) Disarm() {
	if d == nil {
		return
	}
	d.once.Do(func() {
		close(d.done)
		d.f.Write([]byte("V"))
		d.f.Close()
	})
}
