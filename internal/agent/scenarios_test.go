package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
)

// The reboot scenarios of ../shared/research/ANCHORS.md that need the real agent beside
// the real coordinator (the coordinator's own are in internal/coordinator, with the
// machines' side played there): each named after its scenario.

// podOn makes a pod bound to node, owned by a controller, with a grace period: the k3s
// stand-in reports it Running and removes it once its grace period has passed after a
// deletion, as a kubelet does.
func (f *fixture) podOn(node, name string, grace int64) {
	f.t.Helper()
	ctx := f.t.Context()
	const ns = "default"
	// No controller manager runs here to make the namespace's default ServiceAccount.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
	if _, err := f.admin.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name + "-rs", UID: "00000000-0000-0000-0000-000000000001", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/app"}}},
	}
	if _, err := f.admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		zero := int64(0)
		_ = f.admin.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
}

func (f *fixture) podGone(name string) bool {
	_, err := f.admin.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// turnOf is the turn machine holds in the Cluster's status, or nil.
func (f *fixture) turnOf(machine string) *v1alpha1.Turn {
	c, err := f.liken.Cluster(context.Background())
	if err != nil {
		// Not "no turn": a check that no turn is held must not pass on a failed read.
		return &v1alpha1.Turn{Machine: machine, PendingHash: "unknown: " + err.Error()}
	}
	for _, t := range c.Status.Turns {
		if t.Machine == machine {
			return &t
		}
	}
	return nil
}

// holdsTurn says whether machine holds a turn in c's status.
func holdsTurn(c *v1alpha1.Cluster, machine string) bool {
	for _, t := range c.Status.Turns {
		if t.Machine == machine {
			return true
		}
	}
	return false
}

// coordinatorCaughtUp waits until the coordinator has planned from every Machine as it is
// now. It makes a Machine that never joins, which a plan names in the Cluster's Available
// condition; the coordinator reads the Machines from one watch, in order, so that plan saw
// every Machine change made before. A plan that changes nothing writes nothing, so nothing
// else in the Cluster's status tells one that kept things as they are from none at all.
func (f *fixture) coordinatorCaughtUp(t *testing.T) {
	t.Helper()
	probe := fmt.Sprintf("probe-%d", time.Now().UnixNano())
	if _, err := f.liken.CreateMachine(t.Context(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: probe}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}); err != nil {
		t.Fatal(err)
	}
	// Never joined, it takes none of the budget while it is there.
	defer func() {
		if err := f.liken.DeleteMachine(context.Background(), probe); err != nil {
			t.Errorf("deleting Machine %s: %v", probe, err)
		}
	}()
	f.waitCluster(t, "the coordinator's plan naming Machine "+probe+" as never joined", func(c *v1alpha1.Cluster) bool {
		a := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ClusterAvailable)
		return a != nil && strings.Contains(a.Message, "not counted: ") && strings.Contains(a.Message, probe)
	})
}

// waitReboots waits until boot took n reboots, failing with the machine's and the
// Cluster's status.
func (f *fixture) waitReboots(t *testing.T, name string, boot *fakeBoot, n int, what string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return boot.rebootCount() >= n, nil
	}); err != nil {
		m, _ := f.liken.Machine(context.Background(), name)
		c, _ := f.liken.Cluster(context.Background())
		t.Fatalf("%s: %s never happened (%d reboots); its status %+v\nthe Cluster's %+v", name, what, boot.rebootCount(), m.Status, c.Status)
	}
}

// settledAfterReboot is a machine back from its reboot with nothing left to do: nothing
// pending, no reboot under way, no turn held and its Node uncordoned.
func (f *fixture) settledAfterReboot(t *testing.T, name string) {
	t.Helper()
	f.waitFor(t, name, "back, healthy, its turn given back and its Node uncordoned", func(m *v1alpha1.Machine, n *corev1.Node) bool {
		return len(m.Status.Pending) == 0 && m.Status.Reboot.State == v1alpha1.RebootNone && f.turnOf(name) == nil && !n.Spec.Unschedulable
	})
}

