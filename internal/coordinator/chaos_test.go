package coordinator

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/test/report"
)

var (
	chaosRuns = flag.Int("chaos.runs", 200, "runs of TestChaos")
	chaosSeed = flag.Uint64("chaos.seed", 0, "first run's seed (0: from the clock); run i uses seed+i, so -chaos.seed=S -chaos.runs=1 repeats run S")
)

// chaosAgent is a machine's agent in the chaos test: it may be killed at any step and
// restarted, and keeps what a real agent keeps in its state file (the sets it rebooted
// for), so a restart never reboots twice for one set.
type chaosAgent struct {
	*fakeAgent
	mu   sync.Mutex
	done map[string]bool
}

// step is one look at the API and at most one action, as an agent's reconcile pass.
func (a *chaosAgent) step(ctx context.Context) {
	f := a.f
	m, err := f.liken.Machine(ctx, a.name)
	if err != nil {
		return
	}
	cl, err := f.liken.Cluster(ctx)
	if err != nil {
		return
	}
	n, err := f.admin.CoreV1().Nodes().Get(ctx, a.name, metav1.GetOptions{})
	if err != nil {
		return
	}
	ready := false
	for _, c := range n.Status.Conditions {
		ready = ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
	}
	var turn *v1alpha1.Turn
	for i := range cl.Status.Turns {
		if cl.Status.Turns[i].Machine == a.name {
			turn = &cl.Status.Turns[i]
		}
	}
	st, hash := m.Status.Reboot.State, m.Status.PendingHash
	a.mu.Lock()
	rebooted := a.done[hash]
	a.mu.Unlock()
	switch {
	case st == v1alpha1.RebootRebooting && !ready:
		// Back from the reboot (killed while down, or not): the Node comes back, then the
		// status says the set is done.
		time.Sleep(a.downFor)
		a.f.setReady(a.name, true)
	case st == v1alpha1.RebootRebooting && ready && rebooted:
		a.writeStatus(func(s *v1alpha1.MachineStatus) {
			s.Reboot.State, s.PendingHash, s.PendingCount = v1alpha1.RebootNone, "", 0
		})
	case st == v1alpha1.RebootRebooting && ready:
		// Said Rebooting, killed before going down: the intent was kept, go down now.
		a.goDown(hash)
	case turn == nil || turn.PendingHash != hash || hash == "":
	case turn.Phase == v1alpha1.TurnDraining && st == v1alpha1.RebootWaitingForTurn:
		a.writeStatus(func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootDraining })
	case turn.Phase == v1alpha1.TurnDrained && !rebooted && (st == v1alpha1.RebootWaitingForTurn || st == v1alpha1.RebootDraining):
		a.mu.Lock()
		a.done[hash] = true // the intent, persisted before anything else
		a.mu.Unlock()
		a.writeStatus(func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootRebooting })
		a.goDown(hash)
	}
}

func (a *chaosAgent) goDown(string) {
	a.reboots.Add(1)
	a.f.setReady(a.name, false)
}

// TestChaos rolls a reboot through a small fleet again and again while agents and
// coordinators are killed at random moments and restarted, and the Lease is stolen. Two
// coordinators campaign for the Lease. From the API server's own records (watches on the
// Cluster and the Nodes) every run checks: no stored status holds more turns than the
// budget, or two server turns; never more Nodes unavailable than the budget; every
// machine reboots exactly once (its Node goes NotReady once) and finishes; no Node is
// left cordoned. Pods and PDBs are not part of it: TestDrainEvictsAndHonoursPDBs covers
// them.
func TestChaos(t *testing.T) {
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1_000_000_000)
	}
	start := time.Now()
	var kills, coordKills, agentKills, steals atomic.Int64
	for i := range *chaosRuns {
		s := seed + uint64(i)
		ok := t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			k := chaosRun(t, s)
			kills.Add(k.coord + k.agent + k.steal)
			coordKills.Add(k.coord)
			agentKills.Add(k.agent)
			steals.Add(k.steal)
		})
		if !ok {
			t.Fatalf("run with seed %d failed; repeat it with: go test ./internal/coordinator -run TestChaos -chaos.seed=%d -chaos.runs=1", s, s)
		}
	}
	report.Line("coordinator chaos: %d runs from seed %d in %s; %d kills (%d coordinators, %d agents) and %d Lease steals; every invariant held",
		*chaosRuns, seed, time.Since(start).Round(time.Second), coordKills.Load()+agentKills.Load(), coordKills.Load(), agentKills.Load(), steals.Load())
}

