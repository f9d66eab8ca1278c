// Package agent is the machine agent: it watches its own Machine, the Cluster and its own
// Node, and makes the machine match them with the least disruption each change needs. Every
// difference is classified through the class table (internal/change): Live changes are
// applied at once (sysctls, node labels and taints, policy), RestartK3s changes re-render
// k3s's files and restart k3s in place only when the bytes on this machine change, NextBoot
// and Reboot changes are staged in status.pending. A new release is written into the
// inactive slot (upgrade.go); an approved reboot or an operator's request reboots through
// init, trying the new slot or kernel arguments once, and the boot after says how it went.
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/coordinator"
	"liken.dev/liken/internal/event"
	"liken.dev/liken/internal/host/clock"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/host/sysctl"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

// Restarter restarts k3s in place. On a machine it is init's supervisor, reached over its
// local socket; it signals the k3s process only, so containers keep running.
type Restarter interface {
	RestartK3s(ctx context.Context) error
}

// Config is what an agent needs.
type Config struct {
	// Machine is this machine's name (its Machine and Node).
	Machine string
	// REST is the machine's own client config (user liken:machine:<name>).
	REST *rest.Config
	// State is where the agent remembers what it applied.
	State state.Store
	// Sysctl is /proc/sys (or a test's stand-in tree).
	Sysctl sysctl.Host
	// K3sRoot prefixes k3s's file paths ("/" on a machine); K3sPaths are those paths.
	K3sRoot  k3s.Root
	K3sPaths k3s.Paths
	// SwapOn says whether swap is active here (nil: k3s.SwapOn reads /proc/swaps).
	SwapOn func() bool
	// Join is the server URL agents and joining servers render; empty for the first server.
	Join string
	// Restarter restarts k3s.
	Restarter Restarter
	// Boot is init's control of the boot loader: what this boot is, the slots, trials and
	// reboots. Nil where liken's init did not boot the machine: then releases, trials and
	// reboots are not managed.
	Boot Boot
	// SlotDevice says where each slot's bytes are; Fetcher downloads releases (nil: defaults).
	SlotDevice SlotDevice
	Fetcher    *release.Fetcher
	// K3sHealthz is k3s's health check (the kubelet's, http://127.0.0.1:10248/healthz on a
	// machine); a trial commits only while it answers 200. Empty: not checked.
	K3sHealthz string
	// RestartDelay is how long rendered k3s files must stay unchanged before k3s is
	// restarted, so a burst of edits ends in one restart.
	RestartDelay time.Duration
	// Hardware is reported in status (read once at start by the caller), when Inventory is
	// not set.
	Hardware *v1alpha1.Hardware
	// Inventory, when set, reads the hardware and the network links again every
	// InventoryEvery (zero: 30 s), so status.hardware and status.network follow what
	// changes (a link that goes down, a file system that fills); it replaces Hardware.
	Inventory      func() (*v1alpha1.Hardware, *v1alpha1.NetworkStatus)
	InventoryEvery time.Duration
	// Log is the structured logger; nil means slog.Default().
	Log *slog.Logger
	// Metrics records what the agent does; nil means a private registry.
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Coordinator, on a server machine, runs reboot coordination (internal/coordinator)
	// beside the agent: the fields the agent knows (machine, client, Events, log, clock)
	// are filled in. Nil on agent machines.
	Coordinator *coordinator.Config
	// Clock keeps the machine's clock with the Cluster's time servers and those DHCP named
	// (DHCPTimeServers), every ClockEvery (zero: 15 minutes); nil leaves the clock alone, as
	// where the agent does not own the host's clock. Init sets it at boot.
	Clock           *clock.Clock
	ClockEvery      time.Duration
	DHCPTimeServers func() []string
	// LastWords bounds how long the agent waits for what it says before going down (its
	// status and Events, before a reboot or when stopped) to reach the API server; what has
	// not by then is kept and said after the next start. Zero means 15 seconds.
	LastWords time.Duration
	// PeerWait bounds how long a server's trial of new network settings, healthy by its
	// own account, waits for another machine to reach it before the agent ends the trial
	// (the machine falling back) rather than waiting out init's deadline. Zero: three times
	// the peers' Node Lease duration (two minutes with the kubelet's 40 seconds).
	PeerWait time.Duration
	// Snapshot takes the etcd snapshot a server running an etcd member takes for its turn,
	// before its drain (snapshot.go); nil: `k3s etcd-snapshot save --name liken` through
	// /usr/bin/k3s, the file read from k3s's snapshot directory under K3sPaths.DataDir.
	Snapshot func(ctx context.Context) (k3s.Snapshot, error)
	// SnapshotRetry is how long a failed snapshot waits for the next try (zero: a minute).
	SnapshotRetry time.Duration
}

