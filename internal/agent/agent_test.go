package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/coordinator"
	"liken.dev/liken/internal/host/clock"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/host/sysctl"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/standin"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

// The test binary doubles as the k3s stand-in the supervisor runs (LIKEN_TEST_HELPER).
func TestMain(m *testing.M) {
	if os.Getenv("LIKEN_TEST_HELPER") == "k3s-standin" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		code := standin.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(apiserver.Main(m, "agent", apiserver.Options{}, &env))
}

func ptr[T any](v T) *T { return &v }

// sim is one simulated machine: the real agent, init's real supervisor running the k3s
// stand-in on the files the agent renders, and a fake /proc/sys tree.
type sim struct {
	name    string
	role    v1alpha1.Role
	dir     string
	sysctl  sysctl.Host
	paths   k3s.Paths
	k3s     *supervisor.Process
	cancel  context.CancelFunc
	done    chan struct{}
	metrics *Metrics
	healthz string
	// bootCtl and slotDevice, when set, stand for init's boot control and the slots.
	bootCtl    Boot
	slotDevice SlotDevice
	// wrap, when set, wraps the agent's transport to the API server (to cut it); lastWords
	// is the agent's LastWords (zero: its default).
	wrap      func(http.RoundTripper) http.RoundTripper
	lastWords time.Duration
	// coordinator makes the agent run the reboot coordinator, as a server's agent does.
	coordinator bool
	// clock, when set, is the clock the agent keeps, every 200 ms.
	clock *clock.Clock
	// inventory, when set, is read every 200 ms for status.hardware and status.network.
	inventory func() (*v1alpha1.Hardware, *v1alpha1.NetworkStatus)
	// restartDelay is the agent's RestartDelay (zero: 500 ms).
	restartDelay time.Duration
	// peerWait is the agent's PeerWait (zero: its default).
	peerWait time.Duration
	// snapshot is the agent's Snapshot (its etcd snapshot for a turn), retried every
	// snapshotRetry after a failure.
	snapshot      func(context.Context) (k3s.Snapshot, error)
	snapshotRetry time.Duration
	// kubeletLate: start does not give the stand-in this boot's ID, so its Node goes on
	// reporting the boot before, as a kubelet that has not started yet leaves it.
	kubeletLate bool
	// agent is the agent start started last.
	agent *Agent
}

// initReport makes the boot's report as init does when a test gives none: init applied the
// network and disks its trial rules give (state.BootSettings), and the kernel modules the
// agent staged last (internal/initd useStaged).
func (b *fakeBoot) initReport(stateDir string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.info.Report != nil {
		return
	}
	r := &state.BootReport{PreflightDone: true} // the sim has no k3s for init to check
	if st, err := (state.Store{Dir: stateDir}).Load(); err == nil && st.Staged != nil {
		r.Network, r.Disks, _ = st.BootSettings(b.info.Trial, b.info.Slot, b.info.Boots)
		r.KernelModules, r.Swap = st.Staged.Machine.KernelModules, st.Staged.Cluster.Features.Swap
		for _, d := range r.Disks {
			ds := v1alpha1.DiskStatus{Device: d.Device, Phase: v1alpha1.DiskReady, Reason: v1alpha1.DiskPrepared}
			if b.refuseDisks {
				ds.Phase, ds.Reason = v1alpha1.DiskRefused, v1alpha1.DiskHoldsData
				r.NotApplied = map[string]string{"machine.spec.disks": "not ready: " + string(d.Device) + ": HoldsData (see status.disks)"}
			}
			r.DiskStatus = append(r.DiskStatus, ds)
		}
	}
	b.info.Report = r
}

// bootIDFile is where the sim's stand-in reads the boot ID its Node reports: the boot ID of
// the sim's boot control, written by start, as a kubelet reports its kernel's.
func (s *sim) bootIDFile() string { return filepath.Join(s.dir, "boot_id") }

