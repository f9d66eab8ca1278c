package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/kubectl/pkg/drain"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/kube"
)

// Recorder records Events about Machines (the agent's event.Recorder).
type Recorder interface {
	Event(obj runtime.Object, typ, reason, message string)
}

// Config is what a coordinator needs.
type Config struct {
	// Machine is the machine whose agent runs this coordinator: its identity in the
	// election, and the machine that goes last.
	Machine string
	// REST is the machine's own client config; a server's user is bound to the
	// coordinator's roles (authority.ServerRBAC).
	REST *rest.Config
	// Events records Events about Machines; nil records none.
	Events Recorder
	Log    *slog.Logger
	Now    func() time.Time
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election (zero: 60 s, 40 s,
	// 10 s). Not client-go's usual 15, 10 and 2 s: reboot coordination needs no fast
	// failover (a leader that stops cleanly gives the Lease up at once, and a server
	// comes back as the same holder), while each renewal is an API request and an etcd
	// write on every server: at 2 s the Lease took 30 of an idle lab's 158 requests a
	// minute, under emulation (December 2026).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Resync is how often the leader plans again with no change seen, for retry times
	// that come due (zero: 5 s). It reads only its caches then.
	Resync time.Duration
	// EvictRetry is the wait between evictions a PodDisruptionBudget refused (zero: 5 s).
	EvictRetry time.Duration
	// Metrics records what the coordinator does; nil: metrics of its own, unregistered.
	Metrics *Metrics
	// BlockedRetry is the wait after the first blocked drain before the machine may take
	// a turn again; it doubles with each blocked drain for the same pending set, up to an
	// hour (zero: 1 minute).
	BlockedRetry time.Duration
}

// Coordinator grants disruption-budget turns and drains the machines that hold one.
type Coordinator struct {
	cfg   Config
	liken *kube.Client
	kube  kubernetes.Interface
	log   *slog.Logger

	machines, clusters, nodes cache.Store
	// secrets keeps the machines' registry Secrets Role, from a watch of its own.
	secrets *authority.SecretsRoleKeeper
	poke    chan struct{}

	leadMu sync.Mutex
	mu     sync.Mutex
	drains map[string]*drainRun // machine → its drain under way
	// finished are the turns whose drain this leader ended: a cache that has not seen the
	// outcome yet must not start the drain again (it would cordon a Node given back).
	finished map[turnKey]bool
}

type drainRun struct {
	key    turnKey
	cancel context.CancelFunc
	done   chan struct{}
}

// turnKey names one turn: a machine's next turn has another since or pending set.
type turnKey struct{ machine, hash, since string }

func keyOf(t v1alpha1.Turn) turnKey {
	return turnKey{t.Machine, t.PendingHash, t.Since.UTC().Format(time.RFC3339)}
}

// New makes a coordinator; Run starts it.
func New(cfg Config) (*Coordinator, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.LeaseDuration, 60 * time.Second}, {&cfg.RenewDeadline, 40 * time.Second}, {&cfg.RetryPeriod, 10 * time.Second},
		{&cfg.Resync, 5 * time.Second}, {&cfg.EvictRetry, 5 * time.Second}, {&cfg.BlockedRetry, time.Minute}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	lc, err := kube.NewClient(cfg.REST)
	if err != nil {
		return nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("coordinator: making the Kubernetes client: %w", err)
	}
	return &Coordinator{cfg: cfg, liken: lc, kube: kc, log: cfg.Log.With("coordinator", cfg.Machine),
		poke: make(chan struct{}, 1), drains: map[string]*drainRun{}, finished: map[turnKey]bool{}}, nil
}