// untilBody cuts a machine off from the API server from the first request whose body
// holds marker, until restored.
type untilBody struct {
	marker []byte
	cut    atomic.Bool
}

func (u *untilBody) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if !u.cut.Load() && r.Body != nil && r.Method != http.MethodGet {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return nil, err
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, u.marker) {
				u.cut.Store(true)
			}
		}
		if u.cut.Load() {
			return nil, errors.New("connection refused (cut by the test)")
		}
		return next.RoundTrip(r)
	})
}

// TestKilledAfterEachStep (scenario 2): the agent, the coordinator or both are killed after
// each step of a reboot (the Node cordoned, a pod being evicted, the drain done, the reboot
// taken, the status that says so never written); each starts again and the machine
// reboots exactly once, its pod evicted, its turn given back and its Node uncordoned.
func TestKilledAfterEachStep(t *testing.T) {
	type step struct {
		name string
		// reached says the step is done, from the API and the boot control.
		reached func(f *fixture, boot *fakeBoot, name string) bool
	}
	cordoned := step{"the Node cordoned", func(f *fixture, _ *fakeBoot, name string) bool {
		n, err := f.admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && n.Spec.Unschedulable
	}}
	evicting := step{"its pod being evicted", func(f *fixture, _ *fakeBoot, name string) bool {
		p, err := f.admin.CoreV1().Pods("default").Get(context.Background(), name+"-web", metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp != nil
	}}
	drained := step{"the drain done", func(f *fixture, _ *fakeBoot, name string) bool {
		tu := f.turnOf(name)
		return tu != nil && tu.Phase == v1alpha1.TurnDrained
	}}
	rebootTaken := step{"the reboot taken", func(_ *fixture, boot *fakeBoot, _ string) bool { return boot.rebootCount() > 0 }}
	for i, tt := range []struct {
		at                 step
		agent, coordinator bool
		// unsaid: the agent is cut off from the API server as it says Rebooting, so the
		// machine goes down with its status still saying Draining.
		unsaid bool
	}{
		{at: cordoned, agent: true},
		{at: cordoned, coordinator: true},
		{at: evicting, agent: true, coordinator: true},
		{at: drained, coordinator: true},
		{at: drained, agent: true},
		{at: rebootTaken, coordinator: true},
		{at: rebootTaken, unsaid: true},
	} {
		killed := map[bool]string{true: "agent", false: ""}[tt.agent]
		if tt.coordinator {
			killed = strings.TrimPrefix(killed+" and coordinator", " and ")
		}
		if tt.unsaid {
			killed = "machine, its Rebooting status unsaid,"
		}
		t.Run(fmt.Sprintf("%s killed after %s", killed, tt.at.name), func(t *testing.T) {
			name := fmt.Sprintf("kill%d", i+1)
			f := setup(t, map[string]v1alpha1.Role{name: v1alpha1.RoleAgent})
			boot := f.bootedOnClusterRelease(t)
			s := newSim(t, name, v1alpha1.RoleAgent)
			s.bootCtl, s.lastWords = boot, 2*time.Second
			cut := &untilBody{marker: []byte(`"Rebooting"`)}
			if tt.unsaid {
				s.wrap = cut.wrap
			}
			s.boot(t, f)
			s.start(t)
			f.waitFor(t, name, "running", func(m *v1alpha1.Machine, n *corev1.Node) bool {
				return m.Status.Release != nil && m.Status.Reboot.State == v1alpha1.RebootNone
			})
			f.podOn(name, name+"-web", 2)
			f.editMachine(name, func(m *v1alpha1.Machine) {
				m.Spec.RebootPolicy = ptr(v1alpha1.RebootAuto)
				m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
			})
			waitCount(t, tt.at.name, func() bool { return tt.at.reached(f, boot, name) })
			if tt.agent {
				s.stop()
				s.start(t) // the same boot: the machine did not go down
			}
			if tt.coordinator {
				f.stopCoordinator()
				f.startCoordinator(t)
			}
			f.waitReboots(t, name, boot, 1, "the reboot taken")
			if tt.unsaid {
				m, err := f.liken.Machine(t.Context(), name)
				if err != nil || m.Status.Reboot.State == v1alpha1.RebootRebooting || !cut.cut.Load() {
					t.Fatalf("the test meant the API server never to hear Rebooting; it says %q (%v), cut %v", m.Status.Reboot.State, err, cut.cut.Load())
				}
				s.wrap = nil
			}
			// The machine goes down and comes back, the staged network applied by init.
			s.comeBack(t, boot, "boot-2")
			defer s.stop()
			f.settledAfterReboot(t, name)
			if !f.podGone(name + "-web") {
				t.Error("its pod was not evicted")
			}
			// The agent decides to reboot within a pass: one that saw its turn gone and
			// nothing pending is the last that could have, until something changes.
			s.reconciled(t, "nothing pending and its turn gone", func(m *v1alpha1.Machine, c *v1alpha1.Cluster, _ *corev1.Node) bool {
				return len(m.Status.Pending) == 0 && m.Status.Reboot.State == v1alpha1.RebootNone && !holdsTurn(c, name)
			})
			if n := boot.rebootCount(); n != 1 {
				t.Errorf("%d reboots for one change", n)
			}
		})
	}
}

// comeBack is the machine going down and booting again (as boot id, as its last reboot
// armed it, with what init applies at boot applied), its agent starting anew.
func (s *sim) comeBack(t *testing.T, boot *fakeBoot, id string) {
	t.Helper()
	s.stop()
	boot.bootAsArmed(id)
	s.start(t)
}

// running boots and starts a sim of an agent machine on boot control boot and waits until
// it runs its release with no reboot under way; the sim stops when the test ends.
func (f *fixture) running(t *testing.T, name string, boot *fakeBoot) *sim {
	t.Helper()
	s := newSim(t, name, v1alpha1.RoleAgent)
	s.bootCtl = boot
	s.boot(t, f)
	s.start(t)
	t.Cleanup(func() { s.stop() })
	f.waitFor(t, name, "running", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Reboot.State == v1alpha1.RebootNone
	})
	return s
}

