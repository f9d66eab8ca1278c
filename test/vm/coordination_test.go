package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/cli"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/test/apiserver"
	"liken.dev/liken/test/report"
)

// vmAgent is an agent machine beside vm-1, on a QEMU user network of its own (so it too is
// 10.0.2.15 there, by DHCP, and reaches the host's API server at 10.0.2.2).
const vmAgent = `apiVersion: liken.dev/v1alpha1
kind: Machine
metadata:
  name: vm-2
spec:
  role: agent
  match:
    macs: ["52:54:00:12:34:02"]
  network:
    interfaces:
      - name: eth0
        mac: "52:54:00:12:34:02"
        dhcp: true
`

// fleetRecord is what a watch on the Nodes and one on the Cluster saw, in the API server's
// order: each Node's availability and the turn holders of every stored Cluster status.
type fleetRecord struct {
	mu       sync.Mutex
	start    time.Time
	timeline []string
	// atOnce are the moments two machines were unavailable, or held turns, together.
	atOnce []string
	// cordoned: when each Node was first seen so; notReady and readyAgain: when it was last
	// seen turning NotReady, and Ready; granted and released: when each machine's turn was
	// last seen to begin, and to end; gateFailed: when a machine's turn was last seen to
	// fail its gates.
	cordoned, notReady, readyAgain, granted, released, gateFailed map[string]time.Time
	nodes                                                         map[string]string // name → why unavailable, "" if available
	holders                                                       []string
	failedGates                                                   map[string]bool // machine@since of the gate failures seen
}

func (r *fleetRecord) say(format string, args ...any) {
	r.timeline = append(r.timeline, fmt.Sprintf("%6.1fs ", time.Since(r.start).Seconds())+fmt.Sprintf(format, args...))
}

func (r *fleetRecord) node(n *corev1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	why := ""
	if !kube.NodeReady(n) {
		why = "NotReady"
		if prev, seen := r.nodes[n.Name]; !seen || !strings.Contains(prev, "NotReady") {
			r.notReady[n.Name] = time.Now()
		}
	} else if prev, seen := r.nodes[n.Name]; seen && strings.Contains(prev, "NotReady") {
		r.readyAgain[n.Name] = time.Now()
	}
	if n.Spec.Unschedulable {
		why = strings.TrimPrefix(why+", cordoned", ", ")
		if _, ok := r.cordoned[n.Name]; !ok {
			r.cordoned[n.Name] = time.Now()
		}
	}
	if prev, seen := r.nodes[n.Name]; !seen || prev != why {
		r.say("Node %s: %s", n.Name, orText(why, "available"))
	}
	r.nodes[n.Name] = why
	var down []string
	for name, w := range r.nodes {
		if w != "" {
			down = append(down, name+" "+w)
		}
	}
	if len(down) > 1 {
		r.atOnce = append(r.atOnce, fmt.Sprintf("Nodes unavailable together: %v", down))
	}
}

func (r *fleetRecord) cluster(c *v1alpha1.Cluster) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var holders []string
	for _, t := range c.Status.Turns {
		holders = append(holders, t.Machine+" ("+string(t.Phase)+")")
		if !strings.Contains(strings.Join(r.holders, ","), t.Machine+" ") {
			r.granted[t.Machine] = time.Now()
		}
		if g := t.Gates; g != nil && g.Phase == v1alpha1.GateFailed && !r.failedGates[t.Machine+"@"+g.Since.String()] {
			r.failedGates[t.Machine+"@"+g.Since.String()] = true
			r.gateFailed[t.Machine] = time.Now()
			r.say("%s failed its gates: %s", t.Machine, g.Message)
		}
	}
	for _, h := range r.holders {
		name, _, _ := strings.Cut(h, " ")
		if !strings.Contains(strings.Join(holders, ","), name+" ") {
			r.released[name] = time.Now()
		}
	}
	if strings.Join(holders, ",") != strings.Join(r.holders, ",") {
		r.say("turns: %v", holders)
	}
	r.holders = holders
	if len(holders) > 1 {
		r.atOnce = append(r.atOnce, fmt.Sprintf("turns held together: %v", holders))
	}
}