// Run campaigns for the Lease and coordinates while it holds it, until ctx ends; then it
// gives the Lease up at once, so another server takes over without waiting for it to
// expire (as when this machine goes down for its own reboot).
func (c *Coordinator) Run(ctx context.Context) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: v1alpha1.SecretNamespace, Name: authority.LeaseName},
		Client:     c.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Machine},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: "liken-coordinator", ReleaseOnCancel: true,
			LeaseDuration: c.cfg.LeaseDuration, RenewDeadline: c.cfg.RenewDeadline, RetryPeriod: c.cfg.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					c.log.Info("leading reboot coordination")
					c.lead(ctx)
				},
				OnStoppedLeading: func() { c.log.Info("no longer leading reboot coordination") },
				OnNewLeader: func(id string) {
					if id != c.cfg.Machine {
						c.log.Info("reboot coordination is led by another server", "leader", id)
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("coordinator: %w", err)
		}
		le.Run(ctx) // returns when leadership is lost; campaign again
	}
	// client-go may return before the last term's callback has: wait until its drains
	// have stopped, so nothing of it outlives Run.
	c.leadMu.Lock()
	c.leadMu.Unlock() //nolint:staticcheck // an empty critical section: waiting is the point
	return nil
}

// lead watches the fleet and plans on every change and every Resync, until ctx ends
// (leadership lost): then every drain under way stops.
func (c *Coordinator) lead(ctx context.Context) {
	// client-go may campaign again before the last term's callback has returned: terms
	// never overlap.
	c.leadMu.Lock()
	defer c.leadMu.Unlock()
	defer c.stopDrains()
	c.cfg.Metrics.Leader.Set(1)
	defer c.cfg.Metrics.Leader.Set(0)
	trigger := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.kick() },
		UpdateFunc: func(any, any) { c.kick() },
		DeleteFunc: func(any) { c.kick() },
	}
	var synced []cache.InformerSynced
	for _, w := range []struct {
		store *cache.Store
		lw    cache.ListerWatcher
		obj   runtime.Object
	}{
		{&c.machines, c.liken.MachinesListWatch(), &v1alpha1.Machine{}},
		{&c.clusters, c.liken.ClusterListWatch(), &v1alpha1.Cluster{}},
		{&c.nodes, cache.NewListWatchFromClient(c.kube.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fields.Everything()), &corev1.Node{}},
	} {
		store, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: w.lw, ObjectType: w.obj, Handler: trigger})
		*w.store = store
		go ctrl.RunWithContext(ctx)
		synced = append(synced, ctrl.HasSynced)
	}
	// Not waited for: a server with RBAC from an older layer may not watch the Role, and
	// the keeper reads it instead.
	c.secrets = authority.NewSecretsRoleKeeper(c.kube, c.log, c.kick)
	go c.secrets.Run(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	for {
		if err := c.step(ctx); err != nil && ctx.Err() == nil {
			// A conflict is another writer (a drain recording its outcome, another leader
			// for a moment): plan again at once from a fresh read. Anything else waits a
			// second.
			wait := 20 * time.Millisecond
			if apierrors.IsConflict(err) {
				c.log.Debug("the Cluster changed while planning; planning again", "err", err)
			} else {
				c.log.Error("coordinating", "err", err)
				wait = time.Second
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			c.kick()
		}
		select {
		case <-ctx.Done():
			return
		case <-c.poke:
		case <-tick.C:
		}
	}
}

func (c *Coordinator) kick() {
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// newFleet is an empty fleet planned by this coordinator now, with cl as the Cluster.
func (c *Coordinator) newFleet(cl *v1alpha1.Cluster) Fleet {
	return Fleet{Cluster: cl, Nodes: map[string]*corev1.Node{}, Self: c.cfg.Machine, Now: c.cfg.Now()}
}

// fleet reads the fleet from the caches, with cl as the Cluster.
func (c *Coordinator) fleet(cl *v1alpha1.Cluster) Fleet {
	f := c.newFleet(cl)
	for _, o := range c.machines.List() {
		f.Machines = append(f.Machines, *o.(*v1alpha1.Machine))
	}
	for _, o := range c.nodes.List() {
		n := o.(*corev1.Node)
		f.Nodes[n.Name] = n
	}
	return f
}

// liveFleet reads the fleet from the API server (consistent reads), with cl as the Cluster.
func (c *Coordinator) liveFleet(ctx context.Context, cl *v1alpha1.Cluster) (Fleet, error) {
	f := c.newFleet(cl)
	ms, err := c.liken.Machines(ctx)
	if err != nil {
		return f, fmt.Errorf("reading the Machines: %w", err)
	}
	f.Machines = ms
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return f, fmt.Errorf("reading the Nodes: %w", err)
	}
	for i := range nodes.Items {
		f.Nodes[nodes.Items[i].Name] = &nodes.Items[i]
	}
	return f, nil
}

// step plans from the caches and, when the plan changes anything, plans again from a
// fresh read of the Cluster (and, when it grants a turn, of the Machines and Nodes) before
// acting, so nothing is uncordoned or granted on a stale view; the
// write is conditional on that read's resourceVersion, so a plan made from an outdated
// Cluster (another coordinator wrote since) is refused and made again.
func (c *Coordinator) step(ctx context.Context) error {
	o, ok, _ := c.clusters.GetByKey(v1alpha1.ClusterName)
	if !ok {
		return c.releaseOrphanCordons(ctx)
	}
	// Machines may read the registry Secrets the Cluster names, and no other. Asked on every
	// plan, the keeper answers from its watch.
	if changed, err := c.secrets.Sync(ctx, o.(*v1alpha1.Cluster).Spec.Registries.SecretNames()); err != nil {
		c.log.Warn("keeping the machines' registry Secret access in step with the Cluster", "err", err)
	} else if changed {
		c.log.Info("machines may read the registry Secrets the Cluster names", "secrets", o.(*v1alpha1.Cluster).Spec.Registries.SecretNames())
	}
	cached := o.(*v1alpha1.Cluster)
	f := c.fleet(cached)
	// Where the machines back from their reboot are in their gates: read from the API (and
	// a gate's Job made) before planning, so the plan itself stays a function of its input.
	gates, err := gateChecker{kc: c.kube, now: f.Now}.Gates(ctx, f)
	if err != nil {
		return err
	}
	f.Gates = gates
	p, err := MakePlan(f)
	if err != nil {
		return err
	}
	c.gauge(p.Status)
	if equality.Semantic.DeepEqual(p.Status, cached.Status) && len(p.Uncordon) == 0 {
		c.startDrains(ctx, cached, false)
		return nil
	}
	cl, err := c.liken.Cluster(ctx)
	if err != nil {
		return fmt.Errorf("reading the Cluster: %w", err)
	}
	f = c.fleet(cl)
	f.Gates = gates
	if p, err = MakePlan(f); err != nil {
		return err
	}
	if len(p.Granted) > 0 {
		// A grant is judged on the API's own state, not on the caches: a Node that went
		// down a moment ago for another reason counts against the budget, however far
		// behind the Node watch is on a busy server.
		f, err := c.liveFleet(ctx, cl)
		if err != nil {
			return err
		}
		f.Gates = gates
		if p, err = MakePlan(f); err != nil {
			return err
		}
	}
	for m := range p.Released {
		c.stopDrain(m)
	}
	for _, n := range p.Uncordon {
		if err := c.cordon(ctx, n, false); err != nil {
			return err
		}
	}
	// The gates' verdicts this write records: those of the turns the fresh read holds (a
	// check made from a cache behind it may be of a turn given back already).
	gatesBefore := map[string]v1alpha1.GatePhase{}
	for _, t := range cl.Status.Turns {
		gatesBefore[GateKey(t)] = v1alpha1.GateChecking
		if t.Gates != nil {
			gatesBefore[GateKey(t)] = t.Gates.Phase
		}
	}
	was := meta.FindStatusCondition(cl.Status.Conditions, v1alpha1.ClusterRolloutPaused)
	wasPaused, wasHalted := was != nil && was.Status == metav1.ConditionTrue, was != nil && was.Reason == v1alpha1.ReasonHalted
	if !equality.Semantic.DeepEqual(p.Status, cl.Status) {
		next := cl.DeepCopy()
		next.Status = p.Status
		if cl, err = c.liken.UpdateClusterStatus(ctx, next); err != nil {
			return fmt.Errorf("writing the Cluster's status: %w", err)
		}
	}
	c.gauge(p.Status)
	if paused := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ClusterRolloutPaused); paused != nil && c.cfg.Events != nil {
		switch {
		case paused.Reason == v1alpha1.ReasonHalted && !wasHalted:
			c.log.Warn("rollout halted", "why", paused.Message)
			c.cfg.Metrics.Halts.Inc()
			c.cfg.Events.Event(cl, corev1.EventTypeWarning, "RolloutHalted", paused.Message)
		case paused.Status == metav1.ConditionTrue && !wasPaused:
			c.log.Info("rollout paused", "why", paused.Message)
			c.cfg.Events.Event(cl, corev1.EventTypeNormal, "RolloutPaused", paused.Message)
		case paused.Status == metav1.ConditionFalse && wasPaused:
			c.log.Info("rollout resumed")
			c.cfg.Events.Event(cl, corev1.EventTypeNormal, "RolloutResumed", "the rollout goes on: new reboot turns are given as the budget allows")
		}
	}
	for key, g := range gates {
		before, ok := gatesBefore[key]
		if !ok || before == g.Phase {
			continue
		}
		m, _, _ := strings.Cut(key, "@")
		switch g.Phase {
		case v1alpha1.GatePassed:
			c.log.Info("gates passed", "machine", m)
			c.event(m, corev1.EventTypeNormal, "GatesPassed", "back from its reboot, the machine passed its gates: "+g.Message)
		case v1alpha1.GateFailed:
			c.log.Warn("gates failed", "machine", m, "gate", g.Gate, "why", g.Message)
			c.cfg.Metrics.GateFailures.Inc()
			c.event(m, corev1.EventTypeWarning, v1alpha1.ReasonGateFailed, "back from its reboot, the machine failed its gates: "+g.Message)
		}
	}
	c.cfg.Metrics.Released.Add(float64(len(p.Released)))
	c.cfg.Metrics.Granted.Add(float64(len(p.Granted)))
	for m, why := range p.Released {
		c.log.Info("turn taken back", "machine", m, "why", why)
		c.event(m, corev1.EventTypeNormal, "TurnReleased", "the disruption-budget turn was taken back: "+why)
	}
	for _, m := range p.Granted {
		c.log.Info("turn granted", "machine", m)
		if why := p.Despite[m]; why != "" {
			c.log.Info("turn granted despite servers down", "machine", m, "why", why)
			c.event(m, corev1.EventTypeWarning, "TurnGranted", "a disruption-budget turn was given "+why+"; the Node is cordoned and drained")
			continue
		}
		c.event(m, corev1.EventTypeNormal, "TurnGranted", "a disruption-budget turn was given; the Node is cordoned and drained")
	}
	c.startDrains(ctx, cl, true)
	return nil
}