// Agent is a running machine agent.
type Agent struct {
	// trialWaiting is what this boot's trial waited for at the last pass ("" when nothing).
	trialWaiting string
	cfg          Config
	liken        *kube.Client
	kube         kubernetes.Interface
	events       *event.Recorder
	queue        workqueue.TypedRateLimitingInterface[string]
	log          *slog.Logger

	machines, clusters, nodes cache.Store

	synced atomic.Bool

	mu         sync.Mutex
	st         *state.State
	lastRender time.Time
	// bootInfo is what init says this boot is; attemptResolved once the last trial is settled.
	bootInfo        *supervisor.BootInfo
	bootInfoAt      time.Time // when bootInfo was asked for
	attemptResolved bool
	// job writes or checks the inactive slot; verified maps a slot to the digest it was
	// found to hold this boot.
	job            *slotJob
	verified       map[string]string
	jobRetryAt     time.Time
	jobRetryDigest string
	jobRetrySource channelSource
	// etcdRestore and etcdRejoin are this server's last restore of etcd from a snapshot and
	// last rejoin without its data, as init recorded them (read once: etcdRecordsRead).
	etcdRestore     *v1alpha1.EtcdRestoreStatus
	etcdRejoin      *v1alpha1.EtcdRejoinStatus
	etcdRecordsRead bool
	jobLastErr      string
	// jobRefused is the last slot job's refusal of a release it could not trust (not
	// signed by the channel, or bytes other than the pin's), reported in Degraded until a
	// job for that digest succeeds.
	jobRefused *releaseRefusal
	// peerLeases are the resourceVersions of the Node Leases a server's network trial waits
	// on, as first seen in this run (peersReach).
	peerLeases map[string]string
	// peerLeaseSeconds is the longest Lease duration among them; peerWaitSince is when this
	// run first found the trial healthy but for its peers (zero while it is not).
	peerLeaseSeconds int32
	peerWaitSince    time.Time
	// rebooting is set once init accepted a reboot: this agent's last moments.
	rebooting bool
	// lastFailureKey names the failures last reported, so each new set gets one Event.
	lastFailureKey string
	// clock is the clock's keeping (clock.go), shared with keepClock.
	clockMu sync.Mutex
	clock   clockKeeper
	// inventory is the last reading of Config.Inventory (inventory.go).
	invMu     sync.Mutex
	inventory inventory
	// snapshot is the last etcd snapshot taken for a turn, or tried (snapshot.go), and
	// when; kept until the status that names it is seen.
	snapshot      *v1alpha1.EtcdSnapshotStatus
	snapshotTried time.Time
}

const (
	keyReconcile = "reconcile"
	keyRestart   = "restart-k3s"
	keyJob       = "slot-job"
)

