package agent

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/clock"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

// TestAgentKeepsTheClock: the agent sets the clock from the Cluster's time servers as it
// runs; a change of servers is live; a small offset is slewed, a large one stepped; status
// shows the source and offset, and why no server answered. The clock is the host side of
// the test (the host's own clock is not the test's to set): the servers' answers are given.
func TestAgentKeepsTheClock(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"c1": v1alpha1.RoleAgent})
	var mu sync.Mutex
	var steps, slews []time.Duration
	answers := map[string]time.Duration{"near.example": 200 * time.Millisecond, "far.example": 3 * time.Second}
	c1 := newSim(t, "c1", v1alpha1.RoleAgent)
	c1.clock = &clock.Clock{
		Query: func(server string) (time.Duration, error) {
			if off, ok := answers[server]; ok {
				return off, nil
			}
			return 0, errors.New("i/o timeout")
		},
		Step: func(d time.Duration) error { mu.Lock(); steps = append(steps, d); mu.Unlock(); return nil },
		Slew: func(d time.Duration) error { mu.Lock(); slews = append(slews, d); mu.Unlock(); return nil },
	}
	c1.boot(t, f)
	c1.start(t)
	defer c1.stop()
	f.waitFor(t, "c1", "no time servers reported", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := m.Status.Clock
		return c != nil && c.Source == "rtc" && c.Error != ""
	})
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.TimeServers = []string{"down.example", "near.example"} })
	f.waitFor(t, "c1", "the clock slewed from near.example", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := m.Status.Clock
		return c != nil && c.Source == "near.example" && c.Offset == "+200ms" && c.Error == "" && c.LastSync != nil
	})
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.TimeServers = []string{"far.example"} })
	f.waitFor(t, "c1", "the clock stepped from far.example", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := m.Status.Clock
		return c != nil && c.Source == "far.example" && c.Offset == "+3s"
	})
	mu.Lock()
	defer mu.Unlock()
	if len(slews) == 0 || slews[0] != 200*time.Millisecond || len(steps) == 0 || steps[0] != 3*time.Second {
		t.Errorf("slews %v, steps %v; want 200ms slewed, 3s stepped", slews, steps)
	}
	for _, d := range slews {
		if d.Abs() > clock.SlewLimit {
			t.Errorf("slewed %s, past the limit", d)
		}
	}
}

// TestClockStatusFromBoot: status.clock says how init set the clock at this boot (or that
// no server answered), until the agent sets it itself.
func TestClockStatusFromBoot(t *testing.T) {
	at := time.Date(2026, 12, 1, 16, 17, 48, 300, time.UTC)
	for _, tc := range []struct {
		name   string
		report *state.ClockSet
		keep   *state.ClockSet
		want   *v1alpha1.ClockStatus
	}{
		{"no report", nil, nil, nil},
		{"set at boot", &state.ClockSet{Server: "10.0.2.2:123", Offset: 227176*time.Hour + 1500*time.Millisecond, At: at, Took: 24 * time.Second},
			nil, &v1alpha1.ClockStatus{Source: "10.0.2.2:123", Offset: "+227176h0m1.5s",
				AtBoot: "set from 10.0.2.2:123 before k3s started: moved +227176h0m1.5s (took 24s)"}},
		{"no server at boot", &state.ClockSet{At: at}, nil, &v1alpha1.ClockStatus{Source: "rtc",
			AtBoot: "no time server answered at boot: the clock ran as the hardware clock started it"}},
		{"kept since", &state.ClockSet{At: at}, &state.ClockSet{Server: "b", Offset: -20 * time.Millisecond, At: at.Add(time.Hour)},
			&v1alpha1.ClockStatus{Source: "b", Offset: "-20ms",
				AtBoot: "no time server answered at boot: the clock ran as the hardware clock started it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{}
			if tc.report != nil {
				a.bootInfo = &supervisor.BootInfo{Report: &state.BootReport{Clock: tc.report}}
			}
			a.clock.last = tc.keep
			got := a.clockStatus()
			if got != nil {
				got.LastSync = nil // checked below
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("status.clock (-want +got):\n%s", diff)
			}
			if s := a.clockStatus(); s != nil && s.Source != "rtc" && s.LastSync == nil {
				t.Errorf("no lastSync for a set clock")
			}
		})
	}
}