func (c *Coordinator) gauge(st v1alpha1.ClusterStatus) {
	c.cfg.Metrics.Waiting.Set(float64(len(st.Waiting)))
	c.cfg.Metrics.Turns.Set(float64(len(st.Turns)))
	c.cfg.Metrics.DrainsBlocked.Set(float64(len(st.DrainBlocked)))
}

func (c *Coordinator) event(machine, typ, reason, msg string) {
	if c.cfg.Events == nil {
		return
	}
	m := &v1alpha1.Machine{}
	if o, ok, _ := c.machines.GetByKey(machine); ok {
		m = o.(*v1alpha1.Machine)
	} else {
		m.Name = machine
	}
	c.cfg.Events.Event(m, typ, reason, msg)
}

// TurnCordon marks a Node liken cordoned for a turn (its value: the machine). The turns live
// in the Cluster's status: when the Cluster is deleted mid-rollout, this mark is how any
// coordinator, a new leader included, finds the cordons that were liken's and lifts them.
const TurnCordon = "liken.dev/cordoned-for-turn"

// markCordon sets or removes the TurnCordon mark on a Node.
func (c *Coordinator) markCordon(ctx context.Context, node string, on bool) error {
	if o, ok, _ := c.nodes.GetByKey(node); ok && on {
		// Set already. Not trusted for a removal: the cache may not show a mark just set.
		if _, has := o.(*corev1.Node).Annotations[TurnCordon]; has {
			return nil
		}
	}
	value := "null"
	if on {
		value = strconv.Quote(node)
	}
	patch := []byte(`{"metadata":{"annotations":{"` + TurnCordon + `":` + value + `}}}`)
	_, err := c.kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("marking Node %s as cordoned for a turn: %w", node, err)
	}
	return nil
}