func orText(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// record watches the fleet until the test ends.
func (j *joined) record(t *testing.T) *fleetRecord {
	t.Helper()
	r := &fleetRecord{start: time.Now(), cordoned: map[string]time.Time{}, notReady: map[string]time.Time{},
		readyAgain: map[string]time.Time{}, granted: map[string]time.Time{}, released: map[string]time.Time{}, gateFailed: map[string]time.Time{},
		nodes: map[string]string{}, failedGates: map[string]bool{}}
	nw, err := j.admin.CoreV1().Nodes().Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cw, err := j.lc.ClusterListWatch().Watch(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nw.Stop(); cw.Stop() })
	go func() {
		for ev := range nw.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok {
				r.node(n)
			}
		}
	}()
	go func() {
		for ev := range cw.ResultChan() {
			if c, ok := ev.Object.(*v1alpha1.Cluster); ok {
				r.cluster(c)
			}
		}
	}()
	t.Cleanup(func() {
		r.mu.Lock()
		t.Logf("what the watches saw:\n%s", strings.Join(r.timeline, "\n"))
		r.mu.Unlock()
	})
	return r
}

func (r *fleetRecord) at(m map[string]time.Time, name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return m[name]
}

// waitFleet polls the named Machine until ok holds with its Node, failing with its status.
func (j *joined) waitFleet(t *testing.T, name, what string, timeout time.Duration, ok func(*v1alpha1.Machine, *corev1.Node) bool) {
	t.Helper()
	var last *v1alpha1.Machine
	err := waitUntil(t, name+": "+what, time.Second, timeout, func(ctx context.Context) (bool, error) {
		m, err := j.lc.Machine(ctx, name)
		if err != nil {
			return false, nil
		}
		last = m
		n, err := j.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && m.Status.ObservedGeneration == m.Generation && ok(m, n), nil
	})
	if err != nil {
		b, _ := json.MarshalIndent(last, "", "  ")
		c, _ := j.lc.Cluster(context.Background())
		t.Fatalf("%s: %s never happened: %v; last Machine:\n%s\nthe Cluster's status: %+v", name, what, err, b, c.Status)
	}
}

// settled: running its release, nothing pending, no reboot under way, its turn given back
// and its Node Ready and schedulable.
func (j *joined) settled(m *v1alpha1.Machine, n *corev1.Node) bool {
	c, err := j.lc.Cluster(context.Background())
	if err != nil {
		return false
	}
	for _, tu := range c.Status.Turns {
		if tu.Machine == m.Name {
			return false
		}
	}
	return running(m, "A", releaseA) && len(m.Status.Pending) == 0 && m.Status.Reboot.State == v1alpha1.RebootNone &&
		kube.NodeReady(n) && !n.Spec.Unschedulable
}

func (j *joined) editNamed(t *testing.T, name string, edit func(*v1alpha1.Machine)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := j.lc.Machine(t.Context(), name)
		if err != nil {
			return err
		}
		edit(m)
		_, err = j.lc.UpdateMachine(t.Context(), m)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// searchDomain changes a machine's resolvers: a network change, which needs a reboot.
func searchDomain(domain string) func(*v1alpha1.Machine) {
	return func(m *v1alpha1.Machine) {
		if m.Spec.Network.DNS == nil {
			m.Spec.Network.DNS = &v1alpha1.DNS{}
		}
		m.Spec.Network.DNS.Search = []string{domain}
	}
}

// podOn binds a pod owned by a controller to node; the k3s stand-in there reports it
// Running and, once it is evicted, removes it after its grace period.
func (j *joined) podOn(t *testing.T, node, name string, grace int64) {
	t.Helper()
	ctx := t.Context()
	// The controller manager's serviceaccount controller makes it too; whichever is first.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"}}
	if _, err := j.admin.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name + "-rs", UID: "00000000-0000-0000-0000-000000000002", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/app"}}},
	}
	if _, err := j.admin.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := j.admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	}); err != nil {
		t.Fatalf("pod %s never ran on %s", name, node)
	}
}