// TestNoRebootLoop (scenario 6): a machine under rebootPolicy Auto whose reboot did not
// take its change (init applied no disk layout: today it applies none, and it will leave
// alone a disk that holds something else) still reports the change pending after its
// boot, and does not reboot for it again: it gives its turn back and waits for an
// operator, saying why. An approval is the one way to try again, once.
func TestNoRebootLoop(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"loop1": v1alpha1.RoleAgent})
	boot := f.bootedOnClusterRelease(t)
	boot.refuseDisks = true // each boot finds the disk holding data
	s := f.running(t, "loop1", boot)
	f.editMachine("loop1", func(m *v1alpha1.Machine) {
		m.Spec.RebootPolicy = ptr(v1alpha1.RebootAuto)
		m.Spec.Disks = []v1alpha1.Disk{{Device: "/dev/disk/by-id/virtio-data", Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: "/var/mnt/data"}}}}
	})
	f.waitReboots(t, "loop1", boot, 1, "the reboot for the disk")
	s.comeBack(t, boot, "boot-2")
	waiting := func(m *v1alpha1.Machine) bool {
		return hasPending(m, "machine.spec.disks") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval &&
			strings.Contains(m.Status.Reboot.Message, "happened already")
	}
	f.waitFor(t, "loop1", "the change still pending, waiting for an operator", func(m *v1alpha1.Machine, n *corev1.Node) bool {
		return waiting(m) && f.turnOf("loop1") == nil && !n.Spec.Unschedulable
	})
	// Its turn was given back after that status: a pass that saw it gone is the evidence
	// that nothing left makes the machine ask again.
	s.reconciled(t, "the change waiting for an operator and its turn gone", func(m *v1alpha1.Machine, c *v1alpha1.Cluster, _ *corev1.Node) bool {
		return waiting(m) && !holdsTurn(c, "loop1")
	})
	if n := boot.rebootCount(); n != 1 {
		t.Fatalf("%d reboots: the machine rebooted again for a change its reboot did not take", n)
	}
	approve(f, "loop1")
	f.waitReboots(t, "loop1", boot, 2, "the approved second try")
	s.comeBack(t, boot, "boot-3")
	f.waitFor(t, "loop1", "waiting for an operator again", func(m *v1alpha1.Machine, n *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval && f.turnOf("loop1") == nil && !n.Spec.Unschedulable
	})
	s.reconciled(t, "the change waiting for an operator again and its turn gone", func(m *v1alpha1.Machine, c *v1alpha1.Cluster, _ *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval && !holdsTurn(c, "loop1")
	})
	if n := boot.rebootCount(); n != 2 {
		t.Fatalf("%d reboots after one approval of a change that stays pending; want 2", n)
	}
}