// releaseOrphanCordons runs while there is no Cluster (deleted mid-rollout): the turns went
// with its status, and no machine will reboot without one, so every Node liken cordoned for
// a turn is uncordoned and its drain stopped, rather than left cordoned for ever.
func (c *Coordinator) releaseOrphanCordons(ctx context.Context) error {
	confirmed := false
	for _, o := range c.nodes.List() {
		n := o.(*corev1.Node)
		if _, ok := n.Annotations[TurnCordon]; !ok {
			continue
		}
		if !confirmed {
			// The cache is no proof of a deletion that lifts cordons: the API server is.
			if _, err := c.liken.Cluster(ctx); !apierrors.IsNotFound(err) {
				return err // nil: it is there after all, and the next plan sees it
			}
			confirmed = true
		}
		c.stopDrain(n.Name)
		if err := c.cordon(ctx, n.Name, false); err != nil {
			return err
		}
		c.log.Info("the Cluster is gone: the Node liken cordoned for a turn is uncordoned", "node", n.Name)
	}
	return nil
}

// cordon cordons or uncordons a Node through kubectl's cordon helper.
func (c *Coordinator) cordon(ctx context.Context, node string, on bool) error {
	// The cached Node will do when it differs from what is wanted: the cordon helper's patch
	// then sets spec.unschedulable alone, whatever else is stale. When the cache says it is
	// as wanted already, the cache may be behind (this coordinator's own uncordon of a
	// moment ago, not seen yet): read it.
	var n *corev1.Node
	if o, ok, _ := c.nodes.GetByKey(node); ok && o.(*corev1.Node).Spec.Unschedulable != on {
		n = o.(*corev1.Node).DeepCopy()
	} else {
		got, err := c.kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading Node %s: %w", node, err)
		}
		n = got
	}
	what := map[bool]string{true: "cordoning", false: "uncordoning"}[on]
	err := drain.RunCordonOrUncordon(&drain.Helper{Ctx: ctx, Client: c.kube}, n, on)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, node, err)
	}
	if !on {
		// Every uncordon of liken's ends a turn's cordon: the mark goes with it.
		return c.markCordon(ctx, node, false)
	}
	return nil
}

