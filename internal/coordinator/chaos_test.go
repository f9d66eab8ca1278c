package coordinator

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/test/apiserver"
	"liken.dev/liken/test/report"
)

var (
	chaosRuns = flag.Int("chaos.runs", 7, "runs of TestChaos (each about 20 s: every coordinator and agent is a process)")
	chaosSeed = flag.Uint64("chaos.seed", 0, "first run's seed (0: from the clock); run i uses seed+i, so -chaos.seed=S -chaos.runs=1 repeats run S")
)

// TestChaos rolls a reboot through a small fleet again and again while agents and
// coordinators, each a process of its own (this test binary in a helper mode,
// chaosproc_test.go), are killed with SIGKILL at random moments, mid-step or not, and
// started again; a killed leader's Lease is left to expire, as after a real crash; the
// Lease is stolen; and idle machines' Nodes go NotReady for a while for reasons that are
// not reboots. Two coordinators campaign for the Lease. From the API server's own
// records (watches on the Cluster and the Nodes, ordered by their resource versions) every
// run checks: no stored status holds more turns than the budget, or two server turns; no
// turn is granted while the machines holding turns and those down for other reasons
// exceed max(budget, those down for other reasons); never more Nodes unavailable by
// reboots than the budget; every machine reboots exactly once (its Node goes down for a
// reboot once) and finishes; no Node is left cordoned; the Cluster watch was alive to the
// end. Pods and PDBs are not part of it: TestDrainEvictsAndHonoursPDBs covers them.
func TestChaos(t *testing.T) {
	seed := *chaosSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1_000_000_000)
	}
	start := time.Now()
	var total chaosKills
	for i := range *chaosRuns {
		s := seed + uint64(i)
		ok := t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			total.add(chaosRun(t, s))
		})
		if !ok {
			t.Fatalf("run with seed %d failed; repeat it with: go test ./internal/coordinator -run TestChaos -chaos.seed=%d -chaos.runs=1", s, s)
		}
	}
	report.Line("coordinator chaos: %d runs from seed %d in %s; SIGKILLs: %d coordinators (%d holding the Lease, %d of those Leases left to expire), %d agents (%d mid-step); %d Lease steals; %d unrelated NotReady outages (%d turns granted during one); every invariant held",
		*chaosRuns, seed, time.Since(start).Round(time.Second), total.coord, total.leader, total.expired, total.agent, total.midStep,
		total.steal, total.outages, total.grantsInOutage)
}

type chaosKills struct {
	coord, leader, expired, agent, midStep, steal, outages, grantsInOutage int64
}

func (k *chaosKills) add(o chaosKills) {
	k.coord += o.coord
	k.leader += o.leader
	k.expired += o.expired
	k.agent += o.agent
	k.midStep += o.midStep
	k.steal += o.steal
	k.outages += o.outages
	k.grantsInOutage += o.grantsInOutage
}

// outageGrace is how long before a grant an unrelated outage must have begun for the
// grant to be held to it: the coordinator plans from its caches, which see a Node's
// change a moment after it is stored.
const outageGrace = time.Second

