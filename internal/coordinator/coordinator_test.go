package coordinator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

// A real control plane with kube-controller-manager, so PodDisruptionBudget status (and so
// the eviction API's answers) is computed as in a cluster. The node lifecycle controllers
// are off (the tests' Nodes have no kubelet to renew them; the tests set their
// conditions), and so is the garbage collector (the tests' pods name ReplicaSets as their
// controllers without a ReplicaSet controller to run them).
func TestMain(m *testing.M) {
	os.Exit(apiserver.Main(m, "coordinator", apiserver.Options{ControllerManager: true,
		Controllers: "*,-node-lifecycle-controller,-taint-eviction-controller,-garbage-collector-controller"}, &env))
}

// fleetFixture is a Cluster, Machines and Nodes in the real API server. The machines'
// side is played by fakeAgent (the agents' own decisions are tested in internal/agent
// with the real agent); what is tested here is the coordinator.
type fleetFixture struct {
	t     testing.TB
	admin kubernetes.Interface
	liken *kube.Client
	names []string
}

func newFleet(t testing.TB, spec func(*v1alpha1.ClusterSpec), machines map[string]v1alpha1.Role) *fleetFixture {
	t.Helper()
	ctx := t.Context()
	f := &fleetFixture{t: t, admin: kubernetes.NewForConfigOrDie(env.Admin)}
	var err error
	if f.liken, err = kube.NewClient(env.Admin); err != nil {
		t.Fatal(err)
	}
	if err := authority.Install(ctx, f.admin); err != nil {
		t.Fatal(err)
	}
	cs := v1alpha1.ClusterSpec{Channel: "file:///srv/channel", Version: "2026.07.20-001",
		Releases: map[string]v1alpha1.Digest{"2026.07.20-001": v1alpha1.Digest("sha256:" + strings.Repeat("0", 64))}}
	if spec != nil {
		spec(&cs)
	}
	cl, err := f.liken.Cluster(ctx)
	if apierrors.IsNotFound(err) {
		cl, err = f.liken.CreateCluster(ctx, &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterName}, Spec: cs})
	} else if err == nil {
		cl.Spec = cs
		cl, err = f.liken.UpdateCluster(ctx, cl)
	}
	if err != nil {
		t.Fatal(err)
	}
	cl.Status = v1alpha1.ClusterStatus{}
	if _, err := f.liken.UpdateClusterStatus(ctx, cl); err != nil {
		t.Fatal(err)
	}
	for name := range machines {
		f.names = append(f.names, name)
	}
	sort.Strings(f.names)
	// Eight at a time: the benchmarks make a thousand.
	var wg sync.WaitGroup
	type job struct {
		i    int
		name string
	}
	work := make(chan job)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				if _, err := f.liken.CreateMachine(ctx, &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: j.name}, Spec: v1alpha1.MachineSpec{Role: machines[j.name]}}); err != nil {
					t.Error(err)
					continue
				}
				// A Node registers with its status, as a kubelet's does.
				if _, err := f.admin.CoreV1().Nodes().Create(ctx, kubeletNode(j.name, j.i), metav1.CreateOptions{}); err != nil {
					t.Error(err)
					continue
				}
			}
		}()
	}
	for i, n := range f.names {
		work <- job{i, n}
	}
	close(work)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, n := range f.names {
			_ = f.admin.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
			_ = f.liken.DeleteMachine(ctx, n)
		}
	})
	return f
}

// newBootID is a boot ID as the kernel makes one (/proc/sys/kernel/random/boot_id).
func newBootID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// apiAway retries for up to about a minute: long enough for the API server to come back.
var apiAway = wait.Backoff{Steps: 120, Duration: 500 * time.Millisecond}

func (f *fleetFixture) setReady(node string, ready bool) {
	f.t.Helper()
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	cond := corev1.NodeCondition{Type: corev1.NodeReady, Status: st, Reason: "Test"}
	if err := f.setNodeCondition(node, cond, func(n *corev1.Node) {
		if ready && !kube.NodeReady(n) {
			// Back: the kubelet of the next boot reports that boot's ID, as after a reboot.
			n.Status.NodeInfo.BootID = newBootID()
		}
	}); err != nil {
		f.t.Errorf("setting Node %s Ready=%v: %v", node, ready, err)
	}
}

// setNodeCondition writes cond, with a fresh heartbeat and transition, over the Node's
// condition of its type, the others as they are; change, if any, edits the Node first.
func (f *fleetFixture) setNodeCondition(node string, cond corev1.NodeCondition, change func(*corev1.Node)) error {
	return retry.OnError(apiAway, func(error) bool { return true }, func() error {
		n, err := f.admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if change != nil {
			change(n)
		}
		cond.LastHeartbeatTime, cond.LastTransitionTime = metav1.Now(), metav1.Now()
		i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == cond.Type })
		if i < 0 {
			n.Status.Conditions = append(n.Status.Conditions, cond)
		} else {
			n.Status.Conditions[i] = cond
		}
		_, err = f.admin.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
}