type chaosKills struct{ coord, agent, steal int64 }

func chaosRun(t *testing.T, seed uint64) chaosKills {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	n := 3 + rng.IntN(2)
	budget := 1 + rng.IntN(2)
	roles := map[string]v1alpha1.Role{}
	servers := 1 + rng.IntN(2)
	for i := 0; i < n; i++ {
		role := v1alpha1.RoleAgent
		if i < servers {
			role = v1alpha1.RoleServer
		}
		roles[fmt.Sprintf("x%d-m%d", seed%100000, i)] = role
	}
	b := intstr.FromInt32(int32(budget))
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) { s.DisruptionBudget.MaxUnavailable = &b }, roles)
	turnsSeen := f.watchTurns()
	downs, unavailMax := f.watchNodes()

	// Two coordinators campaign; either may be killed and restarted.
	coordCtx, stopAll := context.WithCancel(context.Background())
	defer stopAll()
	type proc struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	if err := authority.InstallServers(t.Context(), f.admin, "chaos-a", "chaos-b"); err != nil {
		t.Fatal(err)
	}
	creds := map[string]*rest.Config{}
	for _, name := range []string{"chaos-a", "chaos-b"} {
		cfg, err := env.UserConfig(authority.User(name), authority.Group)
		if err != nil {
			t.Fatal(err)
		}
		creds[name] = cfg
	}
	startCoord := func(name string) *proc {
		cfg := creds[name]
		c, err := New(Config{Machine: name, REST: cfg, LeaseDuration: time.Second, RenewDeadline: 700 * time.Millisecond,
			RetryPeriod: 100 * time.Millisecond, Resync: 100 * time.Millisecond, EvictRetry: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(coordCtx)
		p := &proc{cancel: cancel, done: make(chan struct{})}
		go func() { defer close(p.done); c.Run(ctx) }()
		return p
	}
	coords := map[string]*proc{"chaos-a": startCoord("chaos-a"), "chaos-b": startCoord("chaos-b")}

	agents := map[string]*chaosAgent{}
	agentProcs := map[string]*proc{}
	startAgent := func(a *chaosAgent) *proc {
		ctx, cancel := context.WithCancel(coordCtx)
		p := &proc{cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(p.done)
			for ctx.Err() == nil {
				a.step(ctx)
				time.Sleep(50 * time.Millisecond)
			}
		}()
		return p
	}
	for _, name := range f.names {
		a := &chaosAgent{fakeAgent: &fakeAgent{f: f, name: name, downFor: time.Duration(20+rng.IntN(60)) * time.Millisecond}, done: map[string]bool{}}
		agents[name] = a
		a.ask()
		agentProcs[name] = startAgent(a)
	}

	var k chaosKills
	finished := func() bool {
		for _, a := range agents {
			if a.reboots.Load() < 1 {
				return false // known without asking the API server
			}
		}
		cl := f.cluster()
		if len(cl.Status.Turns) > 0 {
			return false
		}
		for _, name := range f.names {
			m, err := f.liken.Machine(context.Background(), name)
			if err != nil || m.Status.Reboot.State != v1alpha1.RebootNone {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(60 * time.Second)
	for !finished() {
		if time.Now().After(deadline) {
			t.Fatalf("the rollout did not finish in 60s; reboots %v; the Cluster's status: %+v", rebootCounts(agents), f.cluster().Status)
		}
		time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		switch r := rng.IntN(20); {
		case r < 5: // kill a coordinator at whatever step it is in, and restart it
			name := []string{"chaos-a", "chaos-b"}[rng.IntN(2)]
			coords[name].cancel()
			<-coords[name].done
			coords[name] = startCoord(name)
			k.coord++
		case r < 10: // kill an agent, restart it
			name := f.names[rng.IntN(len(f.names))]
			agentProcs[name].cancel()
			<-agentProcs[name].done
			agentProcs[name] = startAgent(agents[name])
			k.agent++
		case r < 11: // steal the Lease: another holder writes it
			if stealLease(t, f) {
				k.steal++
			}
		}
	}
	stopAll()
	for _, p := range coords {
		<-p.done
	}
	for _, p := range agentProcs {
		<-p.done
	}

	for _, holders := range turnsSeen() {
		srv := 0
		for _, h := range holders {
			if roles[h] == v1alpha1.RoleServer {
				srv++
			}
		}
		if len(holders) > budget || srv > 1 {
			t.Errorf("a stored Cluster status held turns %v (budget %d, servers among them %d)", holders, budget, srv)
		}
	}
	if m := unavailMax(); m > budget {
		t.Errorf("%d Nodes were unavailable at once; the budget is %d", m, budget)
	}
	for name, n := range downs() {
		if n != 1 {
			t.Errorf("%s's Node went down %d times for one pending set", name, n)
		}
	}
	for _, name := range f.names {
		if f.node(name).Spec.Unschedulable {
			t.Errorf("%s is left cordoned", name)
		}
	}
	return k
}

func rebootCounts(agents map[string]*chaosAgent) map[string]int32 {
	out := map[string]int32{}
	for n, a := range agents {
		out[n] = a.reboots.Load()
	}
	return out
}

// stealLease makes a holder that does not exist take the coordinator's Lease, as a server
// that took it and died at once would: the coordinators must wait for it to expire.
func stealLease(t *testing.T, f *fleetFixture) bool {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := f.admin.CoordinationV1().Leases(v1alpha1.SecretNamespace).Get(context.Background(), authority.LeaseName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		thief := "chaos-thief"
		now := metav1.NewMicroTime(time.Now())
		d := int32(1)
		l.Spec = coordinationv1.LeaseSpec{HolderIdentity: &thief, AcquireTime: &now, RenewTime: &now, LeaseDurationSeconds: &d,
			LeaseTransitions: l.Spec.LeaseTransitions}
		_, err = f.admin.CoordinationV1().Leases(v1alpha1.SecretNamespace).Update(context.Background(), l, metav1.UpdateOptions{})
		return err
	})
	return err == nil
}

// watchNodes records, from a watch on the Nodes, how many times each went NotReady and
// the most Nodes unavailable (NotReady or cordoned) at once.
func (f *fleetFixture) watchNodes() (downs func() map[string]int, maxUnavailable func() int) {
	f.t.Helper()
	w, err := f.admin.CoreV1().Nodes().Watch(f.t.Context(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	var mu sync.Mutex
	mine := map[string]bool{}
	for _, n := range f.names {
		mine[n] = true
	}
	count := map[string]int{}
	wasReady := map[string]bool{}
	unavail := map[string]bool{}
	most := 0
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
			if prev, seen := wasReady[n.Name]; seen && prev && !ready {
				count[n.Name]++
			}
			wasReady[n.Name] = ready
			unavail[n.Name] = !ready || n.Spec.Unschedulable
			c := 0
			for _, u := range unavail {
				if u {
					c++
				}
			}
			most = max(most, c)
			mu.Unlock()
		}
	}()
	return func() map[string]int {
			mu.Lock()
			defer mu.Unlock()
			out := map[string]int{}
			for n := range mine {
				out[n] = count[n]
			}
			return out
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return most
		}
}
