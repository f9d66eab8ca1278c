package agent

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/state"
)

// clockKeeper is what the agent knows of the clock: the servers the Cluster names now (a
// change is live: the next sync uses them) and the last sync.
type clockKeeper struct {
	servers []string
	last    *state.ClockSet
	err     string
}

// applyTimeServers takes the Cluster's time servers for the next sync: a live change.
func (a *Agent) applyTimeServers(desired change.Spec) {
	a.clockMu.Lock()
	defer a.clockMu.Unlock()
	a.clock.servers = append([]string(nil), desired.Cluster.TimeServers...)
}

// keepClock sets the clock from the time servers every ClockEvery while the agent runs.
func (a *Agent) keepClock(ctx context.Context) {
	every := a.cfg.ClockEvery
	if every == 0 {
		every = 15 * time.Minute
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		a.clockMu.Lock()
		servers := append([]string(nil), a.clock.servers...)
		a.clockMu.Unlock()
		if a.cfg.DHCPTimeServers != nil {
			servers = append(servers, a.cfg.DHCPTimeServers()...)
		}
		sync, err := a.cfg.Clock.Keep(servers)
		a.clockMu.Lock()
		if err != nil {
			a.clock.err = err.Error()
			a.log.Warn("clock: not set", "err", err)
		} else {
			a.clock.err = ""
			a.clock.last = &state.ClockSet{Server: sync.Server, Offset: sync.Offset, At: sync.At}
			a.log.Info("clock: set", "server", sync.Server, "offset", sync.Offset.String())
		}
		a.clockMu.Unlock()
		a.queue.Add(keyReconcile) // status shows it
	}
}

// clockStatus is status.clock: the boot's setting by init, then the agent's own.
func (a *Agent) clockStatus() *v1alpha1.ClockStatus {
	var cs v1alpha1.ClockStatus
	if bi := a.bootInfo; bi != nil && bi.Report != nil && bi.Report.Clock != nil {
		c := bi.Report.Clock
		if c.Server == "" {
			cs.Source = "rtc"
			cs.AtBoot = "no time server answered at boot: the clock ran as the hardware clock started it"
		} else {
			cs.Source, cs.Offset = c.Server, offset(c.Offset)
			at := metav1.NewTime(c.At.UTC().Truncate(time.Second))
			cs.LastSync = &at
			cs.AtBoot = fmt.Sprintf("set from %s before k3s started: moved %s (took %s)", c.Server, offset(c.Offset), c.Took.Round(time.Millisecond))
		}
	}
	a.clockMu.Lock()
	defer a.clockMu.Unlock()
	if l := a.clock.last; l != nil {
		cs.Source, cs.Offset = l.Server, offset(l.Offset)
		at := metav1.NewTime(l.At.UTC().Truncate(time.Second))
		cs.LastSync = &at
	}
	cs.Error = a.clock.err
	if cs.Source == "" && cs.Error == "" {
		return nil
	}
	if cs.Source == "" {
		cs.Source = "rtc"
	}
	return &cs
}

// offset prints how far the clock moved, signed, to the millisecond.
func offset(d time.Duration) string {
	s := d.Round(time.Millisecond).String()
	if d >= 0 {
		s = "+" + s
	}
	return s
}