func (f *fleetFixture) setCordon(node string, on bool) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := f.admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Unschedulable = on
		_, err = f.admin.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleetFixture) cluster() *v1alpha1.Cluster {
	cl, err := f.liken.Cluster(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return cl
}

func (f *fleetFixture) node(name string) *corev1.Node {
	n, err := f.admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// coordinator starts a real coordinator with the credentials of server machine name.
// elect false bypasses the Lease: it leads at once, even beside another leader (as two
// leaders may for a moment when a Lease changes hands).
func (f *fleetFixture) coordinator(name string, elect bool) *Metrics {
	f.t.Helper()
	return f.coordinatorWith(name, elect, nil)
}

// coordinatorWith is coordinator with its Config changed by change (nil: none) before it
// starts.
func (f *fleetFixture) coordinatorWith(name string, elect bool, change func(*Config)) *Metrics {
	f.t.Helper()
	if err := authority.InstallServers(f.t.Context(), f.admin, name); err != nil {
		f.t.Fatal(err)
	}
	cfg, err := env.UserConfig(authority.User(name), authority.Group)
	if err != nil {
		f.t.Fatal(err)
	}
	m := NewMetrics(prometheus.NewRegistry())
	cc := Config{Machine: name, REST: cfg, Metrics: m, LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second,
		RetryPeriod: 200 * time.Millisecond, Resync: 300 * time.Millisecond, EvictRetry: 200 * time.Millisecond, BlockedRetry: time.Second}
	if change != nil {
		change(&cc)
	}
	c, err := New(cc)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if elect {
			c.Run(ctx)
		} else {
			c.lead(ctx)
		}
	}()
	f.t.Cleanup(func() { cancel(); <-done })
	return m
}

// fakeAgent plays one machine's agent: it asks for a turn for a pending set when told,
// says Draining while its turn is drained, then goes down (its Node NotReady) for
// downFor, comes back, and says None, giving the turn back. neverReturns stops it at
// "down".
type fakeAgent struct {
	f            *fleetFixture
	name         string
	downFor      time.Duration
	neverReturns bool
	// verifyFor keeps it Verifying that long after it is back; verified is when that ends.
	verifyFor time.Duration
	verified  atomic.Int64
	// failTrial: back from its reboot, it reports that the trial of the Cluster's release
	// failed and it fell back, as an agent does.
	failTrial bool
	reboots   atomic.Int32
	set       atomic.Int32 // pending sets asked for so far
}

// ask makes the machine wait for a turn with a new pending set.
func (a *fakeAgent) ask() {
	n := a.set.Add(1)
	a.writeStatus(func(s *v1alpha1.MachineStatus) {
		s.PendingHash = fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(fmt.Sprintf("%s-%d", a.name, n))))
		s.PendingCount = 1
		s.Reboot.State = v1alpha1.RebootWaitingForTurn
		now := metav1.Now()
		s.Reboot.Since = &now
	})
}

func (a *fakeAgent) writeStatus(change func(*v1alpha1.MachineStatus)) {
	// As an agent does, it tries again while the API server is away.
	err := retry.OnError(apiAway, func(error) bool { return true }, func() error {
		m, err := a.f.liken.Machine(context.Background(), a.name)
		if err != nil {
			return err
		}
		change(&m.Status)
		_, err = a.f.liken.UpdateMachineStatus(context.Background(), m)
		return err
	})
	if err != nil {
		a.f.t.Errorf("%s: writing status: %v", a.name, err)
	}
}

func (a *fakeAgent) run(ctx context.Context) {
	for ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		m, err := a.f.liken.Machine(ctx, a.name)
		if err != nil {
			continue
		}
		cl, err := a.f.liken.Cluster(ctx)
		if err != nil {
			continue
		}
		var turn *v1alpha1.Turn
		for i := range cl.Status.Turns {
			if cl.Status.Turns[i].Machine == a.name {
				turn = &cl.Status.Turns[i]
			}
		}
		st := m.Status.Reboot.State
		blocked := false
		for _, b := range cl.Status.DrainBlocked {
			blocked = blocked || (b.Machine == a.name && b.PendingHash == m.Status.PendingHash && time.Now().Before(b.RetryAt.Time))
		}
		switch {
		case turn == nil && st == v1alpha1.RebootDraining && blocked:
			a.writeStatus(func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootDrainBlocked })
		case turn == nil && (st == v1alpha1.RebootDraining || st == v1alpha1.RebootDrainBlocked) && !blocked:
			a.writeStatus(func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootWaitingForTurn })
		case turn == nil || turn.PendingHash != m.Status.PendingHash:
		case turn.Phase == v1alpha1.TurnDraining && st == v1alpha1.RebootWaitingForTurn:
			a.writeStatus(func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootDraining })
		case turn.Phase == v1alpha1.TurnDrained && (st == v1alpha1.RebootWaitingForTurn || st == v1alpha1.RebootDraining):
			a.writeStatus(func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootRebooting })
			a.reboots.Add(1)
			a.f.setReady(a.name, false)
			if a.neverReturns {
				return
			}
			time.Sleep(a.downFor)
			a.f.setReady(a.name, true)
			if a.verifyFor > 0 {
				// Back, its Node Ready, but not healthy yet (k3s, the trial): it keeps its turn.
				a.writeStatus(func(s *v1alpha1.MachineStatus) {
					s.Reboot.State, s.PendingHash, s.PendingCount = v1alpha1.RebootVerifying, "", 0
				})
				a.verified.Store(time.Now().Add(a.verifyFor).UnixNano())
				time.Sleep(a.verifyFor)
			}
			a.writeStatus(func(s *v1alpha1.MachineStatus) {
				s.Reboot.State, s.PendingHash, s.PendingCount = v1alpha1.RebootNone, "", 0
				if a.failTrial {
					s.Upgrade.State = v1alpha1.UpgradeFellBack
					s.Upgrade.FailedReleases = append(s.Upgrade.FailedReleases, v1alpha1.FailedRelease{
						Digest: string(cl.Spec.Releases[string(cl.Spec.Version)]), Version: string(cl.Spec.Version),
						Reason: v1alpha1.ReasonHealthDeadline, Message: "the test's trial fails", At: metav1.NewTime(time.Now().UTC().Truncate(time.Second))})
				}
			})
		}
	}
}

func (f *fleetFixture) agents(downFor time.Duration, names ...string) map[string]*fakeAgent {
	out := map[string]*fakeAgent{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, n := range names {
		a := &fakeAgent{f: f, name: n, downFor: downFor}
		out[n] = a
		wg.Add(1)
		go func() { defer wg.Done(); a.run(ctx) }()
	}
	f.t.Cleanup(func() { cancel(); wg.Wait() })
	return out
}

// watchTurns records, from a watch on the Cluster, the turn holders of every version
// of its status, so an instant over budget cannot go unseen.
func (f *fleetFixture) watchTurns() func() [][]string {
	f.t.Helper()
	w, err := f.liken.ClusterListWatch().Watch(metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	var mu sync.Mutex
	var seen [][]string
	go func() {
		for ev := range w.ResultChan() {
			cl, ok := ev.Object.(*v1alpha1.Cluster)
			if !ok {
				continue
			}
			var holders []string
			for _, t := range cl.Status.Turns {
				holders = append(holders, t.Machine)
			}
			mu.Lock()
			seen = append(seen, holders)
			mu.Unlock()
		}
	}()
	return func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		return append([][]string(nil), seen...)
	}
}

// watchCordons records, from a watch on the Nodes, every Node of the fleet seen
// unschedulable, so a cordon that came and went between two looks cannot go unseen.
func (f *fleetFixture) watchCordons() func() map[string]bool {
	f.t.Helper()
	w, err := f.admin.CoreV1().Nodes().Watch(f.t.Context(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	var mu sync.Mutex
	seen := map[string]bool{}
	go func() {
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && n.Spec.Unschedulable && slices.Contains(f.names, n.Name) {
				mu.Lock()
				seen[n.Name] = true
				mu.Unlock()
			}
		}
	}()
	return func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}

func (f *fleetFixture) waitFor(what string, timeout time.Duration, ok func() bool) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.t.Context(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return ok(), nil
	}); err != nil {
		cl, _ := f.liken.Cluster(context.Background())
		f.t.Fatalf("%s never happened within %s; the Cluster's status: %+v", what, timeout, cl.Status)
	}
}