// TestStaleApprovalNeverApplies (scenario 11): an approval of a pending set that has changed
// since is ignored and shown as stale; an approval of the current set reboots the machine
// once; left in the spec after its reboot, it approves neither a later change nor a second
// reboot.
func TestStaleApprovalNeverApplies(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"stale1": v1alpha1.RoleAgent})
	boot := f.bootedOnClusterRelease(t)
	s := f.running(t, "stale1", boot)
	network := func(ifaces ...string) {
		f.editMachine("stale1", func(m *v1alpha1.Machine) {
			m.Spec.Network = &v1alpha1.MachineNetwork{}
			for _, i := range ifaces {
				m.Spec.Network.Interfaces = append(m.Spec.Network.Interfaces, v1alpha1.Interface{Name: v1alpha1.InterfaceName(i), DHCP: true})
			}
		})
	}
	var hash string
	// waiting waits for a new pending set (or, given stale, the same one with the approval
	// on record shown as stale).
	waiting := func(what string, stale string) {
		t.Helper()
		f.waitFor(t, "stale1", what, func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			ok := hasPending(m, "machine.spec.network") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
			if stale != "" {
				ok = ok && strings.Contains(m.Status.Reboot.Message, "the approval on record is for "+stale+", a set that has changed since: stale")
			} else {
				ok = ok && m.Status.PendingHash != hash
			}
			if ok {
				hash = m.Status.PendingHash
			}
			return ok
		})
	}
	network("eth0")
	waiting("the first change waiting for approval", "")
	first := hash
	approveHash := func(h string) {
		f.editMachine("stale1", func(m *v1alpha1.Machine) {
			var prev *v1alpha1.RebootApproval
			if m.Spec.Reboot != nil {
				prev = m.Spec.Reboot.Approval
			}
			at := v1alpha1.NewApprovalTime(prev, h, time.Now())
			m.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: h, ApprovedBy: "test", ApprovedAt: &at}}
		})
	}
	// The set changes before the operator's approval of the first lands: it is stale.
	network("eth0", "eth1")
	waiting("the second change waiting for approval", "")
	second := hash
	approveHash(first)
	// The status of the approval's generation is the agent's decision: a reboot is taken
	// within the pass that writes it, and WaitingForApproval asks the coordinator for no turn.
	waiting("the first set's approval shown as stale", first)
	if boot.rebootCount() != 0 || f.turnOf("stale1") != nil {
		t.Fatalf("a stale approval started a reboot (%d reboots, turn %+v)", boot.rebootCount(), f.turnOf("stale1"))
	}
	approveHash(second)
	f.waitReboots(t, "stale1", boot, 1, "the reboot approved for the current set")
	s.comeBack(t, boot, "boot-2")
	f.settledAfterReboot(t, "stale1")
	// The used approval stays in the spec: a later change is not approved by it.
	network("eth1")
	waiting("a later change waiting for its own approval", "")
	waiting("the used approval shown as stale for it", second)
	if n := boot.rebootCount(); n != 1 {
		t.Fatalf("%d reboots: a used approval approved a later change", n)
	}
}

