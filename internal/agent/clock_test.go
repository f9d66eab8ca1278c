package agent

import (
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/clock"
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