func machines(prefix string, n int, role v1alpha1.Role) map[string]v1alpha1.Role {
	out := map[string]v1alpha1.Role{}
	for i := 1; i <= n; i++ {
		out[fmt.Sprintf("%s%d", prefix, i)] = role
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestTwoCoordinatorsAtOnce: two coordinators lead at the same time (the Lease bypassed),
// while six machines each want a reboot under maxUnavailable 2. Every version of the
// Cluster's status the API server stored holds at most two turns, because turns are only
// granted in a write conditional on the version they were planned from; every machine
// reboots exactly once.
func TestTwoCoordinatorsAtOnce(t *testing.T) {
	two := intstr.FromInt32(2)
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) { s.DisruptionBudget.MaxUnavailable = &two }, machines("dual", 6, v1alpha1.RoleAgent))
	seen := f.watchTurns()
	agents := f.agents(300*time.Millisecond, f.names...)
	f.coordinator("srv-a", false)
	f.coordinator("srv-b", false)
	for _, a := range agents {
		a.ask()
	}
	f.waitFor("every machine rebooted", 90*time.Second, func() bool {
		for _, a := range agents {
			if a.reboots.Load() < 1 {
				return false
			}
		}
		return len(f.cluster().Status.Turns) == 0
	})
	for _, holders := range seen() {
		if len(holders) > 2 {
			t.Errorf("a stored status held %d turns, over the budget of 2: %v", len(holders), holders)
		}
	}
	for _, a := range agents {
		if n := a.reboots.Load(); n != 1 {
			t.Errorf("%s rebooted %d times for one pending set", a.name, n)
		}
	}
	t.Logf("%d versions of the Cluster's status seen", len(seen()))
	for _, n := range f.names {
		if f.node(n).Spec.Unschedulable {
			t.Errorf("%s is left cordoned", n)
		}
	}
}

// TestUnavailableNodesCountAgainstTheBudget (scenario 8): a Node NotReady for another
// reason uses the budget of one, so a waiting machine waits, saying why, until it is back.
func TestUnavailableNodesCountAgainstTheBudget(t *testing.T) {
	f := newFleet(t, nil, machines("count", 2, v1alpha1.RoleAgent))
	f.setReady("count2", false)
	agents := f.agents(100*time.Millisecond, "count1")
	f.coordinator("srv-c", true)
	agents["count1"].ask()
	// The plan that says count1 waits is the coordinator's decision on its ask: it gave no
	// turn, and a machine reboots only on one.
	f.waitFor("count1 said to wait for count2", 30*time.Second, func() bool {
		st := f.cluster().Status
		return len(st.Waiting) == 1 && st.Waiting[0].Machine == "count1" && strings.Contains(st.Waiting[0].Reason, "count2") && len(st.Turns) == 0
	})
	if n := agents["count1"].reboots.Load(); n != 0 {
		t.Fatalf("count1 rebooted while count2 was NotReady with a budget of 1")
	}
	f.setReady("count2", true)
	f.waitFor("count1 rebooted once count2 was back", 30*time.Second, func() bool { return agents["count1"].reboots.Load() == 1 })
}