// New makes an agent. It loads the persisted state; nothing is applied before Run.
func New(cfg Config) (*Agent, error) {
	if cfg.Machine == "" {
		return nil, fmt.Errorf("agent: no machine name")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Inventory == nil && cfg.Hardware != nil {
		// A reading taken once stands for the inventory: one path for status.
		hw := cfg.Hardware
		cfg.Inventory = func() (*v1alpha1.Hardware, *v1alpha1.NetworkStatus) { return hw, nil }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	if cfg.LastWords == 0 {
		cfg.LastWords = 15 * time.Second
	}
	cfg.REST = rest.CopyConfig(cfg.REST)
	cfg.REST.Wrap(cfg.Metrics.countRequests)
	lc, err := kube.NewClient(cfg.REST)
	if err != nil {
		return nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("agent: making the Kubernetes client: %w", err)
	}
	st, err := cfg.State.Load()
	if err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:      cfg,
		liken:    lc,
		kube:     kc,
		log:      cfg.Log.With("machine", cfg.Machine),
		st:       st,
		verified: map[string]string{},
		events: event.New(event.Config{
			Events: kc.CoreV1().Events(authority.EventNamespace), Namespace: authority.EventNamespace,
			Scheme: kube.Scheme, Source: corev1.EventSource{Component: "liken-agent", Host: cfg.Machine},
			Log: cfg.Log.With("machine", cfg.Machine), Now: cfg.Now,
		}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "agent"}),
	}
	return a, nil
}

// Run watches and reconciles until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	defer a.queue.ShutDown()
	// The Event sender outlives ctx by the flush in stop, so what the agent said before it
	// was asked to stop still reaches the API server.
	sendCtx, stopSending := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSending()
	go a.events.Run(sendCtx)
	a.resendUnsent(sendCtx)

	if a.cfg.Coordinator != nil {
		cc := *a.cfg.Coordinator
		cc.Machine, cc.REST, cc.Events, cc.Log, cc.Now = a.cfg.Machine, a.cfg.REST, a.events, a.cfg.Log, a.cfg.Now
		if cc.Metrics == nil {
			cc.Metrics = coordinator.NewMetrics(a.cfg.Metrics.Registry)
		}
		co, err := coordinator.New(cc)
		if err != nil {
			return err
		}
		// It gives its Lease up when ctx ends, before the agent's last words.
		done := make(chan struct{})
		defer func() { <-done }()
		go func() { defer close(done); co.Run(ctx) }()
	}
	enqueue := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.queue.Add(keyReconcile) },
		UpdateFunc: func(any, any) { a.queue.Add(keyReconcile) },
		DeleteFunc: func(any) { a.queue.Add(keyReconcile) },
	}
	var synced []cache.InformerSynced
	for _, w := range []struct {
		store *cache.Store
		lw    cache.ListerWatcher
		obj   runtime.Object
	}{
		{&a.machines, a.liken.MachineListWatch(a.cfg.Machine), &v1alpha1.Machine{}},
		{&a.clusters, a.liken.ClusterListWatch(), &v1alpha1.Cluster{}},
		{&a.nodes, kube.NodeListWatch(a.kube.CoreV1().RESTClient(), a.cfg.Machine), &corev1.Node{}},
	} {
		store, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
			ListerWatcher: w.lw, ObjectType: w.obj, Handler: enqueue,
		})
		*w.store = store
		go ctrl.RunWithContext(ctx)
		synced = append(synced, ctrl.HasSynced)
	}
	// Before any API answer: hold the machine to what it last applied, so a machine whose
	// agent starts while the API is away keeps its settings.
	a.applyPersisted()
	if a.st.K3sRestartPending {
		// A previous run wrote new k3s files but died before k3s was restarted.
		a.queue.Add(keyRestart)
	}
	// Caches may not sync while the API is down; reconcile anyway from the persisted state
	// once they do, and keep retrying meanwhile.
	// Reconciling before every cache has synced would report a missing Node or Cluster
	// that is only not read yet.
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), synced...) {
			a.synced.Store(true)
			a.queue.Add(keyReconcile)
		}
	}()
	// The pass under way when the agent is asked to stop finishes (its status write too),
	// within LastWords: see stop.
	if a.cfg.Clock != nil {
		go a.keepClock(ctx)
	}
	if a.cfg.Inventory != nil {
		a.readInventory()
		go a.watchInventory(ctx)
	}
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	workerDone := make(chan struct{})
	go func() { defer close(workerDone); a.worker(workCtx) }()
	<-ctx.Done()
	a.stop(cancelWork, workerDone)
	return nil
}