// TestSingleServerRebootsWithAPIOffline (scenario 9): the one server of a cluster runs the
// coordinator itself; its reboot takes its own API server down with it (here
// kube-apiserver stops as the reboot is taken, and starts again a while after the boot).
// It completes the reboot from what it persisted, and gives its turn back once healthy.
func TestSingleServerRebootsWithAPIOffline(t *testing.T) {
	f := setupFleet(t, map[string]v1alpha1.Role{"solo": v1alpha1.RoleServer})
	boot := f.bootedOnClusterRelease(t)
	s := newSim(t, "solo", v1alpha1.RoleServer)
	s.bootCtl, s.coordinator, s.lastWords = boot, true, 2*time.Second
	s.boot(t, f)
	s.start(t)
	defer func() { s.stop() }()
	f.waitFor(t, "solo", "running", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Reboot.State == v1alpha1.RebootNone
	})
	f.editMachine("solo", func(m *v1alpha1.Machine) {
		m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
	})
	f.waitFor(t, "solo", "the change waiting for approval", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
	})
	approve(f, "solo")
	f.waitReboots(t, "solo", boot, 1, "the reboot taken")
	// The machine goes down, and its API server with it.
	s.stop()
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	apiBack := false
	t.Cleanup(func() { // the package's other tests need it, whatever happens here
		if !apiBack {
			env.StartAPIServer(context.Background())
		}
	})
	boot.bootAsArmed("boot-2")
	s.start(t) // before its API server answers, as on a real server
	time.Sleep(3 * time.Second)
	if err := env.StartAPIServer(context.Background()); err != nil {
		t.Fatal(err)
	}
	apiBack = true
	f.settledAfterReboot(t, "solo")
	if n := boot.rebootCount(); n != 1 {
		t.Errorf("%d reboots for one approval", n)
	}
}

// TestCoordinatorHandsOverItsLease (scenario 10): two servers run coordinators; the one
// that leads reboots last, gives its Lease up as its agent stops for the reboot (before its
// machine goes down, not by the Lease running out), and the other leads from then on and
// takes the returning machine's turn back.
func TestCoordinatorHandsOverItsLease(t *testing.T) {
	f := setupFleet(t, map[string]v1alpha1.Role{"lead1": v1alpha1.RoleServer, "lead2": v1alpha1.RoleServer})
	sims := map[string]*sim{}
	boots := map[string]*fakeBoot{}
	for _, n := range []string{"lead1", "lead2"} {
		boots[n] = f.bootedOnClusterRelease(t)
		s := newSim(t, n, v1alpha1.RoleServer)
		s.bootCtl, s.coordinator, s.lastWords = boots[n], true, 2*time.Second
		s.boot(t, f)
		sims[n] = s
	}
	// lead1 first, so it takes the Lease.
	sims["lead1"].start(t)
	holder := func() string {
		l, err := f.admin.CoordinationV1().Leases(v1alpha1.SecretNamespace).Get(context.Background(), authority.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	waitCount(t, "lead1 leading", func() bool { return holder() == "lead1" })
	sims["lead2"].start(t)
	defer func() {
		for _, s := range sims {
			s.stop()
		}
	}()
	// Every holder the Lease had, in order, from a watch.
	w, err := f.admin.CoordinationV1().Leases(v1alpha1.SecretNamespace).Watch(t.Context(),
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", authority.LeaseName).String()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	holders := make(chan string, 100)
	go func() {
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*coordv1.Lease); ok && l.Spec.HolderIdentity != nil {
				holders <- *l.Spec.HolderIdentity
			}
		}
	}()
	// lead2 asks first: lead1, the coordinator's machine, would go last anyway.
	for _, n := range []string{"lead2", "lead1"} {
		f.waitFor(t, n, "running", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return m.Status.Release != nil && m.Status.Reboot.State == v1alpha1.RebootNone
		})
		f.editMachine(n, func(m *v1alpha1.Machine) {
			m.Spec.RebootPolicy = ptr(v1alpha1.RebootAuto)
			m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
		})
		if n == "lead2" {
			// Asked before lead1 is edited: the coordinator's machine goes last only among
			// machines that wait (an agent slowed by the race detector once asked after it).
			f.waitFor(t, n, "asking for its turn", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
				return m.Status.PendingHash != "" && m.Status.Reboot.State != v1alpha1.RebootNone
			})
		}
	}
	// lead2 goes first (lead1 coordinates); it comes back.
	f.waitReboots(t, "lead2", boots["lead2"], 1, "lead2's reboot")
	if boots["lead1"].rebootCount() != 0 {
		t.Fatal("the coordinator's machine lead1 rebooted before lead2")
	}
	sims["lead2"].comeBack(t, boots["lead2"], "boot-2")
	f.settledAfterReboot(t, "lead2")
	// lead1's turn: its agent stops as the machine goes down and gives the Lease up.
	f.waitReboots(t, "lead1", boots["lead1"], 1, "lead1's reboot")
	stopped := time.Now()
	sims["lead1"].stop()
	var seen []string
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for {
			select {
			case h := <-holders:
				if len(seen) == 0 || seen[len(seen)-1] != h {
					seen = append(seen, h)
				}
			default:
				return len(seen) > 0 && seen[len(seen)-1] == "lead2", nil
			}
		}
	}); err != nil {
		t.Fatalf("lead2 never led; the Lease's holders were %q", seen)
	}
	took := time.Since(stopped)
	// Given up, not run out: the Lease says no one holds it before lead2 does.
	if i := index(seen, ""); i < 0 || index(seen, "lead2") < i {
		t.Errorf("the Lease's holders went %q: lead1 did not give it up before lead2 led", seen)
	}
	t.Logf("lead2 led %s after lead1's agent stopped (Lease duration %s); holders %q", took.Round(time.Millisecond), fastCoordinator.LeaseDuration, seen)
	boots["lead1"].bootAsArmed("boot-2")
	sims["lead1"].start(t)
	f.settledAfterReboot(t, "lead1")
	for n, b := range boots {
		if c := b.rebootCount(); c != 1 {
			t.Errorf("%s rebooted %d times", n, c)
		}
	}
}