// TestAdminCordonKept (scenario 4): a Node an operator cordoned before the turn stays
// cordoned after the reboot; one liken cordoned is uncordoned.
func TestAdminCordonKept(t *testing.T) {
	f := newFleet(t, nil, machines("cord", 2, v1alpha1.RoleAgent))
	f.setCordon("cord1", true)
	agents := f.agents(100*time.Millisecond, f.names...)
	f.coordinator("srv-d", true)
	agents["cord1"].ask()
	f.waitFor("cord1 rebooted and gave its turn back", 30*time.Second, func() bool {
		return agents["cord1"].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	if !f.node("cord1").Spec.Unschedulable {
		t.Error("the operator's cordon of cord1 was undone")
	}
	agents["cord2"].ask()
	// cord1, cordoned, counts as unavailable: with a budget of one, cord2 waits for it.
	f.waitFor("cord2 waits for the cordoned cord1", 30*time.Second, func() bool {
		st := f.cluster().Status
		return len(st.Waiting) == 1 && strings.Contains(st.Waiting[0].Reason, "cord1")
	})
	f.setCordon("cord1", false)
	f.waitFor("cord2 rebooted and gave its turn back", 30*time.Second, func() bool {
		return agents["cord2"].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	if f.node("cord2").Spec.Unschedulable {
		t.Error("cord2, cordoned by liken for its drain, was left cordoned")
	}
}

// TestServersOneAtATime (scenario 9): three servers wait under a budget of three; one
// reboots at a time, and none while another server is unavailable.
func TestServersOneAtATime(t *testing.T) {
	three := intstr.FromInt32(3)
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) { s.DisruptionBudget.MaxUnavailable = &three }, machines("srv", 3, v1alpha1.RoleServer))
	seen := f.watchTurns()
	agents := f.agents(300*time.Millisecond, f.names...)
	f.coordinator("ctl-e", true)
	for _, a := range agents {
		a.ask()
	}
	f.waitFor("every server rebooted", 60*time.Second, func() bool {
		for _, a := range agents {
			if a.reboots.Load() != 1 {
				return false
			}
		}
		return len(f.cluster().Status.Turns) == 0
	})
	for _, holders := range seen() {
		if len(holders) > 1 {
			t.Errorf("two servers held turns at once: %v", holders)
		}
	}
	// One server down for another reason: no server gets a turn.
	f.setReady("srv3", false)
	agents["srv1"].ask()
	f.waitFor("srv1 told it waits for srv3", 30*time.Second, func() bool {
		st := f.cluster().Status
		return len(st.Waiting) == 1 && strings.Contains(st.Waiting[0].Reason, "srv3") && len(st.Turns) == 0
	})
}

// setEtcd sets a server's EtcdIsVoter condition as k3s's etcd leader does, its other
// conditions left as they are.
func (f *fleetFixture) setEtcd(node string, st corev1.ConditionStatus, reason string) {
	f.t.Helper()
	cond := corev1.NodeCondition{Type: k3s.EtcdIsVoter, Status: st, Reason: reason, Message: "set by the test as k3s's etcd leader would"}
	if err := f.setNodeCondition(node, cond, nil); err != nil {
		f.t.Errorf("setting Node %s EtcdIsVoter=%s: %v", node, st, err)
	}
}

// quorumSays waits for the Cluster's ControlPlaneQuorum condition to have reason.
func (f *fleetFixture) quorumSays(reason, phrase string) {
	f.t.Helper()
	f.waitFor("ControlPlaneQuorum "+reason, 30*time.Second, func() bool {
		c := meta.FindStatusCondition(f.cluster().Status.Conditions, v1alpha1.ClusterControlPlaneQuorum)
		return c != nil && c.Reason == reason && strings.Contains(c.Message, phrase)
	})
}

// etcdFleet is n servers whose members are healthy voters, a budget of n (so only the
// quorum holds them back), their fake agents and a coordinator, with a watch of the turns.
func etcdFleet(t *testing.T, prefix string, n int) (*fleetFixture, func() [][]string, map[string]*fakeAgent) {
	budget := intstr.FromInt32(int32(n))
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) { s.DisruptionBudget.MaxUnavailable = &budget }, machines(prefix, n, v1alpha1.RoleServer))
	for _, name := range f.names {
		f.setEtcd(name, corev1.ConditionTrue, k3s.EtcdReasonVoter)
	}
	seen := f.watchTurns()
	agents := f.agents(300*time.Millisecond, f.names...)
	f.coordinator("ctl-"+prefix, true)
	return f, seen, agents
}