// startDrains starts a drain for every turn being drained that has none under way. fresh
// says cl was just read from the API server or written to it, not taken from the cache:
// its turns need no second read before a cordon.
func (c *Coordinator) startDrains(ctx context.Context, cl *v1alpha1.Cluster, fresh bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	current := map[turnKey]bool{}
	for _, t := range cl.Status.Turns {
		current[keyOf(t)] = true
	}
	for k := range c.finished {
		if !current[k] {
			delete(c.finished, k)
		}
	}
	for _, t := range cl.Status.Turns {
		if t.Phase != v1alpha1.TurnDraining || c.drains[t.Machine] != nil || c.finished[keyOf(t)] {
			continue
		}
		dctx, cancel := context.WithCancel(ctx)
		d := &drainRun{key: keyOf(t), cancel: cancel, done: make(chan struct{})}
		c.drains[t.Machine] = d
		go func() { defer close(d.done); c.drain(dctx, t, cl.Spec.Drain, fresh) }()
	}
}

// stopDrain stops the machine's drain and waits until it has stopped, so no cordon of
// it lands after the uncordon that follows.
func (c *Coordinator) stopDrain(machine string) {
	c.mu.Lock()
	d := c.drains[machine]
	if d != nil {
		d.cancel()
		delete(c.drains, machine)
	}
	c.mu.Unlock()
	if d != nil {
		<-d.done
	}
}

// stopDrains stops every drain and waits for them: a leader's drains end with its term.
func (c *Coordinator) stopDrains() {
	c.mu.Lock()
	var all []*drainRun
	for m, d := range c.drains {
		d.cancel()
		delete(c.drains, m)
		all = append(all, d)
	}
	c.mu.Unlock()
	for _, d := range all {
		<-d.done
	}
}