func index[T comparable](list []T, v T) int {
	for i, x := range list {
		if x == v {
			return i
		}
	}
	return -1
}

// TestTurnHeldThroughTrial: a machine in the trial boot its turn was drained for keeps the
// turn while a new Reboot-class change (here a reboot request) becomes pending: it reports
// Verifying until the trial commits, so the coordinator neither uncordons it nor gives the
// budget to the next machine while it may still fall back. Before, it reported
// WaitingForApproval and the turn went to the next machine at once.
func TestTurnHeldThroughTrial(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"h1": v1alpha1.RoleAgent, "h2": v1alpha1.RoleAgent})
	b1, b2 := f.bootedOnClusterRelease(t), f.bootedOnClusterRelease(t)
	h1, _ := f.running(t, "h1", b1), f.running(t, "h2", b2)
	// New kernel arguments (NextBoot) and a reboot request: the reboot tries them once.
	requested := metav1.NewTime(time.Now().Truncate(time.Second))
	ask := func(m *v1alpha1.Machine) {
		m.Spec.KernelArgs = []v1alpha1.KernelArg{"liken.test=1"}
		m.Spec.Reboot = &v1alpha1.RebootControl{Request: &v1alpha1.RebootRequest{RequestedAt: requested, RequestedBy: "bob"}}
	}
	f.editMachine("h1", ask)
	f.editMachine("h2", ask)
	for _, n := range []string{"h1", "h2"} {
		f.waitFor(t, n, "the reboot request pending", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return hasPending(m, requestField) && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
		})
	}
	approve(f, "h1")
	f.waitReboots(t, "h1", b1, 1, "the approved trial of the kernel arguments")
	if r := b1.lastReboot(); r.TrialSlot == "" {
		t.Fatalf("h1's reboot armed no trial: %+v", r)
	}
	// The trial boot: k3s has not reported it yet, so it is not healthy.
	h1.kubeletLate = true
	h1.comeBack(t, b1, "boot-2")
	approve(f, "h2")
	f.waitFor(t, "h2", "waiting for the turn h1 holds", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootWaitingForTurn
	})
	f.editMachine("h1", func(m *v1alpha1.Machine) {
		// Made after the trial boot started, so that boot does not carry it out.
		m.Spec.Reboot = &v1alpha1.RebootControl{Request: &v1alpha1.RebootRequest{RequestedAt: metav1.NewTime(time.Now().Add(2 * time.Second).Truncate(time.Second)), RequestedBy: "alice"}}
	})
	held := func(m *v1alpha1.Machine, n *corev1.Node) bool {
		tn := f.turnOf("h1")
		return hasPending(m, requestField) && m.Status.Reboot.State == v1alpha1.RebootVerifying && tn != nil && n.Spec.Unschedulable
	}
	f.waitFor(t, "h1", "the request pending and the trial holding its turn", held)
	// A plan from h1's status as it is now kept h1's turn and gave h2 none: no later plan
	// differs while nothing changes.
	f.coordinatorCaughtUp(t)
	f.waitFor(t, "h1", "still holding its turn", held)
	if tn := f.turnOf("h2"); tn != nil || b2.rebootCount() != 0 {
		t.Fatalf("h2 was given a turn (%+v, %d reboots) while h1's trial was not committed", tn, b2.rebootCount())
	}

	h1.reportBoot(t)
	waitCount(t, "h1's trial committed", func() bool { return b1.get().Committed })
	f.waitFor(t, "h1", "h1's turn given back, the request waiting for approval", func(m *v1alpha1.Machine, n *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval && f.turnOf("h1") == nil && !n.Spec.Unschedulable
	})
	f.waitReboots(t, "h2", b2, 1, "h2's reboot on the turn h1 gave back")
}