// TestTwoMachinesTakeTurns boots a server (vm-1, whose agent runs the reboot coordinator)
// and an agent machine (vm-2) from the project's release, each in its own QEMU, against an
// API server on the host with the controller manager's node lifecycle controller (so a
// Node whose machine is down goes NotReady, as in a cluster). A network change to vm-2
// under rebootPolicy Manual waits for `liken approve-reboot`; then its Node is cordoned,
// its pod evicted, it reboots, passes the health gate, is uncordoned and gives its turn
// back, with nothing left pending. Then under Auto with maxUnavailable 1, a change to both:
// they reboot one after the other (the coordinator's own machine last), never both at once,
// as the recorded Node conditions and turns show. Last, release B, which breaks a workload
// that its gate watches (gatedRelease): the first machine falls back and the rollout halts
// before the second.
func TestTwoMachinesTakeTurns(t *testing.T) {
	vmTest(t)
	j := joinMachines(t, apiserver.Options{ControllerManager: true, Scheduler: true,
		Controllers:           "node-lifecycle-controller,serviceaccount-controller,daemonset-controller",
		ControllerManagerArgs: []string{"--node-monitor-grace-period=20s", "--node-monitor-period=2s"},
	}, 512, []string{vmMachine, vmAgent}, "liken.test.k3s-fault=slow-start=25s liken.test.k3s-fault-release="+releaseB+":pods-not-ready", releaseB)
	// slow-start: k3s starts 25 s into each boot, so a rebooting machine's kubelet is silent
	// longer than the 20 s grace whatever the emulation's speed, and its Node goes NotReady:
	// the health-gate check below needs that NotReady, on a fast host too.
	// k3s-fault-release: release B, and only B, breaks the workloads and not k3s (its pods
	// run but are never Ready): gatedRelease. The scheduler and the DaemonSet controller
	// place gatedRelease's workload.
	// Two machines on two host cores: one vCPU each.
	one := Speed{CPUs: 1, Icount: DefaultSpeed().Icount}
	vms := map[string]*VM{
		"vm-1": bootUEFIAt(t, one, j.disks["vm-1"], true, "52:54:00:12:34:01"),
		"vm-2": bootUEFIAt(t, one, j.disks["vm-2"], true, "52:54:00:12:34:02"),
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("vm-2's console:\n%s", vms["vm-2"].Console())
		}
	})
	for _, n := range []string{"vm-1", "vm-2"} {
		j.waitFleet(t, n, "running with nothing pending", firstBoot, j.settled)
	}
	rec := j.record(t)
	j.podOn(t, "vm-2", "web-0", 5)

	// Manual (the example Cluster's policy): the change waits for an operator.
	states := j.watchRebootStates(t, "vm-2")
	j.editNamed(t, "vm-2", searchDomain("manual.liken.test"))
	j.waitFleet(t, "vm-2", "the network change waiting for approval", 2*time.Minute, func(m *v1alpha1.Machine, n *corev1.Node) bool {
		return hasPending(m, "machine.spec.network") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval && !n.Spec.Unschedulable
	})
	time.Sleep(5 * time.Second)
	if c, _ := j.lc.Cluster(t.Context()); len(c.Status.Turns) != 0 || strings.Contains(vms["vm-2"].Console(), "liken-init: reboot: ") {
		t.Fatalf("before any approval: turns %+v, and vm-2 rebooted: %v", c.Status.Turns, strings.Contains(vms["vm-2"].Console(), "liken-init: reboot: "))
	}
	var stdout, stderr bytes.Buffer
	mark := vms["vm-2"].Mark()
	approved := time.Now()
	if code := cli.Run(t.Context(), []string{"approve-reboot", "vm-2", "--kubeconfig", j.env.AdminKubeconfig}, &stdout, &stderr); code != 0 {
		t.Fatalf("liken approve-reboot vm-2: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	expectAfter(t, vms["vm-2"], mark, "liken-init: reboot: ", 4*time.Minute)
	rebootAt := time.Now()
	if _, err := j.admin.CoreV1().Pods("default").Get(t.Context(), "web-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("vm-2 went down with its pod web-0 not evicted (%v)", err)
	}
	if c := rec.at(rec.cordoned, "vm-2"); c.IsZero() || c.After(rebootAt) {
		t.Errorf("vm-2's Node was not seen cordoned before its reboot (cordoned at %v)", c)
	}
	j.waitFleet(t, "vm-2", "back, its change applied, uncordoned and its turn given back", 6*time.Minute, j.settled)
	turnBack := rec.at(rec.released, "vm-2")
	if turnBack.IsZero() {
		t.Fatal("vm-2's turn was never seen given back")
	}
	// The health gate: the Node went NotReady while down (a reboot in TCG outlasts the node
	// controller's grace period by far), and was Ready again before the turn was given back.
	// Without the NotReady, this check would prove nothing: it is required.
	if down := rec.at(rec.notReady, "vm-2"); down.IsZero() || down.Before(rebootAt.Add(-time.Minute)) {
		t.Errorf("vm-2's Node was not seen NotReady while it was down (last turned NotReady at %v, reboot at %s): the health gate was not exercised",
			down, rebootAt.Format(time.StampMilli))
	} else if up := rec.at(rec.readyAgain, "vm-2"); up.IsZero() || up.After(turnBack) {
		t.Errorf("vm-2's turn was given back at %s, before its Node was Ready again (%s)", turnBack.Format(time.StampMilli), up.Format(time.StampMilli))
	}
	if s := states(); index(s, v1alpha1.RebootWaitingForApproval) < 0 || index(s, v1alpha1.RebootDraining) < index(s, v1alpha1.RebootWaitingForApproval) ||
		index(s, v1alpha1.RebootRebooting) < index(s, v1alpha1.RebootDraining) || s[len(s)-1] != v1alpha1.RebootNone {
		t.Errorf("vm-2's status.reboot.state went through %v; want WaitingForApproval, Draining, Rebooting, ..., None", s)
	} else {
		t.Logf("vm-2's status.reboot.state went through %v", s)
	}
	manual := turnBack.Sub(approved)
	m, _ := j.lc.Machine(t.Context(), "vm-2")
	if m.Status.Reboot.ApprovedHash == "" || !strings.Contains(stdout.String(), "vm-2") {
		t.Errorf("the approval is not on record: status.reboot.approvedHash %q; approve-reboot said %q", m.Status.Reboot.ApprovedHash, stdout.String())
	}
	// The coordinator records its Events after it writes the turn into the Cluster's status,
	// which is what the test saw: they may reach the API server a moment later.
	var ev map[string]int
	wait.PollUntilContextTimeout(t.Context(), time.Second, time.Minute, true, func(context.Context) (bool, error) {
		ev = j.eventsOf(t, "vm-2")
		return ev["TurnGranted"] > 0 && ev["Drained"] > 0 && ev["Rebooting"] > 0 && ev["TurnReleased"] > 0, nil
	})
	for _, r := range []string{"TurnGranted", "Drained", "Rebooting", "TurnReleased"} {
		if ev[r] == 0 {
			t.Errorf("no %s Event for vm-2 within a minute; got %v", r, ev)
		}
	}

	// Auto, one machine unavailable at a time: a change to both.
	marks := map[string]int{"vm-1": vms["vm-1"].Mark(), "vm-2": vms["vm-2"].Mark()}
	j.editCluster(t, func(c *v1alpha1.Cluster) {
		one := intstr.FromInt32(1)
		c.Spec.RebootPolicy = v1alpha1.RebootAuto
		c.Spec.DisruptionBudget.MaxUnavailable = &one
	})
	autoStart := time.Now()
	// vm-2 first, and waiting, before vm-1 (the coordinator's machine) asks: "last" orders
	// the machines that wait together.
	j.editNamed(t, "vm-2", searchDomain("auto.liken.test"))
	j.waitFleet(t, "vm-2", "asking for its turn", 3*time.Minute, func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		s := m.Status.Reboot.State
		return hasPending(m, "machine.spec.network") && s != v1alpha1.RebootNone && s != v1alpha1.RebootWaitingForApproval
	})
	j.editNamed(t, "vm-1", searchDomain("auto.liken.test"))
	for _, n := range []string{"vm-2", "vm-1"} {
		j.waitFleet(t, n, "back from its Auto reboot with nothing pending", 10*time.Minute, j.settled)
	}
	auto := time.Since(autoStart)
	for n, vm := range vms {
		if c := strings.Count(vm.Console()[marks[n]:], "liken-init: reboot: "); c != 1 {
			t.Errorf("%s rebooted %d times for one change under Auto", n, c)
		}
	}
	// The coordinator's own machine, vm-1, went last.
	if r1, r2 := rec.at(rec.released, "vm-1"), rec.at(rec.released, "vm-2"); !r2.Before(r1) {
		t.Errorf("vm-2's turn ended at %s, after vm-1's at %s: the coordinator's machine must go last", r2.Format(time.StampMilli), r1.Format(time.StampMilli))
	}
	rec.mu.Lock()
	atOnce := append([]string(nil), rec.atOnce...)
	notReady := len(rec.notReady)
	rec.mu.Unlock()
	if len(atOnce) > 0 {
		t.Errorf("two machines were down or held turns at once with maxUnavailable 1: %v", atOnce)
	}
	report.Line("two machines in QEMU (TCG, 1 vCPU each): approve-reboot to vm-2's turn given back %s (cordon, eviction, reboot, health gate); Auto change to both, one after the other, %s; %d Nodes seen NotReady while down",
		manual.Round(time.Second), auto.Round(time.Second), notReady)

	gatedRelease(t, j, vms, rec)
}