// drain empties one machine's Node for its turn; the deadline counts from when the turn
// was given, so a new leader resumes with the time left. Then it records the outcome in
// the turn: drained, or blocked (the turn given back, the Node uncordoned unless an
// operator had cordoned it, and the machine held back for a growing while).
func (c *Coordinator) drain(ctx context.Context, t v1alpha1.Turn, policy v1alpha1.DrainPolicy, fresh bool) {
	recorded := false
	defer func() {
		c.mu.Lock()
		if d := c.drains[t.Machine]; d != nil && d.key == keyOf(t) {
			d.cancel()
			delete(c.drains, t.Machine)
		}
		if recorded {
			c.finished[keyOf(t)] = true
		}
		c.mu.Unlock()
		c.kick()
	}()
	log := c.log.With("machine", t.Machine)
	// The caches may lag: cordon only for a turn the API still holds (a fresh read or
	// write of the Cluster said so a moment ago).
	if !fresh {
		cl, err := c.liken.Cluster(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("reading the Cluster before draining; trying again", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(c.cfg.EvictRetry):
				}
			}
			return
		}
		if !hasTurn(cl, t) {
			recorded = true
			return
		}
	}
	deadline := t.Since.Add(drainTimeout(policy))
	// A server's etcd snapshot first (snapshot.go), within the drain's timeout.
	blocked, err := c.awaitSnapshot(ctx, t, deadline, min(c.cfg.EvictRetry, time.Second), log)
	if err != nil {
		return
	}
	start := c.cfg.Now()
	var out drainOutcome
	var workloads []v1alpha1.TurnWorkload
	if blocked != "" {
		out.message = blocked
	} else {
		log.Info("draining", "deadline", deadline)
		// The cordon is not bounded by the deadline: a drain resumed after it (a new
		// leader) still cordons, then goes straight to the outcome.
		err = c.cordon(ctx, t.Machine, true)
		if err == nil && !t.CordonedBefore {
			err = c.markCordon(ctx, t.Machine, true)
		}
		if err == nil {
			// What runs here now, and how available it is, is what the gates wait for
			// after the reboot. Read before the evictions (a resumed drain reads what is
			// left).
			if workloads, err = workloadsOn(ctx, c.kube, t.Machine); err == nil && len(workloads) > maxTurnWorkloads {
				log.Warn("more workloads on the machine than a turn records; the gates wait for the first ones", "workloads", len(workloads), "recorded", maxTurnWorkloads)
				workloads = workloads[:maxTurnWorkloads]
			}
		}
		if err == nil {
			out, err = drainNode(ctx, c.kube, t.Machine, policy, deadline, c.cfg.EvictRetry, func(s string) {
				// Each try, refusals included, at debug; liken's own hold on a budget whose
				// status lags is said once per pod and reason, where an operator reads the
				// log.
				if strings.HasPrefix(s, notEvictingYet) {
					log.Info(s)
					return
				}
				log.Debug(s)
			})
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			log.Error("draining; trying again", "err", err)
			select { // not at once: the next plan starts the drain again
			case <-ctx.Done():
			case <-time.After(c.cfg.EvictRetry):
			}
		}
		return
	}
	// The first try may start from the cache only when the change has no side effect (the
	// blocked path uncordons before its write).
	gone, err := c.updateTurn(ctx, t, out.drained, func(st *v1alpha1.ClusterStatus, i int) error {
		if out.drained {
			st.Turns[i].Phase = v1alpha1.TurnDrained
			st.Turns[i].Workloads = workloads
			return nil
		}
		if !st.Turns[i].CordonedBefore {
			if err := c.cordon(ctx, t.Machine, false); err != nil {
				return err
			}
		}
		st.Turns = append(st.Turns[:i], st.Turns[i+1:]...)
		b := v1alpha1.DrainBlock{Machine: t.Machine, PendingHash: t.PendingHash, Attempts: 1,
			Since: metav1.NewTime(c.cfg.Now().UTC().Truncate(time.Second)), BlockingPods: out.blocking, Message: out.message}
		for j, old := range st.DrainBlocked {
			if old.Machine == t.Machine {
				if old.PendingHash == t.PendingHash {
					b.Attempts = old.Attempts + 1
				}
				st.DrainBlocked = append(st.DrainBlocked[:j], st.DrainBlocked[j+1:]...)
				break
			}
		}
		wait := c.cfg.BlockedRetry << min(b.Attempts-1, 20)
		b.RetryAt = metav1.NewTime(b.Since.Add(min(wait, time.Hour)))
		b.Message += fmt.Sprintf("; the Node was uncordoned and the turn given back; the machine tries again at %s", b.RetryAt.UTC().Format(time.RFC3339))
		st.DrainBlocked = append(st.DrainBlocked, b)
		return nil
	})
	recorded = err == nil
	switch {
	case err == nil && gone:
		// Taken back while draining: the release may have uncordoned before this drain's
		// cordon landed. Not when the machine holds another turn already (another leader,
		// for a moment, gave it one): that turn's drain cordoned it.
		if !t.CordonedBefore && !c.holdsAnyTurn(ctx, t.Machine) {
			if err := c.cordon(ctx, t.Machine, false); err != nil {
				log.Error("uncordoning after the turn was taken back", "err", err)
			}
		}
	case err != nil:
		if ctx.Err() == nil {
			log.Error("recording the drain", "err", err)
		}
	case out.drained:
		c.cfg.Metrics.DrainSeconds.Observe(c.cfg.Now().Sub(start).Seconds())
		log.Info("drained", "took", c.cfg.Now().Sub(start).Round(time.Millisecond), "forced", out.forced)
		msg := "the Node is drained; the machine reboots"
		if len(out.forced) > 0 {
			msg += fmt.Sprintf("; drain.force deleted %v past their PodDisruptionBudgets at the timeout", out.forced)
		}
		c.event(t.Machine, corev1.EventTypeNormal, "Drained", msg)
	default:
		c.cfg.Metrics.Blocked.Inc()
		log.Warn("drain blocked", "pods", out.blocking)
		c.event(t.Machine, corev1.EventTypeWarning, "DrainBlocked", out.message)
	}
}