// TestServersCountedByEtcdQuorum (issue 28 item 3): three servers report their etcd
// membership on their Nodes as k3s does (EtcdIsVoter). A server whose Node is NotReady but
// whose member votes is counted, so another server reboots meanwhile (by the Nodes alone it
// waited: one server at a time); two servers whose members are unhealthy never both go,
// nor does either while only one healthy voter would be left; the Cluster's
// ControlPlaneQuorum says how the quorum stands throughout.
func TestServersCountedByEtcdQuorum(t *testing.T) {
	f, seen, agents := etcdFleet(t, "eq", 3)
	f.quorumSays(v1alpha1.ReasonQuorumKept, "3 etcd voters (eq1, eq2, eq3)")

	// eq3's kubelet is down; its etcd member still votes: eq1 reboots meanwhile.
	f.setReady("eq3", false)
	agents["eq1"].ask()
	f.waitFor("eq1 rebooted while eq3 is NotReady", 30*time.Second, func() bool {
		return agents["eq1"].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	f.setReady("eq3", true)

	// eq2's and eq3's members unhealthy: only eq1 is a healthy voter, so neither goes.
	f.setEtcd("eq2", corev1.ConditionFalse, k3s.EtcdReasonUnhealthy)
	f.setEtcd("eq3", corev1.ConditionFalse, k3s.EtcdReasonUnhealthy)
	f.quorumSays(v1alpha1.ReasonQuorumAtRisk, "eq2 not healthy (Unhealthy")
	agents["eq2"].ask()
	agents["eq3"].ask()
	f.waitFor("eq2 and eq3 told they wait for etcd's quorum", 30*time.Second, func() bool {
		st := f.cluster().Status
		return len(st.Waiting) == 2 && strings.Contains(st.Waiting[0].Reason, "etcd quorum: 2 of the 3 voters") &&
			strings.Contains(st.Waiting[1].Reason, "etcd quorum: 2 of the 3 voters") && len(st.Turns) == 0
	})
	// eq2 healthy again: eq3, still unhealthy, goes (eq1 and eq2 keep the quorum); eq2
	// waits for it, its own reboot leaving one healthy voter.
	f.setEtcd("eq2", corev1.ConditionTrue, k3s.EtcdReasonVoter)
	f.waitFor("eq3 rebooted, eq2 waiting", 30*time.Second, func() bool {
		st := f.cluster().Status
		return agents["eq3"].reboots.Load() == 1 && len(st.Turns) == 0 && agents["eq2"].reboots.Load() == 0 &&
			len(st.Waiting) == 1 && st.Waiting[0].Machine == "eq2" && strings.Contains(st.Waiting[0].Reason, "not healthy: eq3 (Unhealthy")
	})
	f.setEtcd("eq3", corev1.ConditionTrue, k3s.EtcdReasonVoter)
	f.waitFor("eq2 rebooted", 30*time.Second, func() bool {
		return agents["eq2"].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	for _, holders := range seen() {
		if len(holders) > 1 {
			t.Errorf("two servers held turns at once: %v", holders)
		}
	}
}

// TestTwoServersCannotKeepQuorum: two etcd voters have a quorum of two, so the Cluster says
// that the API stops while either reboots, and the servers still reboot one at a time.
func TestTwoServersCannotKeepQuorum(t *testing.T) {
	f, seen, agents := etcdFleet(t, "tq", 2)
	f.quorumSays(v1alpha1.ReasonTooFewVoters, "2 etcd voter(s) (tq1, tq2): the quorum is 2, so the API stops while any server reboots")
	for _, a := range agents {
		a.ask()
	}
	f.waitFor("both servers rebooted", 60*time.Second, func() bool {
		return agents["tq1"].reboots.Load() == 1 && agents["tq2"].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	for _, holders := range seen() {
		if len(holders) > 1 {
			t.Errorf("two servers held turns at once: %v", holders)
		}
	}
}

// TestCoordinatorGoesLast (scenario 10): the coordinator's own machine, waiting first,
// reboots only once no other machine waits.
func TestCoordinatorGoesLast(t *testing.T) {
	f := newFleet(t, nil, map[string]v1alpha1.Role{"last1": v1alpha1.RoleServer, "last2": v1alpha1.RoleAgent, "last3": v1alpha1.RoleAgent})
	agents := f.agents(200*time.Millisecond, f.names...)
	var order []string
	var mu sync.Mutex
	seen := f.watchTurns()
	agents["last1"].ask()
	time.Sleep(1100 * time.Millisecond) // an older wait than the others'
	agents["last2"].ask()
	agents["last3"].ask()
	f.coordinator("last1", true)
	f.waitFor("every machine rebooted", 60*time.Second, func() bool {
		for _, a := range agents {
			if a.reboots.Load() != 1 {
				return false
			}
		}
		return len(f.cluster().Status.Turns) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for _, holders := range seen() {
		if len(holders) == 1 && (len(order) == 0 || order[len(order)-1] != holders[0]) {
			order = append(order, holders[0])
		}
	}
	if len(order) != 3 || order[2] != "last1" {
		t.Errorf("turns went to %v; the coordinator's machine last1 must go last", order)
	}
}

// TestHolderNeverReturns (scenario 1): a machine that goes down and never comes back
// keeps its turn, visibly (the Cluster Degraded, naming it), and the next machine waits
// for it: the budget is never exceeded by a silent expiry. An operator gives the turn
// back; the Node, NotReady, still counts until the machine leaves the fleet.
func TestHolderNeverReturns(t *testing.T) {
	StuckAfter = 2 * time.Second
	// Put back once the test's coordinator has stopped (cleanups run last first), not while
	// it still plans with it: a defer ran before the coordinator's cleanup, a data race.
	t.Cleanup(func() { StuckAfter = 15 * time.Minute })
	f := newFleet(t, nil, machines("dead", 2, v1alpha1.RoleAgent))
	agents := f.agents(100*time.Millisecond, f.names...)
	agents["dead1"].neverReturns = true
	f.coordinator("srv-f", true)
	agents["dead1"].ask()
	f.waitFor("dead1 went down", 30*time.Second, func() bool { return agents["dead1"].reboots.Load() == 1 })
	agents["dead2"].ask()
	// The plan that says dead2 waits is the coordinator's decision on its ask.
	var st v1alpha1.ClusterStatus
	f.waitFor("dead2 told it waits for dead1", 30*time.Second, func() bool {
		st = f.cluster().Status
		return len(st.Waiting) == 1 && st.Waiting[0].Machine == "dead2" && strings.Contains(st.Waiting[0].Reason, "dead1")
	})
	if len(st.Turns) != 1 || st.Turns[0].Machine != "dead1" || agents["dead2"].reboots.Load() != 0 {
		t.Fatalf("with dead1 down, turns are %+v and dead2 rebooted %d times", st.Turns, agents["dead2"].reboots.Load())
	}
	f.waitFor("the Cluster Degraded because dead1 is not back", 30*time.Second, func() bool {
		c := meta.FindStatusCondition(f.cluster().Status.Conditions, v1alpha1.ClusterDegraded)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == "TurnHolderNotBack" && strings.Contains(c.Message, "liken release-turn")
	})
	// An operator gives the turn back (what liken release-turn writes).
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := f.cluster()
		cl.Status.Turns[0].ReleasedBy = "ops"
		_, err := f.liken.UpdateClusterStatus(t.Context(), cl)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// dead1's Node, NotReady, still counts against the budget: dead2 waits until it is gone.
	// The plan that takes the turn back says so, and gives dead2 none.
	f.waitFor("the turn taken back, dead1 uncordoned and dead2 told it waits for dead1", 30*time.Second, func() bool {
		st := f.cluster().Status
		return len(st.Turns) == 0 && len(st.Waiting) == 1 && st.Waiting[0].Machine == "dead2" && strings.Contains(st.Waiting[0].Reason, "dead1") &&
			!f.node("dead1").Spec.Unschedulable
	})
	if agents["dead2"].reboots.Load() != 0 {
		t.Fatal("dead2 rebooted while dead1's Node was NotReady")
	}
	if err := f.liken.DeleteMachine(t.Context(), "dead1"); err != nil {
		t.Fatal(err)
	}
	if err := f.admin.CoreV1().Nodes().Delete(t.Context(), "dead1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("dead2 rebooted once dead1 left the fleet", 30*time.Second, func() bool { return agents["dead2"].reboots.Load() == 1 })
}

// kubelet finishes the deletion of pods bound to the named Nodes, as a kubelet does once
// their containers stopped: the API server keeps a bound pod until its kubelet says so.
func (f *fleetFixture) kubelet(nodes ...string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			for _, n := range nodes {
				l, err := f.admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n})
				if err != nil {
					continue
				}
				for _, p := range l.Items {
					if p.DeletionTimestamp != nil {
						zero := int64(0)
						_ = f.admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
					}
				}
			}
		}
	}()
	f.t.Cleanup(func() { cancel(); <-done })
}

// pod makes a Running, Ready pod bound to node, owned by a controller (a ReplicaSet
// named after it), with labels.
func (f *fleetFixture) pod(ns, name, node string, labels map[string]string, emptyDir bool) {
	f.t.Helper()
	ctx := f.t.Context()
	f.namespace(ns)
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name + "-rs", UID: "00000000-0000-0000-0000-000000000001", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/app"}}},
	}
	if emptyDir {
		p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	}
	p, err := f.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := f.admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		zero := int64(0)
		_ = f.admin.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
}

// TestDrainEvictsAndHonoursPDBs (scenarios 3 and 5): a machine whose pod a
// PodDisruptionBudget protects (minAvailable 1, one replica) cannot be drained: when
// drain.timeout passes, its Node is uncordoned before the turn is given back, the pod and
// the PDB are named in the Cluster's status and the machine is held back, with a longer
// wait after each blocked drain. Once the PDB allows it, the pod is evicted and the
// machine reboots.
func TestDrainEvictsAndHonoursPDBs(t *testing.T) {
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) { s.Drain.Timeout = &metav1.Duration{Duration: 10 * time.Second} }, machines("pdb", 1, v1alpha1.RoleAgent))
	f.kubelet("pdb1")
	f.pod("shop", "web-0", "pdb1", map[string]string{"app": "web"}, false)
	f.pod("shop", "worker-0", "pdb1", map[string]string{"app": "worker"}, false)
	one := intstr.FromInt32(1)
	if _, err := f.admin.PolicyV1().PodDisruptionBudgets("shop").Create(t.Context(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agents := f.agents(100*time.Millisecond, "pdb1")
	metrics := f.coordinator("srv-g", true)
	// Uncordoned before the turn is given back: watch the Node at the moment the block
	// appears.
	agents["pdb1"].ask()
	var block v1alpha1.DrainBlock
	f.waitFor("the drain blocked by the PDB", 40*time.Second, func() bool {
		st := f.cluster().Status
		if len(st.DrainBlocked) == 1 {
			block = st.DrainBlocked[0]
			return true
		}
		return false
	})
	if f.node("pdb1").Spec.Unschedulable {
		t.Error("the Node is still cordoned after its blocked drain gave the turn back")
	}
	if len(f.cluster().Status.Turns) != 0 {
		t.Error("the blocked machine still holds its turn")
	}
	if !strings.Contains(block.Message, "shop/web-0") || !strings.Contains(block.Message, "PodDisruptionBudget shop/web") || len(block.BlockingPods) != 1 {
		t.Errorf("the block does not name the pod and its PDB: %+v", block)
	}
	if _, err := f.admin.CoreV1().Pods("shop").Get(t.Context(), "worker-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the unprotected pod worker-0 was not evicted: %v", err)
	}
	if agents["pdb1"].reboots.Load() != 0 {
		t.Fatal("the machine rebooted with its drain blocked")
	}
	f.waitFor("a second blocked drain, with a longer wait", 60*time.Second, func() bool {
		st := f.cluster().Status
		return len(st.DrainBlocked) == 1 && st.DrainBlocked[0].Attempts == 2 &&
			st.DrainBlocked[0].RetryAt.Sub(st.DrainBlocked[0].Since.Time) > block.RetryAt.Sub(block.Since.Time)
	})
	// Allow the disruption: the pod goes and the machine reboots.
	if err := f.admin.PolicyV1().PodDisruptionBudgets("shop").Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the machine rebooted after its pod was evicted", 60*time.Second, func() bool {
		return agents["pdb1"].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	if _, err := f.admin.CoreV1().Pods("shop").Get(t.Context(), "web-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("web-0 is still there after the drain: %v", err)
	}
	if f.node("pdb1").Spec.Unschedulable {
		t.Error("pdb1 is left cordoned")
	}
	if n := testutil.ToFloat64(metrics.Blocked); n < 2 {
		t.Errorf("liken_coordinator_drains_blocked_total = %v after two blocked drains", n)
	}
	var h dto.Metric
	if err := metrics.DrainSeconds.Write(&h); err != nil {
		t.Fatal(err)
	}
	if n := h.GetHistogram().GetSampleCount(); n != 1 || testutil.ToFloat64(metrics.Granted) < 3 || testutil.ToFloat64(metrics.Leader) != 1 {
		t.Errorf("drain durations observed %d (want the one finished drain), turns granted %v, leader %v", n, testutil.ToFloat64(metrics.Granted), testutil.ToFloat64(metrics.Leader))
	}
}

// TestMaintenanceWindow: under rebootPolicy Auto a reboot starts only inside a maintenance
// window, and the machine is told when the next opens; an operator's approval of its
// exact pending set starts it outside one; a window that is open lets Auto reboots go.
func TestMaintenanceWindow(t *testing.T) {
	now := time.Now().UTC()
	closed := v1alpha1.MaintenanceWindow{Start: now.Add(2 * time.Hour).Format("15:04"), Duration: metav1.Duration{Duration: time.Hour}}
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) {
		s.RebootPolicy = v1alpha1.RebootAuto
		s.MaintenanceWindows = []v1alpha1.MaintenanceWindow{closed}
	}, machines("win", 2, v1alpha1.RoleAgent))
	agents := f.agents(100*time.Millisecond, f.names...)
	f.coordinator("srv-h", true)
	agents["win1"].ask()
	// The plan that says win1 waits for the window is the coordinator's decision on its ask:
	// it gave no turn, and a machine reboots only on one.
	f.waitFor("win1 told when the next window opens", 30*time.Second, func() bool {
		st := f.cluster().Status
		return len(st.Waiting) == 1 && st.Waiting[0].Machine == "win1" && strings.Contains(st.Waiting[0].Reason, "the next opens at") && len(st.Turns) == 0
	})
	if agents["win1"].reboots.Load() != 0 {
		t.Fatal("an Auto reboot started outside the maintenance window")
	}
	// An operator approves win1's exact pending set: it goes now.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := f.liken.Machine(t.Context(), "win1")
		if err != nil {
			return err
		}
		m.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: m.Status.PendingHash, ApprovedBy: "ops"}}
		_, err = f.liken.UpdateMachine(t.Context(), m)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.waitFor("win1 rebooted on its approval", 30*time.Second, func() bool { return agents["win1"].reboots.Load() == 1 })
	// A window open now: win2's Auto reboot goes.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := f.cluster()
		cl.Spec.MaintenanceWindows = []v1alpha1.MaintenanceWindow{{Start: now.Add(-time.Minute).Format("15:04"), Duration: metav1.Duration{Duration: time.Hour}}}
		_, err := f.liken.UpdateCluster(t.Context(), cl)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	agents["win2"].ask()
	f.waitFor("win2 rebooted inside the open window", 30*time.Second, func() bool { return agents["win2"].reboots.Load() == 1 })
}