// reportBoot makes the stand-in's Node report the sim's current boot.
func (s *sim) reportBoot(t testing.TB) {
	t.Helper()
	bi, err := s.bootCtl.BootInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.bootIDFile(), []byte(bi.BootID+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func newSim(t testing.TB, name string, role v1alpha1.Role) *sim {
	t.Helper()
	dir := t.TempDir()
	s := &sim{name: name, role: role, dir: dir, sysctl: sysctl.Host{Root: filepath.Join(dir, "proc-sys")}}
	// An agent a test left running is stopped before its directory is removed (cleanups run
	// last registered first): one still writing its state there failed the removal.
	t.Cleanup(func() {
		if s.cancel != nil {
			s.stop()
		}
	})
	for k, v := range map[string]string{"net/ipv4/ip_forward": "0", "vm/swappiness": "60", "net/core/somaxconn": "4096"} {
		p := filepath.Join(s.sysctl.Root, k)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(v+"\n"), 0o644)
	}
	etc := filepath.Join(dir, "etc-rancher-k3s")
	s.paths = k3s.Paths{Config: filepath.Join(etc, "config.yaml"), Registries: filepath.Join(etc, "registries.yaml"),
		RegistryFiles: filepath.Join(etc, "registry-files"), TokenFile: filepath.Join(dir, "token"), DataDir: filepath.Join(dir, "k3s")}
	return s
}

// restarts is how often the supervisor restarted k3s (its first start is init's).
func (s *sim) restarts() int { return s.k3s.Starts() - 1 }

// boot does what init does before the agent runs: render k3s's files from the Cluster and
// Machine and start k3s under the supervisor, with its socket for the agent.
func (s *sim) boot(t testing.TB, f *fixture) {
	t.Helper()
	c, err := f.liken.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out, err := k3s.Render(k3s.Input{Role: s.role, NodeName: s.name, Cluster: c.Spec, Join: "https://s1:6443", Paths: s.paths})
	if err != nil {
		t.Fatal(err)
	}
	if err := k3s.Root("/").Write(out); err != nil {
		t.Fatal(err)
	}
	nodeCfg, err := env.UserConfig("system:node:"+s.name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(s.dir, "node.kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, nodeCfg); err != nil {
		t.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	healthz := l.Addr().String()
	l.Close()
	s.healthz = "http://" + healthz + "/healthz"
	s.k3s = supervisor.New(supervisor.Spec{Name: "k3s", Path: os.Args[0], Args: []string{string(s.role), "--config", s.paths.Config},
		Env:    append(os.Environ(), "LIKEN_TEST_HELPER=k3s-standin", "LIKEN_STANDIN_KUBECONFIG="+kc, "LIKEN_STANDIN_HEALTHZ="+healthz, "LIKEN_STANDIN_BOOT_ID_FILE="+s.bootIDFile(), "LIKEN_STANDIN_PREFLIGHT=off"),
		Stderr: os.Stderr, RestartDelay: 200 * time.Millisecond, StopTimeout: 5 * time.Second}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.k3s.Run(ctx)
	go (&supervisor.Server{Processes: map[string]*supervisor.Process{"k3s": s.k3s}}).Serve(ctx, filepath.Join(s.dir, "init.sock"))
}

func (s *sim) start(t testing.TB) {
	t.Helper()
	if s.bootCtl != nil && !s.kubeletLate {
		s.reportBoot(t)
	}
	if fb, ok := s.bootCtl.(*fakeBoot); ok {
		fb.initReport(filepath.Join(s.dir, "state"))
	}
	cfg, err := env.UserConfig(authority.User(s.name), authority.Group)
	if err != nil {
		t.Fatal(err)
	}
	s.metrics = NewMetrics()
	if s.wrap != nil {
		cfg.Wrap(s.wrap)
	}
	delay := s.restartDelay
	if delay == 0 {
		delay = 500 * time.Millisecond
	}
	a, err := New(Config{
		Machine: s.name, REST: cfg, State: state.Store{Dir: filepath.Join(s.dir, "state")},
		Sysctl: s.sysctl, K3sRoot: k3s.Root("/"), K3sPaths: s.paths, Join: "https://s1:6443", SwapOn: func() bool { return false },
		Restarter: supervisor.Client{Socket: filepath.Join(s.dir, "init.sock")}, RestartDelay: delay,
		Metrics: s.metrics, Hardware: &v1alpha1.Hardware{CPU: v1alpha1.CPUInfo{Threads: 2}},
		Boot: s.bootCtl, SlotDevice: s.slotDevice, K3sHealthz: s.healthz, LastWords: s.lastWords, PeerWait: s.peerWait,
		Coordinator: s.coordinatorConfig(), Clock: s.clock, ClockEvery: 200 * time.Millisecond,
		Inventory: s.inventory, InventoryEvery: 200 * time.Millisecond,
		Snapshot: s.snapshot, SnapshotRetry: s.snapshotRetry,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.agent, s.cancel, s.done = a, cancel, make(chan struct{})
	go func() { defer close(s.done); a.Run(ctx) }()
}

func (s *sim) stop() { s.cancel(); <-s.done }

// coordinatorConfig is the coordinator's timing for the tests (the agent fills in the rest),
// when the sim runs one.
func (s *sim) coordinatorConfig() *coordinator.Config {
	if !s.coordinator {
		return nil
	}
	c := fastCoordinator
	return &c
}

// fastCoordinator leads within seconds of a Lease given up or lost, and looks again often.
var fastCoordinator = coordinator.Config{LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
	Resync: 500 * time.Millisecond, EvictRetry: 200 * time.Millisecond}

type fixture struct {
	t     testing.TB
	admin kubernetes.Interface
	liken *kube.Client
	// stopCoordinator stops the coordinator setup started (nil: none runs).
	stopCoordinator func()
}

// setup makes the machines' Machines and RBAC, and runs a reboot coordinator apart from
// them (see startCoordinator).
func setup(t testing.TB, machines map[string]v1alpha1.Role) *fixture {
	f := setupFleet(t, machines)
	f.startCoordinator(t)
	return f
}

// setupFleet is setup with no coordinator: the tests' own server sims run it.
func setupFleet(t testing.TB, machines map[string]v1alpha1.Role) *fixture {
	t.Helper()
	ctx := t.Context()
	f := &fixture{t: t, admin: kubernetes.NewForConfigOrDie(env.Admin)}
	var err error
	if f.liken, err = kube.NewClient(env.Admin); err != nil {
		t.Fatal(err)
	}
	var names, servers []string
	for n, role := range machines {
		names = append(names, n)
		if role == v1alpha1.RoleServer {
			servers = append(servers, n)
		}
	}
	if err := authority.Install(ctx, f.admin, names...); err != nil {
		t.Fatal(err)
	}
	// Servers may run the coordinator (sim.coordinator).
	if err := authority.InstallServers(ctx, f.admin, servers...); err != nil {
		t.Fatal(err)
	}
	if _, err := f.liken.Cluster(ctx); err != nil {
		_, err = f.liken.CreateCluster(ctx, &v1alpha1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterName},
			Spec: v1alpha1.ClusterSpec{Channel: "file:///srv/channel", Version: "2026.07.20-001",
				Releases: map[string]v1alpha1.Digest{"2026.07.20-001": v1alpha1.Digest("sha256:" + strings.Repeat("0", 64))}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for n, role := range machines {
		if _, err := f.liken.CreateMachine(ctx, &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: v1alpha1.MachineSpec{Role: role}}); err != nil {
			t.Fatal(err)
		}
	}
	// Registered first, so it runs after the machines' own clean-ups have stopped them: a
	// test's machines leave the fleet, and no later test counts their Nodes as unavailable.
	t.Cleanup(func() {
		ctx := context.Background()
		for _, n := range names {
			_ = f.admin.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
			_ = f.liken.DeleteMachine(ctx, n)
		}
	})
	return f
}

// startCoordinator runs the real reboot coordinator, as a server machine's agent runs it,
// with the credentials of a server named "coordinator" that has no Machine of its own;
// f.stopCoordinator stops it (a test may start another).
func (f *fixture) startCoordinator(t testing.TB) {
	t.Helper()
	if err := authority.InstallServers(t.Context(), f.admin, "coordinator"); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.UserConfig(authority.User("coordinator"), authority.Group)
	if err != nil {
		t.Fatal(err)
	}
	cc := fastCoordinator
	cc.Machine, cc.REST = "coordinator", cfg
	co, err := coordinator.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); co.Run(ctx) }()
	var once sync.Once
	f.stopCoordinator = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(f.stopCoordinator)
}

func (f *fixture) editMachine(name string, edit func(*v1alpha1.Machine)) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := f.liken.Machine(f.t.Context(), name)
		if err != nil {
			return err
		}
		edit(m)
		_, err = f.liken.UpdateMachine(f.t.Context(), m)
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) editCluster(edit func(*v1alpha1.Cluster)) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := f.liken.Cluster(f.t.Context())
		if err != nil {
			return err
		}
		edit(c)
		_, err = f.liken.UpdateCluster(f.t.Context(), c)
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// restoreCluster edits the Cluster back when the test ends (its context is gone by then),
// retrying when the coordinator's status writes got in between.
func (f *fixture) restoreCluster(t *testing.T, edit func(*v1alpha1.Cluster)) {
	t.Cleanup(func() {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c, err := f.liken.Cluster(context.Background())
			if err != nil {
				return err
			}
			edit(c)
			_, err = f.liken.UpdateCluster(context.Background(), c)
			return err
		})
		if err != nil {
			t.Errorf("restoring the Cluster: %v", err)
		}
	})
}

// waitFor polls the Machine until ok holds, failing with the last status.
func (f *fixture) waitFor(t *testing.T, name, what string, ok func(*v1alpha1.Machine, *corev1.Node) bool) {
	t.Helper()
	var last *v1alpha1.Machine
	var lastNode *corev1.Node
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		m, err := f.liken.Machine(ctx, name)
		if err != nil {
			return false, nil
		}
		n, err := f.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last, lastNode = m, n
		return m.Status.ObservedGeneration == m.Generation && ok(m, n), nil
	})
	if err != nil {
		t.Fatalf("%s: %s never happened; last status: %+v\nnode labels %v taints %v", name, what, last.Status, lastNode.Labels, lastNode.Spec.Taints)
	}
}

