package coordinator

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the coordinator's Prometheus metrics; on a server they are served beside the
// agent's (liken-agent's --metrics-addr). Only the leader's gauges move.
type Metrics struct {
	Leader        prometheus.Gauge
	Waiting       prometheus.Gauge
	Turns         prometheus.Gauge
	DrainsBlocked prometheus.Gauge
	Granted       prometheus.Counter
	Released      prometheus.Counter
	Blocked       prometheus.Counter
	Halts         prometheus.Counter
	GateFailures  prometheus.Counter
	DrainSeconds  prometheus.Histogram
}

// NewMetrics makes the coordinator's metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Leader:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "liken_coordinator_leader", Help: "1 while this machine leads reboot coordination."}),
		Waiting:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "liken_coordinator_machines_waiting", Help: "Machines waiting for a disruption-budget turn."}),
		Turns:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "liken_coordinator_turns_held", Help: "Disruption-budget turns held."}),
		DrainsBlocked: prometheus.NewGauge(prometheus.GaugeOpts{Name: "liken_coordinator_drains_blocked", Help: "Machines whose last drain was blocked and that wait to try again."}),
		Granted:       prometheus.NewCounter(prometheus.CounterOpts{Name: "liken_coordinator_turns_granted_total", Help: "Turns granted."}),
		Released:      prometheus.NewCounter(prometheus.CounterOpts{Name: "liken_coordinator_turns_released_total", Help: "Turns taken back (the machine rebooted and is healthy, or no longer needs its turn)."}),
		Blocked:       prometheus.NewCounter(prometheus.CounterOpts{Name: "liken_coordinator_drains_blocked_total", Help: "Drains that did not finish within drain.timeout."}),
		Halts:         prometheus.NewCounter(prometheus.CounterOpts{Name: "liken_coordinator_rollout_halts_total", Help: "Rollouts halted after spec.rollout.maxFailures failed trials of the same release or kernel arguments."}),
		GateFailures:  prometheus.NewCounter(prometheus.CounterOpts{Name: "liken_coordinator_gate_failures_total", Help: "Machines whose gates (spec.rollout.gates, or the workloads that ran on them) failed after their reboot."}),
		DrainSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "liken_coordinator_drain_seconds", Help: "Time from a drain's start to an empty Node.",
			Buckets: []float64{.1, .5, 1, 5, 10, 30, 60, 120, 300, 600, 1800}}),
	}
	if reg != nil {
		reg.MustRegister(m.Leader, m.Waiting, m.Turns, m.DrainsBlocked, m.Granted, m.Released, m.Blocked, m.Halts, m.GateFailures, m.DrainSeconds)
	}
	return m
}
