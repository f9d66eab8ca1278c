package initd

import (
	"context"
	"fmt"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/host/clock"
	"liken.dev/liken/internal/host/network"
	"liken.dev/liken/internal/state"
)

// setClock sets the clock from the time servers before k3s first starts, and waits, saying
// why, while none answers and the clock reads earlier than this release was built.
func (s *system) setClock() error {
	built, err := apirelease.ReadBuildTime("/")
	if err != nil {
		return err
	}
	servers := s.timeServers()
	start := time.Now()
	// A trial waits no longer than its health deadline, then fails and goes back to the
	// last good slot; another boot waits as long as it takes, saying why.
	ctx := context.Background()
	if s.boot.trial {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.trialDeadline())
		defer cancel()
	}
	sync, err := clock.Clock{}.AtBoot(ctx, servers, built, 5*time.Second, s.log)
	if err != nil {
		return err
	}
	took := time.Since(start) // monotonic: a step does not count
	if sync == nil {
		s.report.Clock = &state.ClockSet{At: time.Now(), Took: took} // no server: the hardware clock's time
		s.boot.setReport(s.report)
		return nil
	}
	s.report.Clock = &state.ClockSet{Server: sync.Server, Offset: sync.Offset, At: sync.At, Took: took}
	s.boot.setReport(s.report)
	fmt.Fprintf(s.log, "liken-init: clock set from %s: moved %s, now %s (took %s)\n",
		sync.Server, sync.Offset.Round(time.Millisecond), sync.At.UTC().Format(time.RFC3339), took.Round(time.Millisecond))
	return nil
}

// timeServers are the Cluster's (as the agent last applied them, else the layer's), then
// those DHCP named.
func (s *system) timeServers() []string {
	servers := s.cluster.Spec.TimeServers
	if st, err := (state.Store{Dir: likenState}).Load(); err == nil && st.Applied != nil {
		servers = st.Applied.Cluster.TimeServers
	}
	return append(append([]string{}, servers...), network.DHCPTimeServers()...)
}

// keepClockEvery is how often the agent sets the clock from the time servers.
const keepClockEvery = 15 * time.Minute