// passes is how many reconcile passes the agent s runs has finished.
func (s *sim) passes() uint64 {
	var d dto.Metric
	if err := s.metrics.ReconcileSeconds.Write(&d); err != nil {
		return 0
	}
	return d.GetHistogram().GetSampleCount()
}

// reconciled waits until the agent s runs has what seen looks for in its caches (nil:
// anything, once they are synced), then until a reconcile pass begun after that has ended.
// A pass does all it decides on (a reboot, a trial's commit, a slot job, its Events
// recorded) before it ends, whether or not it writes the status. So a check that something
// did not happen waits for this first where no status of the change's generation shows
// the agent took the change in: a Cluster edit while the machine goes down, an agent
// started again with nothing to change, a later look at what it reported already.
func (s *sim) reconciled(t *testing.T, what string, seen func(*v1alpha1.Machine, *v1alpha1.Cluster, *corev1.Node) bool) {
	t.Helper()
	a := s.agent
	var last *v1alpha1.Machine
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		if !a.synced.Load() { // the caches are made and listed before
			return false, nil
		}
		m, c, n, err := a.observe()
		if err != nil || m == nil || c == nil {
			return false, nil
		}
		last = m
		return seen == nil || seen(m, c, n), nil
	})
	if err != nil {
		if last == nil {
			t.Fatalf("%s: the agent's caches never held its Machine and the Cluster (waiting for %s)", s.name, what)
		}
		t.Fatalf("%s: the agent's caches never showed %s; the Machine's status there: %+v", s.name, what, last.Status)
	}
	// Each pass holds a.mu throughout, so none is under way here: the pass counted next
	// begins after the caches showed it.
	a.mu.Lock()
	before := s.passes()
	a.queue.Add(keyReconcile)
	a.mu.Unlock()
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return s.passes() > before, nil
	})
	if err != nil {
		t.Fatalf("%s: no reconcile pass ended in 30 s after the agent's caches showed %s (%d passes before)", s.name, what, before)
	}
}

