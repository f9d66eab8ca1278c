package clock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/test/ntpserver"
)

// TestAskOverNTP asks a real NTP server over UDP (test/ntpserver, its clock moved by a
// known shift) through the library, and gets the shift back as the offset.
func TestAskOverNTP(t *testing.T) {
	for _, shift := range []time.Duration{25 * 365 * 24 * time.Hour, -3 * time.Hour, 0} {
		srv, err := ntpserver.Start("127.0.0.1:0", shift)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		server, off, err := Clock{}.Ask([]string{"127.0.0.1:1", srv.Addr().String()})
		if err != nil {
			t.Fatalf("shift %s: %v", shift, err)
		}
		if server != srv.Addr().String() {
			t.Errorf("answered by %s, want %s (the first server does not answer)", server, srv.Addr())
		}
		if d := (off - shift).Abs(); d > 100*time.Millisecond {
			t.Errorf("shift %s: offset %s", shift, off)
		}
	}
}

func TestAskWithoutServers(t *testing.T) {
	if _, _, err := (Clock{}).Ask(nil); err == nil || !strings.Contains(err.Error(), "spec.timeServers") {
		t.Fatalf("Ask(nil) = %v", err)
	}
}

// fakeClock is the host side: a clock in a test that Step and Slew move.
type fakeClock struct {
	now            time.Time
	steps, slews   []time.Duration
	answerAfter    int // queries before the server answers
	queries        int
	offsetAnswered time.Duration
}

func (f *fakeClock) clock() Clock {
	return Clock{
		Query: func(string) (time.Duration, error) {
			f.queries++
			if f.queries <= f.answerAfter {
				return 0, errors.New("i/o timeout")
			}
			return f.offsetAnswered, nil
		},
		Step: func(d time.Duration) error { f.steps = append(f.steps, d); f.now = f.now.Add(d); return nil },
		Slew: func(d time.Duration) error { f.slews = append(f.slews, d); f.now = f.now.Add(d); return nil },
		Now:  func() time.Time { return f.now },
	}
}

func TestAtBoot(t *testing.T) {
	built := time.Date(2026, 7, 25, 0, 0, 0, 0, time.UTC)
	rtc2001 := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	right := time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		start       time.Time
		answerAfter int
		servers     []string
		wantSync    bool
		wantErr     bool
		wantSaid    string
	}{
		{"RTC in 2001, server answers", rtc2001, 0, []string{"a"}, true, false, ""},
		{"RTC in 2001, server answers on the third round", rtc2001, 2, []string{"a"}, true, false, "not starting k3s until a time server answers"},
		{"RTC right, no answer: boots on the RTC", right, 1000, []string{"a"}, false, false, "keeping the hardware clock's time"},
		{"RTC in 2001, no servers: waits", rtc2001, 0, nil, false, true, "no time servers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeClock{now: tc.start, answerAfter: tc.answerAfter, offsetAnswered: right.Sub(tc.start)}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var log strings.Builder
			sync, err := f.clock().AtBoot(ctx, tc.servers, built, 10*time.Millisecond, &log)
			if (err != nil) != tc.wantErr || (sync != nil) != tc.wantSync {
				t.Fatalf("AtBoot = %+v, %v", sync, err)
			}
			if tc.wantSync && (!f.now.Equal(right) || len(f.steps) != 1 || len(f.slews) != 0) {
				t.Errorf("the clock reads %s after steps %v, slews %v; want %s in one step", f.now, f.steps, f.slews, right)
			}
			if !tc.wantSync && len(f.steps) != 0 {
				t.Errorf("stepped %v with no answer", f.steps)
			}
			if !strings.Contains(log.String(), tc.wantSaid) {
				t.Errorf("log %q does not say %q", log.String(), tc.wantSaid)
			}
			if tc.wantErr && !strings.Contains(err.Error(), "before this release was built") {
				t.Errorf("error %v does not say why k3s waits", err)
			}
		})
	}
}

// TestKeepSlewsSmallOffsets: while k3s runs, a small offset is slewed (time never runs
// backwards), a large one stepped.
func TestKeepSlewsSmallOffsets(t *testing.T) {
	for _, tc := range []struct {
		off  time.Duration
		slew bool
	}{
		{-200 * time.Millisecond, true}, {SlewLimit, true}, {3 * time.Second, false}, {-2 * time.Hour, false},
	} {
		f := &fakeClock{now: time.Unix(1790000000, 0), offsetAnswered: tc.off}
		sync, err := f.clock().Keep([]string{"a"})
		if err != nil || sync.Offset != tc.off {
			t.Fatalf("Keep: %+v %v", sync, err)
		}
		if slewed := len(f.slews) == 1 && len(f.steps) == 0; slewed != tc.slew {
			t.Errorf("offset %s: slews %v, steps %v; want slewed %v", tc.off, f.slews, f.steps, tc.slew)
		}
	}
}
