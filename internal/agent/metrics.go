package agent

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the agent's Prometheus metrics, in a registry of their own.
type Metrics struct {
	Registry         *prometheus.Registry
	ChangesApplied   *prometheus.CounterVec
	ChangesStaged    *prometheus.CounterVec
	K3sRestarts      prometheus.Counter
	StatusWrites     prometheus.Counter
	SysctlFailures   prometheus.Gauge
	ReconcileSeconds prometheus.Histogram
	// APIRequests counts requests to the API server by verb; "WATCH" is a watch (a GET
	// with watch=true), which stays open.
	APIRequests *prometheus.CounterVec
}

// NewMetrics registers the agent's metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		ChangesApplied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "liken_agent_changes_applied_total", Help: "Spec changes applied, by class (Live, RestartK3s).",
		}, []string{"class"}),
		ChangesStaged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "liken_agent_changes_staged_total", Help: "Spec changes staged for a boot, by class (NextBoot, Reboot).",
		}, []string{"class"}),
		K3sRestarts:  prometheus.NewCounter(prometheus.CounterOpts{Name: "liken_agent_k3s_restarts_total", Help: "k3s restarts the agent asked for."}),
		StatusWrites: prometheus.NewCounter(prometheus.CounterOpts{Name: "liken_agent_status_writes_total", Help: "Machine status updates written."}),
		SysctlFailures: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "liken_agent_sysctl_failures", Help: "Sysctls that could not be applied in the last pass.",
		}),
		ReconcileSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "liken_agent_reconcile_seconds", Help: "Time of one reconcile pass.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5},
		}),
	}
	m.APIRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "liken_agent_api_requests_total", Help: "Requests the agent made to the API server, by verb (WATCH for watches).",
	}, []string{"verb"})
	m.Registry.MustRegister(m.ChangesApplied, m.ChangesStaged, m.K3sRestarts, m.StatusWrites, m.SysctlFailures, m.ReconcileSeconds, m.APIRequests)
	return m
}

// countRequests wraps a client transport to count requests by verb.
func (m *Metrics) countRequests(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		verb := r.Method
		if r.URL.Query().Get("watch") == "true" {
			verb = "WATCH"
		}
		m.APIRequests.WithLabelValues(verb).Inc()
		return rt.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