// apiRequests is how many requests the agent s runs has sent to the API server.
func (s *sim) apiRequests() float64 {
	fams, err := s.metrics.Registry.Gather()
	if err != nil {
		return 0
	}
	n := 0.0
	for _, f := range fams {
		if f.GetName() == "liken_agent_api_requests_total" {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// eventsSent waits until every Event the agent s runs has recorded so far is in the API
// server: its recorder sends them in the background.
func (s *sim) eventsSent(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if unsent := s.agent.events.Flush(ctx); len(unsent) > 0 {
		t.Fatalf("%s: %d Events the agent recorded were not sent in 30 s, the first %s: %s", s.name, len(unsent), unsent[0].Reason, unsent[0].Message)
	}
}

func condTrue(m *v1alpha1.Machine, t string) bool {
	return meta.IsStatusConditionTrue(m.Status.Conditions, t)
}

func TestAgentAppliesClassifiesAndStages(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"s1": v1alpha1.RoleServer, "a1": v1alpha1.RoleAgent})
	s1, a1 := newSim(t, "s1", v1alpha1.RoleServer), newSim(t, "a1", v1alpha1.RoleAgent)
	// A restart delay long enough that three edits in a row fall inside it even on a loaded
	// machine, where each API write can take a few hundred milliseconds.
	s1.restartDelay, a1.restartDelay = 2*time.Second, 2*time.Second
	s1.boot(t, f)
	a1.boot(t, f)
	s1.start(t)
	a1.start(t)
	defer func() { s1.stop(); a1.stop() }()
	for _, n := range []string{"s1", "a1"} {
		f.waitFor(t, n, "Ready and ConfigApplied", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return condTrue(m, v1alpha1.MachineReady) && condTrue(m, v1alpha1.MachineConfigApplied) && m.Status.Hardware != nil
		})
	}
	// Init rendered the same files the agent renders: nothing to restart.
	if s1.restarts() != 0 || a1.restarts() != 0 {
		t.Errorf("k3s restarted at start-up: server %d, agent %d times", s1.restarts(), a1.restarts())
	}

	t.Run("labels, taints and sysctls apply live", func(t *testing.T) {
		f.editMachine("s1", func(m *v1alpha1.Machine) {
			m.Spec.NodeLabels = map[string]v1alpha1.LabelValue{"example.com/rack": "r1"}
			m.Spec.NodeTaints = []v1alpha1.Taint{{Key: "example.com/dedicated", Value: "db", Effect: "NoSchedule"}}
			m.Spec.Sysctls = v1alpha1.Sysctls{"net.ipv4.ip_forward": "1", "kernel.no_such_key": "1"}
		})
		f.waitFor(t, "s1", "labels, taints, sysctl applied and the unknown key reported", func(m *v1alpha1.Machine, n *corev1.Node) bool {
			c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineConfigApplied)
			return n.Labels["example.com/rack"] == "r1" && hasTaint(n, "example.com/dedicated", "db") &&
				c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "sysctl kernel.no_such_key") &&
				condTrue(m, v1alpha1.MachineDegraded)
		})
		if v, _ := s1.sysctl.Read("net.ipv4.ip_forward"); v != "1" {
			t.Errorf("ip_forward = %s, want 1 (the bad key must not stop the others)", v)
		}
		// Remove the bad key: the machine recovers; remove ip_forward: the original returns.
		f.editMachine("s1", func(m *v1alpha1.Machine) { m.Spec.Sysctls = nil })
		f.waitFor(t, "s1", "sysctls restored and healthy again", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return condTrue(m, v1alpha1.MachineConfigApplied) && !condTrue(m, v1alpha1.MachineDegraded)
		})
		if v, _ := s1.sysctl.Read("net.ipv4.ip_forward"); v != "0" {
			t.Errorf("ip_forward after removal = %s, want the original 0", v)
		}
	})

	t.Run("labels others set are left alone", func(t *testing.T) {
		n, _ := f.admin.CoreV1().Nodes().Get(t.Context(), "s1", metav1.GetOptions{})
		n.Labels["team"] = "storage"
		if _, err := f.admin.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.editMachine("s1", func(m *v1alpha1.Machine) { m.Spec.NodeLabels = nil; m.Spec.NodeTaints = nil })
		f.waitFor(t, "s1", "liken's label and taint removed", func(m *v1alpha1.Machine, n *corev1.Node) bool {
			_, has := n.Labels["example.com/rack"]
			return !has && !hasTaint(n, "example.com/dedicated", "db")
		})
		n, _ = f.admin.CoreV1().Nodes().Get(t.Context(), "s1", metav1.GetOptions{})
		if n.Labels["team"] != "storage" || n.Labels["kubernetes.io/hostname"] != "s1" {
			t.Errorf("labels liken did not set were changed: %v", n.Labels)
		}
	})

	t.Run("live changes apply while the rollout is paused", func(t *testing.T) {
		// A pause holds turns (the coordinator's); nothing live waits for one.
		at := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
		f.editCluster(func(c *v1alpha1.Cluster) {
			c.Spec.Rollout = &v1alpha1.Rollout{Paused: true, PausedBy: "ops", PausedAt: &at, Reason: "the test"}
		})
		f.editMachine("a1", func(m *v1alpha1.Machine) {
			m.Spec.NodeLabels = map[string]v1alpha1.LabelValue{"example.com/paused": "applied"}
		})
		f.waitFor(t, "a1", "the label applied while paused", func(m *v1alpha1.Machine, n *corev1.Node) bool {
			return n.Labels["example.com/paused"] == "applied" && condTrue(m, v1alpha1.MachineConfigApplied)
		})
		f.editMachine("a1", func(m *v1alpha1.Machine) { m.Spec.NodeLabels = nil })
		f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Rollout = nil })
		f.waitFor(t, "a1", "the label removed", func(_ *v1alpha1.Machine, n *corev1.Node) bool {
			_, has := n.Labels["example.com/paused"]
			return !has
		})
	})

	t.Run("a packaged component restarts k3s once, on servers only", func(t *testing.T) {
		before1, beforeA := s1.restarts(), a1.restarts()
		// A burst of three edits inside the restart delay.
		f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Features.Traefik = ptr(false) })
		f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Features.MetricsServer = ptr(false) })
		f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Features.LocalStorage = ptr(false) })
		waitCount(t, "a server restart", func() bool { return s1.restarts() > before1 })
		// Each machine has applied the last edit and has no restart pending (ConfigApplied
		// says RestartingK3s while one is): no further restart can come, so the counts are
		// final. Ready: the restarted k3s is healthy again before the next subtest.
		c, err := f.liken.Cluster(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"s1", "a1"} {
			f.waitFor(t, n, fmt.Sprintf("Cluster generation %d applied, no k3s restart pending, Ready", c.Generation), func(m *v1alpha1.Machine, _ *corev1.Node) bool {
				return m.Status.AppliedClusterGeneration >= c.Generation && condTrue(m, v1alpha1.MachineConfigApplied) && condTrue(m, v1alpha1.MachineReady)
			})
		}
		if got := s1.restarts() - before1; got != 1 {
			t.Errorf("server restarted k3s %d times for a burst of three edits, want 1", got)
		}
		if got := a1.restarts() - beforeA; got != 0 {
			t.Errorf("agent restarted k3s %d times for a server-only change, want 0", got)
		}
		cfg, _ := os.ReadFile(s1.paths.Config)
		for _, c := range []string{"traefik", "metrics-server", "local-storage"} {
			if !strings.Contains(string(cfg), "- "+c) {
				t.Errorf("server config does not disable %s:\n%s", c, cfg)
			}
		}
	})

	t.Run("network changes are staged, not applied, and a revert clears them", func(t *testing.T) {
		before := s1.restarts()
		f.editMachine("s1", func(m *v1alpha1.Machine) {
			m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
			m.Spec.KernelArgs = []v1alpha1.KernelArg{"quiet"}
			m.Spec.Disks = []v1alpha1.Disk{{Device: "/dev/vdb", Partitions: []v1alpha1.Partition{{Label: "data", Filesystem: "ext4", MountPoint: "/var/mnt/data"}}}}
		})
		var hash string
		f.waitFor(t, "s1", "network, disks and kernelArgs pending", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			hash = m.Status.PendingHash
			return len(m.Status.Pending) == 3 && m.Status.PendingCount == 3 && condTrue(m, v1alpha1.MachineRebootPending) &&
				m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval && strings.HasPrefix(hash, "sha256:")
		})
		m, _ := f.liken.Machine(t.Context(), "s1")
		// The status of the edit's generation: had the staged fields changed k3s's files, a
		// restart would be pending (it comes RestartDelay later) and ConfigApplied would say so.
		if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineConfigApplied); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("after a staged change ConfigApplied is %+v; want True, no k3s restart pending", c)
		}
		got := map[string]v1alpha1.ChangeClass{}
		for _, p := range m.Status.Pending {
			got[p.Field] = p.Class
			if p.Since.IsZero() {
				t.Errorf("pending %s has no since", p.Field)
			}
		}
		if got["machine.spec.network"] != v1alpha1.Reboot || got["machine.spec.disks"] != v1alpha1.Reboot || got["machine.spec.kernelArgs"] != v1alpha1.NextBoot {
			t.Errorf("pending classes = %v", got)
		}
		if s1.restarts() != before {
			t.Errorf("a staged change restarted k3s")
		}
		// An approval for this exact set counts, but this machine has no boot control (liken's
		// init did not boot it): status says it cannot reboot, instead of "rebooting". The
		// decision itself is tested with boot control in TestApprovedRebootWithoutNewRelease.
		f.editMachine("s1", func(m *v1alpha1.Machine) {
			m.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: hash, ApprovedBy: "test"}}
		})
		f.waitFor(t, "s1", "the approval counted, and the machine says it cannot reboot (and asks for no turn)", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return m.Status.Reboot.State == v1alpha1.RebootNone && m.Status.PendingHash == hash && strings.Contains(m.Status.Reboot.Message, "approved by test") &&
				strings.Contains(m.Status.Reboot.Message, "liken cannot reboot it")
		})
		// A new edit while staged changes the set, so the earlier approval no longer counts.
		f.editMachine("s1", func(m *v1alpha1.Machine) {
			m.Spec.Disks[0].Partitions[0].MountPoint = "/var/mnt/other"
		})
		f.waitFor(t, "s1", "a changed set needs a new approval", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return m.Status.PendingHash != hash && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
		})
		f.editMachine("s1", func(m *v1alpha1.Machine) { m.Spec.Network = nil; m.Spec.KernelArgs = nil; m.Spec.Disks = nil })
		f.waitFor(t, "s1", "pending cleared", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return len(m.Status.Pending) == 0 && m.Status.PendingHash == "" && !condTrue(m, v1alpha1.MachineRebootPending) &&
				m.Status.Reboot.State == v1alpha1.RebootNone
		})
	})

	t.Run("Events name each applied and staged change", func(t *testing.T) {
		var reasons map[string]bool
		waitCount(t, "Events recorded", func() bool {
			evs, err := f.admin.CoreV1().Events(authority.EventNamespace).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=s1"})
			if err != nil {
				return false
			}
			reasons = map[string]bool{}
			for _, e := range evs.Items {
				reasons[e.Reason+": "+e.Message] = true
			}
			return reasons["Applied: machine.spec.nodeLabels applied live"] &&
				reasons["Staged: machine.spec.network staged; it needs a reboot of its own"] &&
				reasons["Staged: machine.spec.kernelArgs staged for the next boot"] &&
				reasons["RestartedK3s: k3s restarted in place to apply its new configuration; pods kept running"] &&
				reasons["Applied: cluster.spec.features.traefik applied by restarting k3s in place where its files changed"]
		})
	})

	t.Run("a restarted agent re-applies nothing", func(t *testing.T) {
		f.editMachine("s1", func(m *v1alpha1.Machine) { m.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": "10"} })
		// Ready too: a status the stopped agent had still to write (k3s healthy again after
		// a restart, say) would be the restarted agent's to write.
		f.waitFor(t, "s1", "swappiness applied, Ready", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return condTrue(m, v1alpha1.MachineConfigApplied) && condTrue(m, v1alpha1.MachineReady)
		})
		waitCount(t, "swappiness written", func() bool { v, _ := s1.sysctl.Read("vm.swappiness"); return v == "10" })
		p := filepath.Join(s1.sysctl.Root, "vm", "swappiness")
		st1, _ := os.Stat(p)
		cfgPath := s1.paths.Config
		cst1, _ := os.Stat(cfgPath)
		restarts := s1.restarts()
		s1.stop()
		time.Sleep(20 * time.Millisecond)
		s1.start(t)
		// By the end of its first pass it has compared everything, and written what it would
		// write again: a sysctl, k3s's files (a restart only ever follows new files), status.
		s1.reconciled(t, "the Machine and the Cluster", nil)
		st2, _ := os.Stat(p)
		cst2, _ := os.Stat(cfgPath)
		if !st2.ModTime().Equal(st1.ModTime()) {
			t.Errorf("the restarted agent wrote the sysctl again")
		}
		if !cst2.ModTime().Equal(cst1.ModTime()) {
			t.Errorf("the restarted agent rewrote k3s's config")
		}
		if got := s1.restarts(); got != restarts {
			t.Errorf("the restarted agent restarted k3s (%d → %d)", restarts, got)
		}
		if w := testutilCounter(s1.metrics); w != 0 {
			t.Errorf("the restarted agent wrote status %v times with nothing changed", w)
		}
	})
}