// TestRefusedDiskAsksForNoReboot: under rebootPolicy Auto, a disk init refused at a boot
// stays pending and, rebooted for together with another change, does not by itself ask for
// one more reboot once the other change is applied. Before, the agent remembered only the
// last rebooted set, and the set left ({disks}) was new to it: one extra reboot after every
// other change.
func TestRefusedDiskAsksForNoReboot(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"rd1": v1alpha1.RoleAgent})
	boot := f.bootedOnClusterRelease(t)
	boot.refuseDisks = true
	s := f.running(t, "rd1", boot)
	f.editMachine("rd1", func(m *v1alpha1.Machine) {
		m.Spec.RebootPolicy = ptr(v1alpha1.RebootAuto)
		m.Spec.Disks = []v1alpha1.Disk{{Device: "/dev/disk/by-id/virtio-data", Partitions: []v1alpha1.Partition{{Label: "data", MountPoint: "/var/mnt/data"}}}}
	})
	f.waitReboots(t, "rd1", boot, 1, "the reboot for the disk")
	s.comeBack(t, boot, "boot-2")
	f.waitFor(t, "rd1", "the refused disk pending, waiting for an operator", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.disks") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
	})

	// Another Reboot-class change: one reboot takes it (the disk is tried with it).
	f.editMachine("rd1", func(m *v1alpha1.Machine) {
		m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
	})
	f.waitReboots(t, "rd1", boot, 2, "the reboot for the network")
	s.comeBack(t, boot, "boot-3")
	left := func(m *v1alpha1.Machine) bool {
		return !hasPending(m, "machine.spec.network") && hasPending(m, "machine.spec.disks") &&
			m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval && strings.Contains(m.Status.Reboot.Message, "could not apply")
	}
	f.waitFor(t, "rd1", "the network applied, the disk still pending and no reboot asked for", func(m *v1alpha1.Machine, n *corev1.Node) bool {
		return left(m) && f.turnOf("rd1") == nil && !n.Spec.Unschedulable
	})
	// Its turn was given back after that status: a pass that saw it gone is the evidence
	// that the disk left pending does not make the machine ask again.
	s.reconciled(t, "the disk left pending and the turn gone", func(m *v1alpha1.Machine, c *v1alpha1.Cluster, _ *corev1.Node) bool {
		return left(m) && !holdsTurn(c, "rd1")
	})
	if n := boot.rebootCount(); n != 2 {
		t.Fatalf("%d reboots: the refused disk asked for another reboot by itself", n)
	}
	approve(f, "rd1")
	f.waitReboots(t, "rd1", boot, 3, "the operator's approved retry of the disk")
}
