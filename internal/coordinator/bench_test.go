package coordinator

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/test/report"
)

// phases are when each machine's reboot reached each step, to say where a rollout's
// time goes.
type phases struct {
	mu                                     sync.Mutex
	granted, drained, down, up, back, gone map[string]time.Time
}

// mean is the mean time from one step to the next over the machines that reached both.
func (p *phases) mean(from, to map[string]time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum time.Duration
	n := 0
	for m, a := range from {
		if b, ok := to[m]; ok {
			sum += b.Sub(a)
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(n)
}

func (p *phases) mark(step map[string]time.Time, m string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := step[m]; !ok {
		step[m] = time.Now()
	}
}

// rebootOnTurn plays every machine's reboot: when a machine's turn is drained it says
// Rebooting, its Node goes NotReady for down, comes back, and the machine says None. One
// Cluster watch drives all of them, so a hundred machines cost no polling.
func (f *fleetFixture) rebootOnTurn(ctx context.Context, down time.Duration) *phases {
	w, err := f.liken.ClusterListWatch().Watch(metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	ph := &phases{granted: map[string]time.Time{}, drained: map[string]time.Time{}, down: map[string]time.Time{},
		up: map[string]time.Time{}, back: map[string]time.Time{}, gone: map[string]time.Time{}}
	var mu sync.Mutex
	started := map[string]bool{}
	go func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				cl, ok := ev.Object.(*v1alpha1.Cluster)
				if !ok {
					continue
				}
				holding := map[string]bool{}
				for _, t := range cl.Status.Turns {
					holding[t.Machine] = true
					ph.mark(ph.granted, t.Machine)
					if t.Phase == v1alpha1.TurnDrained {
						ph.mark(ph.drained, t.Machine)
					}
				}
				ph.mu.Lock()
				var ended []string
				for m := range ph.granted {
					if _, ok := ph.gone[m]; !ok && !holding[m] {
						ended = append(ended, m)
					}
				}
				ph.mu.Unlock()
				for _, m := range ended {
					ph.mark(ph.gone, m)
				}
				for _, t := range cl.Status.Turns {
					mu.Lock()
					go1 := t.Phase == v1alpha1.TurnDrained && !started[t.Machine]
					started[t.Machine] = started[t.Machine] || go1
					mu.Unlock()
					if !go1 {
						continue
					}
					a := &fakeAgent{f: f, name: t.Machine}
					go func() {
						a.writeStatus(func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootRebooting })
						f.setReady(a.name, false)
						ph.mark(ph.down, a.name)
						time.Sleep(down)
						f.setReady(a.name, true)
						ph.mark(ph.up, a.name)
						a.writeStatus(func(s *v1alpha1.MachineStatus) {
							s.Reboot.State, s.PendingHash, s.PendingCount = v1alpha1.RebootNone, "", 0
						})
						ph.mark(ph.back, a.name)
					}()
				}
			}
		}
	}()
	return ph
}