func waitCount(t *testing.T, what string, ok func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return ok(), nil }); err != nil {
		t.Fatalf("%s never happened", what)
	}
}

// waitMachineCount is waitCount that, on failure, says what the Machine's status says.
func waitMachineCount(t *testing.T, f *fixture, name, what string, ok func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return ok(), nil }); err != nil {
		m, err := f.liken.Machine(context.Background(), name)
		if err != nil {
			t.Fatalf("%s never happened (and reading Machine %s: %v)", what, name, err)
		}
		spec, _ := json.Marshal(m.Spec.Reboot)
		t.Fatalf("%s never happened: Machine %s has reboot %s (%s), upgrade %s (%s), pending %s; spec.reboot %s",
			what, name, m.Status.Reboot.State, m.Status.Reboot.Message, m.Status.Upgrade.State, m.Status.Upgrade.Message, m.Status.PendingHash, spec)
	}
}

func hasTaint(n *corev1.Node, key, value string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key && t.Value == value {
			return true
		}
	}
	return false
}

// TestAgentSurvivesAPIOutage: an agent started while the API server is away holds the machine
// to its persisted state, restarts nothing, and catches up when the API returns.
func TestAgentSurvivesAPIOutage(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"o1": v1alpha1.RoleAgent})
	o1 := newSim(t, "o1", v1alpha1.RoleAgent)
	o1.boot(t, f)
	o1.start(t)
	f.editMachine("o1", func(m *v1alpha1.Machine) { m.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": "10"} })
	f.waitFor(t, "o1", "swappiness applied", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		v, _ := o1.sysctl.Read("vm.swappiness")
		return v == "10" && condTrue(m, v1alpha1.MachineConfigApplied)
	})
	o1.stop()
	// As after a reboot: the kernel is back at its default.
	if err := o1.sysctl.Write("vm.swappiness", "60"); err != nil {
		t.Fatal(err)
	}
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarts := o1.restarts()
	o1.start(t)
	waitCount(t, "persisted sysctl re-applied with the API down", func() bool { v, _ := o1.sysctl.Read("vm.swappiness"); return v == "10" })
	// The agent has met the outage and carries on: each of its three watches asked the API
	// server and failed, and it has asked again since.
	waitCount(t, "the agent's first requests to the API server, which is away", func() bool { return o1.apiRequests() >= 3 })
	failed := o1.apiRequests()
	waitCount(t, "the agent asking the API server again after its requests failed", func() bool { return o1.apiRequests() > failed })
	select {
	case <-o1.done:
		t.Fatal("the agent stopped while the API was down")
	default:
	}
	if o1.restarts() != restarts {
		t.Errorf("k3s restarted while the API was down")
	}
	if err := env.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.editMachine("o1", func(m *v1alpha1.Machine) { m.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": "20"} })
	f.waitFor(t, "o1", "an edit after the outage applied", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		v, _ := o1.sysctl.Read("vm.swappiness")
		return v == "20" && condTrue(m, v1alpha1.MachineConfigApplied)
	})
	o1.stop()
}