func chaosRun(t *testing.T, seed uint64) chaosKills {
	// What a run found broken is said again at its very end, after the helpers' output
	// (the cleanups run last first): CI shows a failed test's last lines.
	var broken []string
	violate := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		broken = append(broken, msg)
		t.Error(msg)
	}
	t.Cleanup(func() {
		if len(broken) > 0 {
			t.Logf("seed %d broke %d invariants:\n%s", seed, len(broken), strings.Join(broken, "\n"))
		}
	})
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
	cw := watchCluster(f)
	nw := watchChaosNodes(f)
	dir := t.TempDir()
	logs, err := os.Create(filepath.Join(dir, "helpers.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	var procs []*helperProc
	t.Cleanup(func() {
		for _, p := range procs {
			p.kill()
		}
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("the helpers' output:\n%s", tailLines(string(b), 60))
		}
	})
	start := func(env ...string) *helperProc {
		p, err := startHelper(env, logs)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		return p
	}

	// Two coordinators campaign, each with its server's own credentials.
	coordNames := []string{"chaos-a", "chaos-b"}
	if err := authority.InstallServers(t.Context(), f.admin, coordNames...); err != nil {
		t.Fatal(err)
	}
	for _, name := range coordNames {
		cfg, err := env.UserConfig(authority.User(name), authority.Group)
		if err != nil {
			t.Fatal(err)
		}
		if err := apiserver.WriteKubeconfig(filepath.Join(dir, name+".kubeconfig"), cfg); err != nil {
			t.Fatal(err)
		}
	}
	startCoord := func(name string) *helperProc {
		return start(chaosHelperEnv+"=coordinator", chaosNameEnv+"="+name, chaosKubeconfigEnv+"="+filepath.Join(dir, name+".kubeconfig"))
	}
	coords := map[string]*helperProc{}
	for _, name := range coordNames {
		coords[name] = startCoord(name)
	}

	// The agents flip their own Nodes' Ready, as the fixture does: admin credentials.
	agentDir := func(name string) string { return filepath.Join(dir, "agent-"+name) }
	downFor := map[string]time.Duration{}
	startAgent := func(name string) *helperProc {
		return start(chaosHelperEnv+"=agent", chaosNameEnv+"="+name, chaosKubeconfigEnv+"="+env.AdminKubeconfig,
			chaosStateEnv+"="+agentDir(name), fmt.Sprintf("%s=%d", chaosDownForEnv, downFor[name].Milliseconds()))
	}
	agents := map[string]*helperProc{}
	for _, name := range f.names {
		if err := os.Mkdir(agentDir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		downFor[name] = time.Duration(100+rng.IntN(200)) * time.Millisecond
		(&fakeAgent{f: f, name: name}).ask()
		agents[name] = startAgent(name)
	}

	var k chaosKills
	restartAt := map[string]time.Time{} // killed coordinators, started again then
	outageEnds := map[string]time.Time{}
	var lastKill time.Time
	finished := func() bool {
		if len(outageEnds) > 0 || len(restartAt) > 0 {
			return false
		}
		for _, name := range f.names {
			if nw.downs(name) < 1 {
				return false // known from the watch, without a request
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
	deadline := time.Now().Add(90 * time.Second)
	for !finished() {
		if time.Now().After(deadline) {
			t.Fatalf("the rollout did not finish in 90s; reboots %v; the Cluster's status: %+v", nw.allDowns(), f.cluster().Status)
		}
		for name, p := range coords {
			if _, killed := restartAt[name]; !killed && p.exited() {
				t.Fatalf("coordinator %s exited by itself", name)
			}
		}
		for name, p := range agents {
			if p.exited() {
				t.Fatalf("agent %s exited by itself", name)
			}
		}
		now := time.Now()
		for name, at := range restartAt {
			if now.After(at) {
				coords[name] = startCoord(name)
				delete(restartAt, name)
			}
		}
		for name, at := range outageEnds {
			if now.After(at) {
				// Only the test's own outage ends here: a reboot that took the Node over
				// brings it back itself.
				if err := setNodeReady(f.admin, name, true, "ChaosOutageOver", func(_ bool, r string) bool { return r == reasonUnrelated }); err != nil {
					t.Fatal(err)
				}
				delete(outageEnds, name)
			}
		}
		time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		switch r := rng.IntN(20); {
		case r < 3: // SIGKILL a coordinator wherever it is; start it again at once or after its Lease expired
			var live []string
			for _, name := range coordNames {
				if _, killed := restartAt[name]; !killed {
					live = append(live, name)
				}
			}
			if len(live) == 0 {
				break
			}
			name := live[rng.IntN(len(live))]
			holder := leaseHolder(f)
			coords[name].kill()
			lastKill = time.Now()
			k.coord++
			// Started again at once, a coordinator takes back its own Lease (same
			// identity); after a second, the Lease has expired and either may take it.
			wait := time.Duration(rng.IntN(2000)) * time.Millisecond
			restartAt[name] = time.Now().Add(wait)
			if holder == name {
				k.leader++
				if wait > time.Second {
					k.expired++
				}
			}
		case r < 8: // SIGKILL an agent, mid-step or not, and start it again
			// Mostly one holding a turn: the one with steps to be killed in.
			name := f.names[rng.IntN(len(f.names))]
			if cl := f.cluster(); len(cl.Status.Turns) > 0 && rng.IntN(3) > 0 {
				name = cl.Status.Turns[rng.IntN(len(cl.Status.Turns))].Machine
			}
			agents[name].kill()
			lastKill = time.Now()
			k.agent++
			if _, err := os.Stat(filepath.Join(agentDir(name), "acting")); err == nil {
				k.midStep++
				_ = os.Remove(filepath.Join(agentDir(name), "acting"))
			}
			agents[name] = startAgent(name)
		case r < 9: // steal the Lease: another holder writes it
			if stealLease(t, f) {
				k.steal++
			}
		case r < 11 && len(outageEnds) < 2: // an idle machine's Node goes NotReady for a while
			name := f.names[rng.IntN(len(f.names))]
			if idle(f, name) {
				marked := false
				if err := setNodeReady(f.admin, name, false, reasonUnrelated, func(ready bool, _ string) bool { marked = ready; return ready }); err != nil {
					t.Fatal(err)
				}
				if marked {
					outageEnds[name] = time.Now().Add(time.Duration(1500+rng.IntN(1000)) * time.Millisecond)
					k.outages++
				}
			}
		}
	}
	for _, p := range procs {
		p.kill()
	}

	// Alive to the end: a write made after every kill and after the rollout is seen.
	mark := fmt.Sprintf("%d-%d", seed, time.Now().UnixNano())
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := f.cluster()
		if cl.Annotations == nil {
			cl.Annotations = map[string]string{}
		}
		cl.Annotations["liken.dev/chaos-end"] = mark
		_, err := f.liken.UpdateCluster(context.Background(), cl)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !cw.sees(mark, 10*time.Second) {
		violate("the Cluster watch did not see the write made after the run (closed early: %v; last event %s after the last kill)",
			cw.closedEarly(), cw.lastEvent().Sub(lastKill).Round(time.Millisecond))
	}

	versions := cw.versions()
	outages := nw.outages()
	// inOutage: the machine's Node was stored NotReady for the test's reason at version rv
	// (and, with grace, long enough before for the coordinator's caches to have it).
	inOutage := func(node string, rv uint64, seen time.Time, grace time.Duration) bool {
		return slices.ContainsFunc(outages, func(o outage) bool {
			return o.node == node && o.begin < rv && (o.end == 0 || o.end > rv) && o.seen.Before(seen.Add(-grace))
		})
	}
	// grantedInOutage: the coordinator that wrote the grant at version rv may have read the
	// machine's Node NotReady for the test's reason. It read the Machines and Nodes (live,
	// run.go step) after reading prevRV, the version its write was conditional on, and wrote
	// a moment later: an outage that began before rv and had not ended by prevRV (nor more
	// than outageGrace before the grant was seen) may have been in its read, though it
	// ended before the write was stored. By resource versions only otherwise: the Node and
	// Cluster watches deliver in no common order.
	grantedInOutage := func(node string, prevRV, rv uint64, seen time.Time) bool {
		return slices.ContainsFunc(outages, func(o outage) bool {
			return o.node == node && o.begin < rv &&
				(o.end == 0 || o.end > rv || (o.end > prevRV && o.endSeen.After(seen.Add(-outageGrace))))
		})
	}
	// A machine already unavailable gets its turn without budget (Decide), so a holder
	// granted while its Node was down for another reason is not counted against it.
	var prev []string
	var prevRV uint64
	grantedDown := map[string]bool{}
	for _, v := range versions {
		for h := range grantedDown {
			if !slices.Contains(v.holders, h) {
				delete(grantedDown, h)
			}
		}
		var fresh []string
		for _, h := range v.holders {
			if !slices.Contains(prev, h) {
				fresh = append(fresh, h)
				grantedDown[h] = grantedInOutage(h, prevRV, v.rv, v.seen)
			}
		}
		prev, prevRV = v.holders, v.rv
		srv, counted := 0, 0
		for _, h := range v.holders {
			if roles[h] == v1alpha1.RoleServer {
				srv++
			}
			if !grantedDown[h] {
				counted++
			}
		}
		if counted > budget || srv > 1 {
			violate("a stored Cluster status (version %d) held turns %v (budget %d, servers among them %d, granted while down for another reason %v)",
				v.rv, v.holders, budget, srv, grantedDown)
		}
		if len(fresh) == 0 {
			continue
		}
		// A machine down for another reason uses the budget: no grant of a machine that
		// was up may take the machines unavailable past max(budget, those already down).
		down := map[string]bool{}
		for _, name := range f.names {
			if inOutage(name, v.rv, v.seen, outageGrace) || grantedDown[name] {
				down[name] = true
			}
		}
		if len(down) > 0 {
			k.grantsInOutage++
		}
		used := maps.Clone(down)
		for _, h := range v.holders {
			used[h] = true
		}
		adds := slices.ContainsFunc(fresh, func(h string) bool { return !down[h] })
		if adds && len(used) > max(budget, len(down)) {
			violate("turns %v were granted (version %d) while %v were down for other reasons: %d unavailable, budget %d", v.holders, v.rv, keys(down), len(used), budget)
		}
	}
	if m := nw.maxRebootUnavailable(); m > budget {
		violate("%d Nodes were unavailable at once by reboots (not counting those down for other reasons); the budget is %d", m, budget)
	}
	for name, d := range nw.allDowns() {
		if d != 1 {
			violate("%s's Node went down for a reboot %d times for one pending set", name, d)
		}
	}
	for _, name := range f.names {
		if f.node(name).Spec.Unschedulable {
			violate("%s is left cordoned", name)
		}
	}
	return k
}

// idle: the machine holds no turn, is not rebooting, and its Node is Ready and not
// cordoned.
func idle(f *fleetFixture, name string) bool {
	m, err := f.liken.Machine(context.Background(), name)
	if err != nil || (m.Status.Reboot.State != v1alpha1.RebootNone && m.Status.Reboot.State != v1alpha1.RebootWaitingForTurn) {
		return false
	}
	for _, t := range f.cluster().Status.Turns {
		if t.Machine == name {
			return false
		}
	}
	n := f.node(name)
	ready, _ := nodeReady(n)
	return ready && !n.Spec.Unschedulable
}

func leaseHolder(f *fleetFixture) string {
	l, err := f.admin.CoordinationV1().Leases(v1alpha1.SecretNamespace).Get(context.Background(), authority.LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
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

// clusterVersion is one stored version of the Cluster, as the watch saw it.
type clusterVersion struct {
	rv      uint64
	seen    time.Time
	holders []string
}

type clusterWatch struct {
	mu       sync.Mutex
	vs       []clusterVersion
	mark     string
	last     time.Time
	closed   bool // the result channel closed, or carried an error, before the run ended
	stopping atomic.Bool
}

// watchCluster records every version of the Cluster the API server stores (its turn
// holders, in resource-version order) and whether the watch stayed open.
func watchCluster(f *fleetFixture) *clusterWatch {
	f.t.Helper()
	w, err := f.liken.ClusterListWatch().Watch(metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	cw := &clusterWatch{}
	f.t.Cleanup(func() { cw.stopping.Store(true); w.Stop() })
	go func() {
		defer func() {
			cw.mu.Lock()
			cw.closed = cw.closed || !cw.stopping.Load()
			cw.mu.Unlock()
		}()
		for ev := range w.ResultChan() {
			cl, ok := ev.Object.(*v1alpha1.Cluster)
			if ev.Type == watch.Error || !ok {
				cw.mu.Lock()
				cw.closed = true
				cw.mu.Unlock()
				continue
			}
			rv, err := strconv.ParseUint(cl.ResourceVersion, 10, 64)
			if err != nil {
				f.t.Errorf("the Cluster's resourceVersion %q: %v", cl.ResourceVersion, err)
			}
			v := clusterVersion{rv: rv, seen: time.Now()}
			for _, t := range cl.Status.Turns {
				v.holders = append(v.holders, t.Machine)
			}
			cw.mu.Lock()
			cw.vs = append(cw.vs, v)
			cw.mark = cl.Annotations["liken.dev/chaos-end"]
			cw.last = v.seen
			cw.mu.Unlock()
		}
	}()
	return cw
}

func (cw *clusterWatch) versions() []clusterVersion {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return slices.Clone(cw.vs)
}

func (cw *clusterWatch) closedEarly() bool {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.closed
}

func (cw *clusterWatch) lastEvent() time.Time {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.last
}

// sees waits for the watch to deliver the version carrying mark, with no error before.
func (cw *clusterWatch) sees(mark string, timeout time.Duration) bool {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		cw.mu.Lock()
		ok := cw.mark == mark && !cw.closed
		cw.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// outage is one spell of a Node NotReady for the test's unrelated reason, by the resource
// versions that began and ended it (end 0: still on).
type outage struct {
	node       string
	begin, end uint64
	// seen and endSeen: when the watch delivered its beginning and its end.
	seen, endSeen time.Time
}

type nodeWatch struct {
	mu      sync.Mutex
	down    map[string]int
	outs    []outage
	mostReb int
}

// watchChaosNodes records, from a watch on the Nodes, how many times each went down for a
// reboot, the test's outages, and the most Nodes unavailable (NotReady or cordoned) at
// once for reboots: a Node that went down for another reason counts for it until it is
// Ready and uncordoned again (an unavailable machine gets its turn without budget).
func watchChaosNodes(f *fleetFixture) *nodeWatch {
	f.t.Helper()
	w, err := f.admin.CoreV1().Nodes().Watch(f.t.Context(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	nw := &nodeWatch{down: map[string]int{}}
	mine := map[string]bool{}
	for _, n := range f.names {
		mine[n] = true
	}
	type state struct {
		ready          bool
		reason         string
		unavail, other bool
	}
	cur := map[string]state{}
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || !mine[n.Name] {
				continue
			}
			rv, _ := strconv.ParseUint(n.ResourceVersion, 10, 64)
			ready, reason := nodeReady(n)
			prev, seen := cur[n.Name]
			s := state{ready: ready, reason: reason, unavail: !ready || n.Spec.Unschedulable, other: prev.other}
			nw.mu.Lock()
			rebootDown := !ready && reason == reasonReboot
			if seen && rebootDown && (prev.ready || prev.reason != reasonReboot) {
				nw.down[n.Name]++
			}
			outNow := !ready && reason == reasonUnrelated
			outBefore := seen && !prev.ready && prev.reason == reasonUnrelated
			if outNow && !outBefore {
				nw.outs = append(nw.outs, outage{node: n.Name, begin: rv, seen: time.Now()})
				s.other = true
			}
			if !outNow && outBefore {
				for i := range nw.outs {
					if nw.outs[i].node == n.Name && nw.outs[i].end == 0 {
						nw.outs[i].end = rv
						nw.outs[i].endSeen = time.Now()
					}
				}
			}
			if !s.unavail {
				s.other = false
			}
			cur[n.Name] = s
			c := 0
			for _, st := range cur {
				if st.unavail && !st.other {
					c++
				}
			}
			nw.mostReb = max(nw.mostReb, c)
			nw.mu.Unlock()
		}
	}()
	return nw
}

func (nw *nodeWatch) downs(name string) int {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.down[name]
}

func (nw *nodeWatch) allDowns() map[string]int {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return maps.Clone(nw.down)
}

func (nw *nodeWatch) outages() []outage {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return slices.Clone(nw.outs)
}

func (nw *nodeWatch) maxRebootUnavailable() int {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.mostReb
}