// gatedRelease: release B, which breaks a workload and not k3s, rolled out under Auto to
// the two machines of TestTwoMachinesTakeTurns, vm-2 first (a canary), with a gate on that
// workload. The workload, a DaemonSet, is Available on release A on both machines. vm-2 is
// drained and boots B's trial, which is healthy by its own account (k3s, its Node Ready);
// but on B its pod never becomes Ready (the test switch liken.test.k3s-fault-release, set
// for B only: the stand-in's pods-not-ready, a kernel regression in a driver as a simulated
// node can show it), so its gate does not pass within its timeout, with commitAfterGates
// (the default) the trial ends and vm-2 falls back to slot A, where its pod is Ready again;
// and with maxFailures 1 (the default) the coordinator halts the rollout: vm-1 stays on A,
// never cordoned, drained or given a turn.
func gatedRelease(t *testing.T, j *joined, vms map[string]*VM, rec *fleetRecord) {
	t.Helper()
	ctx := t.Context()
	labels := map[string]string{"app": "gated"}
	no := false
	d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "gated", Namespace: "default", Labels: labels},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/app"}}}}}}
	if _, err := j.admin.AppsV1().DaemonSets("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// available is whether the DaemonSet has a Ready pod on each of the two machines.
	available := func(ctx context.Context) error {
		d, err := j.admin.AppsV1().DaemonSets("default").Get(ctx, "gated", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s := d.Status; s.DesiredNumberScheduled != 2 || s.NumberAvailable != 2 {
			return fmt.Errorf("DaemonSet gated: %d of %d pods available, %d desired", s.NumberAvailable, s.DesiredNumberScheduled, 2)
		}
		return nil
	}
	var last error
	availableWithin := func(what string, bound time.Duration) {
		t.Helper()
		if err := waitUntil(t, what, 2*time.Second, bound, func(ctx context.Context) (bool, error) {
			last = available(ctx)
			return last == nil, nil
		}); err != nil {
			t.Fatalf("%s: %v (last: %v)", what, err, last)
		}
	}
	// Bound: the DaemonSet controller, the scheduler and the stand-ins' 2 s turns; a minute
	// is plenty on the host, the rest for the machines' busy API clients.
	availableWithin("the gated DaemonSet Available on release A on both machines", 3*time.Minute)
	j.editNamed(t, "vm-2", func(m *v1alpha1.Machine) {
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		m.Labels["liken.test/canary"] = "yes"
	})
	marks := map[string]int{"vm-1": vms["vm-1"].Mark(), "vm-2": vms["vm-2"].Mark()}
	start := time.Now()
	const gateTimeout = 30 * time.Second
	j.editCluster(t, func(c *v1alpha1.Cluster) {
		c.Spec.Version = releaseB
		if c.Spec.Rollout == nil {
			c.Spec.Rollout = &v1alpha1.Rollout{}
		}
		c.Spec.Rollout.Canaries = &metav1.LabelSelector{MatchLabels: map[string]string{"liken.test/canary": "yes"}}
		c.Spec.Rollout.Gates = []v1alpha1.RolloutGate{{Name: "gated", Timeout: &metav1.Duration{Duration: gateTimeout},
			Workloads: &v1alpha1.WorkloadsGate{Namespace: "default", Selector: metav1.LabelSelector{MatchLabels: labels}}}}
	})
	digestB := j.channel.pins[releaseB]
	// Bound: staging B (a download and a verified write on one vCPU), a drain, a reboot, the
	// gate's timeout and the fallback's reboot.
	j.waitFleet(t, "vm-2", "back on release A from slot A after its trial of B failed its gate", 15*time.Minute, func(m *v1alpha1.Machine, n *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineUpgradeFailed)
		failedB := slices.ContainsFunc(m.Status.Upgrade.FailedReleases, func(f v1alpha1.FailedRelease) bool { return f.Digest == digestB })
		return running(m, "A", releaseA) && failedB && c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonGateFailed && kube.NodeReady(n)
	})
	back := time.Now()
	// B, and only B, broke the workload: vm-2's trial of B said so, vm-1 (on A) never did,
	// and back on A vm-2's pod is Ready again.
	if c := strings.Count(vms["vm-2"].Console()[marks["vm-2"]:], "k3s-standin: fault pods-not-ready"); c != 1 {
		t.Errorf("vm-2's console shows release B's fault pods-not-ready %d times since B's rollout began; want once, in its trial of B", c)
	}
	if strings.Contains(vms["vm-1"].Console(), "fault pods-not-ready") {
		t.Errorf("vm-1, which never booted B, shows B's fault pods-not-ready")
	}
	availableWithin("the gated DaemonSet Available again, vm-2 back on release A", 3*time.Minute)
	failedAt := rec.at(rec.gateFailed, "vm-2")
	if failedAt.IsZero() || failedAt.Before(start) {
		t.Fatalf("vm-2 is back on A, but its turn was never seen failing its gates (last at %v)", failedAt)
	}
	if c := strings.Count(vms["vm-2"].Console()[marks["vm-2"]:], "liken-init: reboot: "); c != 2 {
		t.Errorf("vm-2 rebooted %d times for release B; want 2 (into the trial, and back after its gate failed)", c)
	}
	// The halt, and what it holds: vm-1 has B staged, and would have its turn now (the
	// canary no longer has a reboot ahead), were it not for the halt. Watched for a while.
	var cl *v1alpha1.Cluster
	eventually(t, "the Cluster's rollout halted for vm-2's failure", func(ctx context.Context) error {
		var err error
		if cl, err = j.lc.Cluster(ctx); err != nil {
			return err
		}
		ro, c := cl.Status.Rollout, meta.FindStatusCondition(cl.Status.Conditions, v1alpha1.ClusterRolloutPaused)
		if ro == nil || ro.Halted == nil || !slices.Equal(ro.Halted.Machines, []string{"vm-2"}) || c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonHalted {
			return fmt.Errorf("not halted for vm-2: status.rollout %+v, RolloutPaused %+v", ro, c)
		}
		return nil
	})
	j.waitFleet(t, "vm-1", "release B staged, waiting", 5*time.Minute, func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeStaged && hasPending(m, "cluster.spec.version")
	})
	// Four of the coordinator's 5-second plans, besides the changes it sees (45 s until
	// December 2026).
	time.Sleep(watchHalt)
	if g := rec.at(rec.granted, "vm-1"); g.After(start) {
		t.Errorf("vm-1 was given a turn at %s, after the rollout of B began at %s: the halt did not hold it", g.Format(time.StampMilli), start.Format(time.StampMilli))
	}
	n, err := j.admin.CoreV1().Nodes().Get(ctx, "vm-1", metav1.GetOptions{})
	if err != nil || n.Spec.Unschedulable {
		t.Errorf("vm-1's Node after the halt: cordoned %v (%v)", n != nil && n.Spec.Unschedulable, err)
	}
	if c := strings.Count(vms["vm-1"].Console()[marks["vm-1"]:], "liken-init: reboot: "); c != 0 {
		t.Errorf("vm-1 rebooted %d times during B's halted rollout", c)
	}
	if m, err := j.lc.Machine(ctx, "vm-1"); err != nil || !running(m, "A", releaseA) {
		t.Errorf("vm-1 after the halt: %v, %+v", err, m.Status.Release)
	}
	if ev := j.eventsOf(t, "vm-2"); ev[v1alpha1.ReasonGateFailed] == 0 {
		t.Errorf("no %s Event for vm-2: %v", v1alpha1.ReasonGateFailed, ev)
	}
	report.Line("a release that breaks a workload (its DaemonSet's pod never Ready on B), under Auto with maxFailures 1 (two machines in QEMU, TCG): the canary vm-2 failed its gate (timeout %s) and was back on slot A %s later, %s after the version changed; the rollout halted with 1 machine touched, vm-1 never drained (watched %s after)",
		gateTimeout, back.Sub(failedAt).Round(time.Second), back.Sub(start).Round(time.Second), watchHalt)
}

// watchHalt is how long a halted rollout is watched for a turn it must not give.
const watchHalt = 20 * time.Second