// BenchmarkRollout: 100 simulated machines each want a reboot under maxUnavailable 10%,
// with a fixed simulated reboot (the Node NotReady for 3 s) and no pods to drain. The ideal
// is ceil(N/k) rounds of one reboot each; the figure is ideal / measured (goal >= 0.9).
func BenchmarkRollout(b *testing.B) {
	const n, down = 100, 3 * time.Second
	pct := intstr.FromString("10%")
	f := newFleet(b, func(s *v1alpha1.ClusterSpec) { s.DisruptionBudget.MaxUnavailable = &pct }, machines("roll", n, v1alpha1.RoleAgent))
	// The budget as the spec says it (10% of 100 machines), not as the code under test
	// computes it.
	const k = 10
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	unavailMax := maxUnavailableSeen(b, f)
	ph := f.rebootOnTurn(ctx, down)
	// The coordinator runs already when a rollout starts (the leader of a running
	// cluster): the rollout starts as the machines ask.
	f.coordinator("srv-bench", true)
	f.waitFor("the coordinator leading", time.Minute, func() bool { return f.cluster().Status.Coordinator == "srv-bench" })
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, name := range f.names {
		wg.Add(1)
		go func() { defer wg.Done(); (&fakeAgent{f: f, name: name}).ask() }()
	}
	wg.Wait()
	f.waitFor("every machine rebooted", 10*time.Minute, func() bool {
		cl := f.cluster()
		if len(cl.Status.Turns) > 0 || len(cl.Status.Waiting) > 0 {
			return false
		}
		ms, err := f.liken.Machines(context.Background())
		if err != nil {
			return false
		}
		for _, m := range ms {
			if strings.HasPrefix(m.Name, "roll") && m.Status.Reboot.State != v1alpha1.RebootNone {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	b.StopTimer()
	// A rollout that is fast by exceeding the budget is no figure: the Nodes' watch says
	// how many were unavailable at once.
	if m := unavailMax(); m > k {
		b.Fatalf("%d Nodes were unavailable at once; maxUnavailable 10%% of %d allows %d", m, n, k)
	}
	ideal := time.Duration(math.Ceil(float64(n)/float64(k))) * down
	ratio := ideal.Seconds() / took.Seconds()
	b.ReportMetric(ratio, "ideal-ratio")
	b.ReportMetric(took.Seconds(), "rollout-s")
	report.Line("coordinator rollout: %d simulated machines, maxUnavailable 10%% (%d at once; at most %d Nodes were seen unavailable together), reboot %s, no pods: %s against the ideal %s (ceil(%d/%d) rounds): ratio %.2f",
		n, k, unavailMax(), down, took.Round(100*time.Millisecond), ideal, n, k, ratio)
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	report.Line("coordinator rollout, mean per reboot: grant to drained %s (cordon, drain, record), drained to Node down %s and Node up to status None %s (the simulated machine's own writes), None to turn taken back %s",
		ms(ph.mean(ph.granted, ph.drained)), ms(ph.mean(ph.drained, ph.down)), ms(ph.mean(ph.up, ph.back)), ms(ph.mean(ph.back, ph.gone)))
}

// maxUnavailableSeen watches the fleet's Nodes and reports the most seen unavailable
// (NotReady or cordoned) at once, from the API server's own stream of their changes.
func maxUnavailableSeen(b *testing.B, f *fleetFixture) func() int {
	w, err := f.admin.CoreV1().Nodes().Watch(b.Context(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Stop)
	mine := map[string]bool{}
	for _, n := range f.names {
		mine[n] = true
	}
	var mu sync.Mutex
	down, most := map[string]bool{}, 0
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || !mine[n.Name] {
				continue
			}
			ready := false
			for _, c := range n.Status.Conditions {
				ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
			}
			mu.Lock()
			down[n.Name] = !ready || n.Spec.Unschedulable
			c := 0
			for _, d := range down {
				if d {
					c++
				}
			}
			most = max(most, c)
			mu.Unlock()
		}
	}()
	return func() int { mu.Lock(); defer mu.Unlock(); return most }
}

// BenchmarkIdle: 1,000 simulated machines with nothing to do, their Nodes as kubelets
// report them (kubeletNode: full status, images and all). The coordinator's heap after it
// has read the fleet, and the API requests it makes per minute besides its watches and its
// Lease (goal 0: an idle coordinator only reads its caches; TestIdleCoordinatorOnlyWatches
// fails when it does not), with the most frequent named. Through the window
// kube-controller-manager's TTL controller still annotates the new Nodes, about 20 a
// second (its client's rate): each is a plan for the coordinator, which must send nothing.
func BenchmarkIdle(b *testing.B) {
	const n = 1000
	f := newFleet(b, nil, machines("idle", n, v1alpha1.RoleAgent))
	if err := authority.InstallServers(b.Context(), f.admin, "srv-idle"); err != nil {
		b.Fatal(err)
	}
	cfg, err := env.UserConfig(authority.User("srv-idle"), authority.Group)
	if err != nil {
		b.Fatal(err)
	}
	log := newRequestLog()
	var watches atomic.Int64
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return log.Wrap(roundTrip(func(r *http.Request) (*http.Response, error) {
			if r.URL.Query().Get("watch") == "true" {
				watches.Add(1)
			}
			return rt.RoundTrip(r)
		}))
	})
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	c, err := New(Config{Machine: "srv-idle", REST: cfg})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	f.waitFor("the coordinator counted the fleet", 2*time.Minute, func() bool { return f.cluster().Status.Machines == n })
	time.Sleep(5 * time.Second) // settled
	b.ResetTimer()
	r0, l0 := log.Mark()
	const window = 30 * time.Second
	time.Sleep(window)
	sent := log.Since(r0)
	perMin := float64(len(sent)) * float64(time.Minute) / float64(window)
	leasePerMin := float64(log.RenewedSince(l0)) * float64(time.Minute) / float64(window)
	b.StopTimer()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapInuse-min(before.HeapInuse, after.HeapInuse)) / (1 << 20)
	b.ReportMetric(heap, "heap-MiB")
	b.ReportMetric(perMin, "req/min")
	report.Line("coordinator idle with %d simulated machines (full Node status): heap %.1f MiB (the test process's heap growth, goal < 200), %.1f API requests/min besides %d watches and %.0f Lease requests/min (goal 0)%s",
		n, heap, perMin, watches.Load(), leasePerMin, mostSent(sent))
}

// mostSent names the three requests sent most often, query apart.
func mostSent(sent []string) string {
	if len(sent) == 0 {
		return ""
	}
	counts := map[string]int{}
	for _, r := range sent {
		r, _, _ = strings.Cut(r, "?")
		counts[r]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return counts[keys[i]] > counts[keys[j]] || counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j]
	})
	var top []string
	for _, k := range keys[:min(3, len(keys))] {
		top = append(top, fmt.Sprintf("%d× %s", counts[k], k))
	}
	return ": " + strings.Join(top, ", ")
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