// TestHealthGate (scenario 7): a machine back from its reboot, its Node Ready but not yet
// healthy (it says Verifying), keeps its turn: the next machine waits until it is healthy.
func TestHealthGate(t *testing.T) {
	f := newFleet(t, nil, machines("gate", 2, v1alpha1.RoleAgent))
	seen := f.watchTurns()
	// When each machine's turn was first seen in a stored status.
	w, err := f.liken.ClusterListWatch().Watch(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	first := map[string]time.Time{}
	go func() {
		for ev := range w.ResultChan() {
			if cl, ok := ev.Object.(*v1alpha1.Cluster); ok {
				mu.Lock()
				for _, tu := range cl.Status.Turns {
					if _, ok := first[tu.Machine]; !ok {
						first[tu.Machine] = time.Now()
					}
				}
				mu.Unlock()
			}
		}
	}()
	seenAt := func(m string) time.Time { mu.Lock(); defer mu.Unlock(); return first[m] }
	agents := f.agents(100*time.Millisecond, f.names...)
	agents["gate1"].verifyFor = 2 * time.Second
	f.coordinator("srv-i", true)
	agents["gate1"].ask()
	f.waitFor("gate1 verifying", 30*time.Second, func() bool { return agents["gate1"].verified.Load() != 0 })
	agents["gate2"].ask()
	f.waitFor("both rebooted", 30*time.Second, func() bool {
		return agents["gate2"].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	healthyAt := time.Unix(0, agents["gate1"].verified.Load())
	// From the stored statuses, in order: gate1's turn ended before gate2's began, and
	// gate2's began only once gate1 said it was healthy.
	order := []string{}
	for _, holders := range seen() {
		if len(holders) > 1 {
			t.Errorf("turns held at once: %v", holders)
		}
		if len(holders) == 1 && (len(order) == 0 || order[len(order)-1] != holders[0]) {
			order = append(order, holders[0])
		}
	}
	if len(order) != 2 || order[0] != "gate1" || order[1] != "gate2" {
		t.Errorf("turns went to %v; want gate1, then gate2", order)
	}
	if grantedAt := seenAt("gate2"); grantedAt.Before(healthyAt) {
		t.Errorf("gate2's turn was seen at %s, before gate1 was healthy at %s", grantedAt.Format(time.StampMilli), healthyAt.Format(time.StampMilli))
	}
}

// TestAPIServerAwayDuringRollout (scenario 12): kube-apiserver goes away in the middle of a
// rollout and comes back; nothing is granted twice or beyond the budget, and the rollout
// finishes with no Node left cordoned.
func TestAPIServerAwayDuringRollout(t *testing.T) {
	f := newFleet(t, nil, machines("away", 3, v1alpha1.RoleAgent))
	seen := f.watchTurns()
	agents := f.agents(300*time.Millisecond, f.names...)
	f.coordinator("srv-j", true)
	for _, a := range agents {
		a.ask()
	}
	f.waitFor("the first turn", 30*time.Second, func() bool { return len(f.cluster().Status.Turns) == 1 })
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := env.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := seen
	seen = f.watchTurns() // the first watch ended with the API server
	f.waitFor("every machine rebooted", 90*time.Second, func() bool {
		for _, a := range agents {
			if a.reboots.Load() < 1 {
				return false
			}
		}
		return len(f.cluster().Status.Turns) == 0
	})
	for _, holders := range append(before(), seen()...) {
		if len(holders) > 1 {
			t.Errorf("turns held at once: %v", holders)
		}
	}
	for _, a := range agents {
		if n := a.reboots.Load(); n != 1 {
			t.Errorf("%s rebooted %d times", a.name, n)
		}
		if f.node(a.name).Spec.Unschedulable {
			t.Errorf("%s is left cordoned", a.name)
		}
	}
}

// reasons is a Recorder that keeps the reasons of the Events the coordinator records.
type reasons struct {
	mu   sync.Mutex
	seen []string
}

func (r *reasons) Event(obj runtime.Object, typ, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, reason)
}

func (r *reasons) has(reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.seen, reason)
}

// TestRolloutPaused (issue 27 item 1): under Auto, with the rollout paused, a machine that
// asks is told it waits for the pause and is given no turn; the Cluster says who paused, and
// the coordinator records RolloutPaused; resumed, it reboots, and RolloutResumed is recorded.
// Paused again while another machine's turn is in progress, that turn finishes, and a third
// machine waits for the pause until the rollout is resumed.
func TestRolloutPaused(t *testing.T) {
	at := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) {
		s.RebootPolicy = v1alpha1.RebootAuto
		s.Rollout = &v1alpha1.Rollout{Paused: true, PausedBy: "ops", PausedAt: &at, Reason: "the canary"}
	}, machines("pause", 3, v1alpha1.RoleAgent))
	// pause2 is down 10 s: its turn is in progress (held until it is back) while the test
	// pauses the rollout, on a host however busy.
	agents := f.agents(2*time.Second, "pause1", "pause3")
	agents["pause2"] = f.agents(10*time.Second, "pause2")["pause2"]
	events := &reasons{}
	f.coordinatorWith("srv-p", true, func(c *Config) { c.Events = events })
	agents["pause1"].ask()
	// The plan that says pause1 waits for the pause is the coordinator's decision on its
	// ask: it gave no turn, and a machine reboots only on one.
	f.waitFor("pause1 told it waits for the pause", 30*time.Second, func() bool {
		st := f.cluster().Status
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ClusterRolloutPaused)
		return len(st.Waiting) == 1 && st.Waiting[0].Machine == "pause1" && strings.Contains(st.Waiting[0].Reason, "the rollout is paused (spec.rollout.paused, by ops") &&
			len(st.Turns) == 0 && c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "the canary")
	})
	if agents["pause1"].reboots.Load() != 0 {
		t.Fatal("a machine rebooted while the rollout was paused")
	}
	f.waitFor("the RolloutPaused Event", 10*time.Second, func() bool { return events.has("RolloutPaused") })
	// setPaused pauses (with a reason) or resumes the rollout, as liken rollout pause|resume
	// writes it.
	setPaused := func(reason string) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cl := f.cluster()
			cl.Spec.Rollout = nil
			if reason != "" {
				at := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
				cl.Spec.Rollout = &v1alpha1.Rollout{Paused: true, PausedBy: "ops", PausedAt: &at, Reason: reason}
			}
			_, err := f.liken.UpdateCluster(t.Context(), cl)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	setPaused("")
	f.waitFor("pause1 rebooted once resumed", 30*time.Second, func() bool { return agents["pause1"].reboots.Load() == 1 })
	f.waitFor("the RolloutResumed Event", 10*time.Second, func() bool { return events.has("RolloutResumed") })
	if c := meta.FindStatusCondition(f.cluster().Status.Conditions, v1alpha1.ClusterRolloutPaused); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("RolloutPaused after resume: %+v", c)
	}
	f.waitFor("pause1's turn given back", 30*time.Second, func() bool { return len(f.cluster().Status.Turns) == 0 })

	// Paused while a turn is in progress: that turn finishes (the machine reboots and its
	// turn is given back), and the next machine waits for the pause though the budget has
	// room for it.
	agents["pause2"].ask()
	f.waitFor("pause2 holding its turn", 30*time.Second, func() bool { return turnOf(f.cluster(), "pause2") != nil })
	setPaused("mid-turn")
	// Its reboot may have begun (a drain of no pods is quick): what matters is that the turn
	// is still in progress, given back only once pause2 is back.
	if turnOf(f.cluster(), "pause2") == nil {
		t.Fatal("pause2's turn ended before the pause was written: the test proves nothing of a turn in progress")
	}
	agents["pause3"].ask()
	f.waitFor("pause2's turn finished though the rollout is paused", 30*time.Second, func() bool {
		return agents["pause2"].reboots.Load() == 1 && turnOf(f.cluster(), "pause2") == nil
	})
	f.waitFor("pause3 told it waits for the pause", 30*time.Second, func() bool {
		st := f.cluster().Status
		return len(st.Waiting) == 1 && st.Waiting[0].Machine == "pause3" && strings.Contains(st.Waiting[0].Reason, "mid-turn")
	})
	// Ten of the coordinator's resync periods: still no turn for pause3.
	time.Sleep(3 * time.Second)
	if turnOf(f.cluster(), "pause3") != nil || agents["pause3"].reboots.Load() != 0 {
		t.Fatal("pause3 was given a turn while the rollout was paused")
	}
	setPaused("")
	f.waitFor("pause3 rebooted once resumed", 30*time.Second, func() bool { return agents["pause3"].reboots.Load() == 1 })
}