// maxTurnWorkloads is how many workloads a turn records (the CRD's limit).
const maxTurnWorkloads = 64

// updateTurn changes the turn t in a fresh read of the Cluster and writes it, as long as
// the turn is still there as given (same machine, pending set and phase); on a conflict
// it reads and tries again.
func (c *Coordinator) updateTurn(ctx context.Context, t v1alpha1.Turn, fromCache bool, change func(st *v1alpha1.ClusterStatus, i int) error) (gone bool, err error) {
	// With fromCache, the first try starts from the cache, which is usually current: the
	// write is conditional on its resourceVersion, so a stale one costs a conflict and a
	// read, and a turn the cache no longer shows is read again before it counts as gone.
	var cl *v1alpha1.Cluster
	if o, ok, _ := c.clusters.GetByKey(v1alpha1.ClusterName); fromCache && ok && hasTurn(o.(*v1alpha1.Cluster), t) {
		cl = o.(*v1alpha1.Cluster)
	}
	for {
		if cl == nil {
			if cl, err = c.liken.Cluster(ctx); err != nil {
				return false, fmt.Errorf("reading the Cluster: %w", err)
			}
		}
		i := turnIndex(cl, t)
		if i < 0 {
			return true, nil // taken back meanwhile
		}
		next := cl.DeepCopy()
		if err := change(&next.Status, i); err != nil {
			return false, err
		}
		_, err = c.liken.UpdateClusterStatus(ctx, next)
		if !apierrors.IsConflict(err) {
			if err != nil {
				return false, fmt.Errorf("writing the Cluster's status: %w", err)
			}
			return false, nil
		}
		cl = nil
	}
}

// turnIndex is where the turn t is, as given (machine, pending set, phase, since), in the
// Cluster's status, or -1.
func turnIndex(cl *v1alpha1.Cluster, t v1alpha1.Turn) int {
	for j, cur := range cl.Status.Turns {
		if cur.Machine == t.Machine && cur.PendingHash == t.PendingHash && cur.Phase == t.Phase && cur.Since.Equal(&t.Since) && cur.ReleasedBy == "" {
			return j
		}
	}
	return -1
}

func hasTurn(cl *v1alpha1.Cluster, t v1alpha1.Turn) bool { return turnIndex(cl, t) >= 0 }

// holdsAnyTurn reads the Cluster afresh: does machine hold a turn (true too when the
// read fails, so nothing is uncordoned on a guess)?
func (c *Coordinator) holdsAnyTurn(ctx context.Context, machine string) bool {
	cl, err := c.liken.Cluster(ctx)
	if err != nil {
		return true
	}
	for _, t := range cl.Status.Turns {
		if t.Machine == machine {
			return true
		}
	}
	return false
}
