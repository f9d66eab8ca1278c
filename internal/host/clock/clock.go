// Package clock sets a machine's clock from NTP servers: at boot, before k3s first starts
// (a clock in the past or the future breaks the certificates k3s makes and checks), and
// while the machine runs. The NTP client is github.com/beevik/ntp; this package chooses the
// servers, validates the answers, and steps or slews the clock.
package clock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/beevik/ntp"
	"golang.org/x/sys/unix"
)

// Sync is one setting of the clock from a server.
type Sync struct {
	Server string
	// Offset is how far the clock moved: the server's time minus the clock's.
	Offset time.Duration
	At     time.Time
}

// Clock reads servers and moves the system clock; its zero value is this machine's.
type Clock struct {
	// Query asks one server for the clock's offset; nil asks it over NTP.
	Query func(server string) (time.Duration, error)
	// Step sets the clock by offset at once; nil sets the system clock and the hardware
	// clock (so the next boot starts near the right time).
	Step func(offset time.Duration) error
	// Slew moves the clock by offset gradually; nil asks the kernel (adjtime).
	Slew func(offset time.Duration) error
	Now  func() time.Time
}

// QueryTimeout bounds one server's answer.
const QueryTimeout = 3 * time.Second

func (c Clock) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c Clock) query(server string) (time.Duration, error) {
	if c.Query != nil {
		return c.Query(server)
	}
	r, err := ntp.QueryWithOptions(server, ntp.QueryOptions{Timeout: QueryTimeout})
	if err != nil {
		return 0, err
	}
	if err := r.Validate(); err != nil {
		return 0, fmt.Errorf("unusable answer: %w", err)
	}
	return r.ClockOffset, nil
}

// Ask asks the servers in order and returns the first valid answer's offset.
func (c Clock) Ask(servers []string) (server string, offset time.Duration, err error) {
	if len(servers) == 0 {
		return "", 0, errors.New("no time servers: set the Cluster's spec.timeServers or have DHCP name them (option 42)")
	}
	var errs []string
	for _, s := range servers {
		off, err := c.query(s)
		if err == nil {
			return s, off, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", s, err))
	}
	return "", 0, fmt.Errorf("no time server answered: %s", strings.Join(errs, "; "))
}

// SlewLimit is the largest offset Keep slews; a larger one is stepped.
const SlewLimit = 500 * time.Millisecond

// Keep sets the clock from the first server that answers while the machine runs: an
// offset within SlewLimit is slewed, so time never runs backwards under k3s; a larger one
// is stepped.
func (c Clock) Keep(servers []string) (*Sync, error) {
	server, off, err := c.Ask(servers)
	if err != nil {
		return nil, err
	}
	move := c.Step
	if off.Abs() <= SlewLimit {
		move = c.Slew
		if move == nil {
			move = slew
		}
	} else if move == nil {
		move = step
	}
	if err := move(off); err != nil {
		return nil, fmt.Errorf("setting the clock by %s from %s: %w", off, server, err)
	}
	return &Sync{Server: server, Offset: off, At: c.now()}, nil
}

// AtBoot sets the clock before k3s first starts. It steps the clock from the first server
// that answers. While no server answers and the clock reads earlier than notBefore (the
// release's build time, which no right clock can precede), it says why on log and asks
// again every retry, until ctx ends; with a plausible clock it gives up after one round.
// It returns the sync, or nil when the clock stays as the hardware clock started it.
func (c Clock) AtBoot(ctx context.Context, servers []string, notBefore time.Time, retry time.Duration, log io.Writer) (*Sync, error) {
	if c.Step == nil {
		c.Step = step
	}
	for said := false; ; {
		server, off, err := c.Ask(servers)
		if err == nil {
			if err := c.Step(off); err != nil {
				return nil, fmt.Errorf("setting the clock by %s from %s: %w", off, server, err)
			}
			return &Sync{Server: server, Offset: off, At: c.now()}, nil
		}
		now := c.now()
		if !now.Before(notBefore) {
			fmt.Fprintf(log, "liken-init: clock: %v; keeping the hardware clock's time, %s\n", err, now.UTC().Format(time.RFC3339))
			return nil, nil
		}
		if !said {
			fmt.Fprintf(log, "liken-init: clock: it reads %s, before this release was built (%s), and %v: not starting k3s until a time server answers (asking every %s)\n",
				now.UTC().Format(time.RFC3339), notBefore.UTC().Format(time.RFC3339), err, retry)
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the clock reads %s, before this release was built (%s): %w", now.UTC().Format(time.RFC3339), notBefore.UTC().Format(time.RFC3339), err)
		case <-time.After(retry):
		}
	}
}

// step sets the system clock by off, then, as it can, the hardware clock to match.
func step(off time.Duration) error {
	now := time.Now().Add(off)
	tv := unix.NsecToTimeval(now.UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		return fmt.Errorf("settimeofday: %w", err)
	}
	// The hardware clock only makes the next boot start nearer the time: some refuse to be
	// written (read-only or firmware-owned RTCs), and the system clock is right anyway.
	setRTC(now)
	return nil
}

// setRTC writes t, in UTC as liken keeps the hardware clock, to /dev/rtc0.
func setRTC(t time.Time) error {
	f, err := os.OpenFile("/dev/rtc0", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	t = t.UTC()
	return unix.IoctlSetRTCTime(int(f.Fd()), &unix.RTCTime{
		Sec: int32(t.Second()), Min: int32(t.Minute()), Hour: int32(t.Hour()),
		Mday: int32(t.Day()), Mon: int32(t.Month()) - 1, Year: int32(t.Year()) - 1900,
	})
}

// slew asks the kernel to move the clock by off gradually, as adjtime(3) does.
func slew(off time.Duration) error {
	tx := unix.Timex{Modes: unix.ADJ_OFFSET_SINGLESHOT, Offset: off.Microseconds()}
	if _, err := unix.Adjtimex(&tx); err != nil {
		return fmt.Errorf("adjtimex: %w", err)
	}
	return nil
}