// TestRolloutHalts: under Auto, four machines want a release whose trial fails on each.
// With maxFailures at its default of 1, the first machine's failure halts the rollout: the
// Cluster says so (RolloutPaused, Halted, naming it; status.rollout.failures; a
// RolloutHalted Event), and no other machine is given a turn, as a watch of every version
// of the Cluster's status shows. A resume accepts that failure: one more machine tries,
// fails, and the rollout halts again, with two machines untouched.
func TestRolloutHalts(t *testing.T) {
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) { s.RebootPolicy = v1alpha1.RebootAuto }, machines("halt", 4, v1alpha1.RoleAgent))
	seen := f.watchTurns()
	cordoned := f.watchCordons()
	// Down 1.5 s: a failure is recorded to the second, as is a resume, and one in the
	// resume's second counts as accepted.
	agents := f.agents(1500*time.Millisecond, f.names...)
	for _, a := range agents {
		a.failTrial = true
	}
	events := &reasons{}
	metrics := f.coordinatorWith("srv-h", true, func(c *Config) { c.Events = events })
	for _, a := range agents {
		a.ask()
	}
	touched := func() map[string]bool {
		out := map[string]bool{}
		for _, holders := range seen() {
			for _, m := range holders {
				out[m] = true
			}
		}
		return out
	}
	halted := func(n int) func() bool {
		return func() bool {
			st := f.cluster().Status
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ClusterRolloutPaused)
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonHalted &&
				st.Rollout != nil && st.Rollout.Halted != nil && len(st.Rollout.Failures) == n && len(st.Turns) == 0
		}
	}
	f.waitFor("the rollout halted after the first failed trial", 30*time.Second, halted(1))
	st := f.cluster().Status
	first := st.Rollout.Halted.Machines[0]
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ClusterRolloutPaused); !strings.Contains(c.Message, first+" (HealthDeadline: the test's trial fails)") {
		t.Errorf("RolloutPaused says %q; want the failed machine and why", c.Message)
	}
	f.waitFor("the RolloutHalted Event", 10*time.Second, func() bool { return events.has("RolloutHalted") })
	// Ten of the coordinator's resync periods: nobody else is given a turn.
	time.Sleep(3 * time.Second)
	if got := touched(); len(got) != 1 || !got[first] {
		t.Fatalf("machines given a turn: %v; want only %s, whose trial failed", keys(got), first)
	}
	if got := cordoned(); len(got) != 1 || !got[first] {
		t.Fatalf("Nodes cordoned: %v; want only %s, whose trial failed", keys(got), first)
	}
	for _, w := range f.cluster().Status.Waiting {
		if !strings.HasPrefix(w.Reason, "the rollout halted") {
			t.Errorf("%s waits for %q, want the halt", w.Machine, w.Reason)
		}
	}
	if n := testutil.ToFloat64(metrics.Halts); n != 1 {
		t.Errorf("liken_coordinator_rollout_halts_total = %v, want 1", n)
	}

	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := f.cluster()
		now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
		cl.Spec.Rollout = &v1alpha1.Rollout{ResumedAt: &now}
		_, err := f.liken.UpdateCluster(t.Context(), cl)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.waitFor("one more machine tried and the rollout halted again", 60*time.Second, func() bool {
		return halted(2)() && len(touched()) == 2
	})
	time.Sleep(3 * time.Second)
	got := touched()
	if len(got) != 2 {
		t.Fatalf("machines given a turn: %v; want two: one before the resume, one after", keys(got))
	}
	if c := cordoned(); !maps.Equal(c, got) {
		t.Fatalf("Nodes cordoned: %v; want only those given a turn, %v", keys(c), keys(got))
	}
	st = f.cluster().Status
	if h := st.Rollout.Halted; len(h.Machines) != 1 || h.Machines[0] == first || !st.Rollout.Failures[0].Accepted || st.Rollout.Failures[1].Accepted {
		t.Errorf("after the resume: halted %+v, failures %+v; want the second machine alone, the first failure accepted", h, st.Rollout.Failures)
	}
	for _, a := range agents {
		if want := map[bool]int32{true: 1, false: 0}[got[a.name]]; a.reboots.Load() != want {
			t.Errorf("%s rebooted %d times, want %d", a.name, a.reboots.Load(), want)
		}
	}
}