// stop is the agent's goodbye when it is asked to end (init stops it before k3s at every
// shutdown, a power-off included): the pass under way finishes, so the status it writes
// reaches the API server, then the Events recorded are sent; both within LastWords in all.
// Events not sent by then are kept for the next start.
func (a *Agent) stop(cancelWork context.CancelFunc, workerDone <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.LastWords)
	defer cancel()
	a.queue.ShutDown() // no new pass starts
	select {
	case <-workerDone:
	case <-ctx.Done():
		a.log.Warn("the reconcile pass under way did not finish before the agent stopped", "within", a.cfg.LastWords)
	}
	cancelWork()
	<-workerDone
	unsent := a.events.Flush(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keepUnsent(unsent)
}

// keepUnsent records in the state file the Events that could not be sent before the agent
// goes down; the next start sends them (resendUnsent). Called with a.mu held.
func (a *Agent) keepUnsent(unsent []event.Event) {
	if len(unsent) == 0 && len(a.st.UnsentEvents) == 0 {
		return
	}
	if len(unsent) > 0 {
		reasons := make([]string, len(unsent))
		for i, e := range unsent {
			reasons[i] = e.Reason
		}
		a.log.Warn("the API server did not take these Events in time; they are kept and sent after the next start", "reasons", reasons)
	}
	a.st.UnsentEvents = unsent
	if err := a.cfg.State.Save(a.st); err != nil {
		a.log.Error("keeping unsent Events", "err", err)
	}
}

// resendUnsent queues the Events the last run could not send, ahead of anything new, and
// forgets them once they are sent. They keep their names, so one that did get through
// before is not sent twice.
func (a *Agent) resendUnsent(ctx context.Context) {
	a.mu.Lock()
	unsent := a.st.UnsentEvents
	a.mu.Unlock()
	if len(unsent) == 0 {
		return
	}
	a.log.Info("sending Events kept from before the last stop", "count", len(unsent))
	a.events.Resend(unsent, "said before the machine last went down; the API server could not be reached then")
	go func() {
		if a.events.Flush(ctx) != nil {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.st.UnsentEvents = nil
		if err := a.cfg.State.Save(a.st); err != nil {
			a.log.Error("forgetting the Events sent late", "err", err)
		}
	}()
}

// applyPersisted re-asserts the live host settings recorded in the state file.
func (a *Agent) applyPersisted() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.st.Applied == nil {
		return
	}
	out := &outcome{failures: map[string]string{}}
	a.applySysctls(*a.st.Applied, out)
	if len(out.failures) > 0 {
		a.log.Warn("re-applying persisted sysctls", "failures", failureKey(out.failures))
	}
}

func (a *Agent) worker(ctx context.Context) {
	for {
		key, quit := a.queue.Get()
		if quit {
			return
		}
		err := a.handle(ctx, key)
		switch {
		case apierrors.IsConflict(err):
			// The Machine changed while this pass wrote its status: the watch brings the
			// new one, and the next pass starts from it.
			a.log.Debug("status write raced a change; reconciling again", "key", key)
			a.queue.AddRateLimited(key)
		case err != nil:
			a.log.Error("reconcile failed; retrying", "key", key, "err", err)
			a.queue.AddRateLimited(key)
		default:
			a.queue.Forget(key)
		}
		a.queue.Done(key)
	}
}

func (a *Agent) handle(ctx context.Context, key string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch key {
	case keyRestart:
		return a.restartK3s(ctx)
	case keyJob:
		return a.finishJob(ctx)
	default:
		if !a.synced.Load() {
			return nil // the sync above enqueues a pass
		}
		start := a.cfg.Now()
		err := a.reconcile(ctx)
		a.cfg.Metrics.ReconcileSeconds.Observe(a.cfg.Now().Sub(start).Seconds())
		return err
	}
}
