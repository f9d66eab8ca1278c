package coordinator

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
)

// gateResult is the pod template annotation that tells the test's kubelet how a gate's
// Job pod ends.
const gateResult = "test.liken.dev/result"

// nodeSide plays kube-scheduler and the kubelets for the pods in one namespace, on the
// host side of the test: it binds each unscheduled pod to the Ready, schedulable Node with
// the fewest of them, marks a bound pod Running and Ready once ready allows (a Job's pod
// Succeeded or Failed, as its template's gateResult says), and deletes a pod whose
// deletion was asked for, as a kubelet does once its containers stopped. The Deployment,
// ReplicaSet and Job controllers are kube-controller-manager's own.
type nodeSide struct {
	f     *fleetFixture
	ns    string
	ready atomic.Bool
}

func (f *fleetFixture) nodeSide(ns string) *nodeSide {
	s := &nodeSide{f: f, ns: ns}
	s.ready.Store(true)
	f.namespace(ns)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			s.step(ctx)
		}
	}()
	f.t.Cleanup(func() { cancel(); <-done })
	return s
}

// namespace makes ns and its default ServiceAccount: the ServiceAccount admission refuses a
// pod until the account exists, which the controller manager makes a moment after the
// namespace, later on a loaded machine.
func (f *fleetFixture) namespace(ns string) {
	f.t.Helper()
	ctx := f.t.Context()
	if _, err := f.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
	if _, err := f.admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		f.t.Fatal(err)
	}
}

func (s *nodeSide) step(ctx context.Context) {
	kc := s.f.admin
	pods, err := kc.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	nodes, err := kc.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	usable := map[string]bool{}
	for _, n := range nodes.Items {
		usable[n.Name] = kube.NodeReady(&n) && !n.Spec.Unschedulable && strings.HasPrefix(n.Name, s.ns)
	}
	count := map[string]int{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			count[p.Spec.NodeName]++
		}
	}
	for _, p := range pods.Items {
		switch {
		case p.DeletionTimestamp != nil:
			zero := int64(0)
			_ = kc.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		case p.Spec.NodeName == "":
			best := ""
			for n, ok := range usable {
				if ok && (best == "" || count[n] < count[best] || (count[n] == count[best] && n < best)) {
					best = n
				}
			}
			if best == "" {
				continue
			}
			if err := kc.CoreV1().Pods(p.Namespace).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
				Target: corev1.ObjectReference{Kind: "Node", Name: best}}, metav1.CreateOptions{}); err == nil {
				count[best]++
			}
		case (p.Status.Phase == corev1.PodPending || p.Status.Phase == "") && usable[p.Spec.NodeName]:
			if r, job := p.Annotations[gateResult]; job {
				p.Status.Phase = corev1.PodSucceeded
				if r == "fail" {
					p.Status.Phase = corev1.PodFailed
				}
				_, _ = kc.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, &p, metav1.UpdateOptions{})
				continue
			}
			if !s.ready.Load() {
				continue
			}
			now := metav1.Now()
			p.Status.Phase = corev1.PodRunning
			p.Status.StartTime = &now
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
			_, _ = kc.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, &p, metav1.UpdateOptions{})
		}
	}
}

func (f *fleetFixture) deployment(ns, name string, replicas int32) {
	f.t.Helper()
	labels := map[string]string{"app": name}
	if _, err := f.admin.AppsV1().Deployments(ns).Create(f.t.Context(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"tier": "web"}},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/web"}}}}},
	}, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// statefulSet makes a StatefulSet of replicas pods started together (Parallel), as a
// database's would be placed one per machine.
func (f *fleetFixture) statefulSet(ns, name string, replicas int32) {
	f.t.Helper()
	labels := map[string]string{"app": name}
	if _, err := f.admin.AppsV1().StatefulSets(ns).Create(f.t.Context(), &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels}, ServiceName: name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/db"}}}}},
	}, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleetFixture) statefulAvailable(ns, name string) int32 {
	s, err := f.admin.AppsV1().StatefulSets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return s.Status.AvailableReplicas
}

func (f *fleetFixture) available(ns, name string) int32 {
	d, err := f.admin.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return d.Status.AvailableReplicas
}

// TestWorkloadStates: what a gate reads of each kind's status. A workload is up to date only
// once its controller has seen the latest spec and runs it on every desired pod.
func TestWorkloadStates(t *testing.T) {
	three := int32(3)
	for _, c := range []struct {
		name string
		got  workload
		want workload
	}{
		{"Deployment, rolled out", deploymentState(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 2}, Spec: appsv1.DeploymentSpec{Replicas: &three},
			Status: appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 3, UpdatedReplicas: 3, AvailableReplicas: 3}}), workload{3, 3, true}},
		{"Deployment, spec not yet seen", deploymentState(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: appsv1.DeploymentSpec{Replicas: &three},
			Status: appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 3, UpdatedReplicas: 3, AvailableReplicas: 3}}), workload{3, 3, false}},
		{"Deployment, old pods left", deploymentState(&appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: &three},
			Status: appsv1.DeploymentStatus{Replicas: 4, UpdatedReplicas: 3, AvailableReplicas: 2}}), workload{3, 2, false}},
		{"Deployment, replicas defaulted to one", deploymentState(&appsv1.Deployment{Status: appsv1.DeploymentStatus{Replicas: 1, UpdatedReplicas: 1}}), workload{1, 0, true}},
		{"StatefulSet, rolled out", statefulSetState(&appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: &three},
			Status: appsv1.StatefulSetStatus{UpdatedReplicas: 3, AvailableReplicas: 3}}), workload{3, 3, true}},
		{"StatefulSet, a pod short of the update", statefulSetState(&appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: &three},
			Status: appsv1.StatefulSetStatus{UpdatedReplicas: 2, AvailableReplicas: 3}}), workload{3, 3, false}},
		{"DaemonSet, on every node", daemonSetState(&appsv1.DaemonSet{Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 4, UpdatedNumberScheduled: 4, NumberAvailable: 3}}), workload{4, 3, true}},
		{"DaemonSet, spec not yet seen", daemonSetState(&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: 5}, Status: appsv1.DaemonSetStatus{ObservedGeneration: 4, DesiredNumberScheduled: 4, UpdatedNumberScheduled: 4, NumberAvailable: 4}}), workload{4, 4, false}},
	} {
		if c.got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, c.got, c.want)
		}
	}
}

func turnOf(cl *v1alpha1.Cluster, machine string) *v1alpha1.Turn {
	for i := range cl.Status.Turns {
		if cl.Status.Turns[i].Machine == machine {
			return &cl.Status.Turns[i]
		}
	}
	return nil
}

// TestGatesWaitForTheWorkloads (issue 27 item 3): a machine back from its reboot and healthy
// by its own account keeps its turn until the Deployment that had a pod on it when its drain
// began is as available as it was then, and so does a gate selecting it by label; only then
// does the next machine get a turn. The Deployment's pods are made by the real Deployment
// controller; the test binds them and marks them Ready, and holds them back on purpose.
func TestGatesWaitForTheWorkloads(t *testing.T) {
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) {
		s.RebootPolicy = v1alpha1.RebootAuto
		s.Rollout = &v1alpha1.Rollout{Gates: []v1alpha1.RolloutGate{{Name: "web-tier",
			Workloads: &v1alpha1.WorkloadsGate{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}}}}}
	}, machines("wg", 2, v1alpha1.RoleAgent))
	side := f.nodeSide("wg")
	f.deployment("wg", "web", 2)
	f.waitFor("web's two pods available, one on each machine", 60*time.Second, func() bool { return f.available("wg", "web") == 2 })
	f.statefulSet("wg", "db", 2)
	f.waitFor("db's two pods available, one on each machine", 60*time.Second, func() bool { return f.statefulAvailable("wg", "db") == 2 })
	agents := f.agents(time.Second, f.names...)
	events := &reasons{}
	f.coordinatorWith("srv-wg", true, func(c *Config) { c.Events = events })

	// From here, pods made again are not Ready until the test says so.
	side.ready.Store(false)
	agents["wg1"].ask()
	f.waitFor("wg1 back from its reboot, healthy by its own account", 60*time.Second, func() bool {
		m, err := f.liken.Machine(context.Background(), "wg1")
		return err == nil && agents["wg1"].reboots.Load() == 1 && m.Status.Reboot.State == v1alpha1.RebootNone
	})
	agents["wg2"].ask()
	var turn *v1alpha1.Turn
	f.waitFor("wg1's gates checking", 30*time.Second, func() bool {
		turn = turnOf(f.cluster(), "wg1")
		return turn != nil && turn.Gates != nil && turn.Gates.Phase == v1alpha1.GateChecking
	})
	want := []v1alpha1.TurnWorkload{{Kind: KindDeployment, Namespace: "wg", Name: "web", Available: 2}, {Kind: KindStatefulSet, Namespace: "wg", Name: "db", Available: 2}}
	if !slices.Equal(turn.Workloads, want) {
		t.Errorf("the turn recorded the workloads %+v; want %+v", turn.Workloads, want)
	}
	for _, w := range []string{"Deployment wg/web has 1 of 2 pods available", "StatefulSet wg/db has 1 of 2 pods available", "gate web-tier"} {
		if !strings.Contains(turn.Gates.Message, w) {
			t.Errorf("the gates wait for %q; want %q in it", turn.Gates.Message, w)
		}
	}
	// Held: the machine says it is done, yet its turn stays and nobody else gets one.
	time.Sleep(3 * time.Second)
	cl := f.cluster()
	if turnOf(cl, "wg1") == nil || turnOf(cl, "wg2") != nil || agents["wg2"].reboots.Load() != 0 {
		t.Fatalf("with web short of a pod, the turns are %+v; want wg1's kept and none for wg2", cl.Status.Turns)
	}
	if w := cl.Status.Waiting; len(w) != 1 || w[0].Machine != "wg2" {
		t.Errorf("waiting %+v; want wg2", w)
	}
	passedAt := time.Now()
	side.ready.Store(true)
	f.waitFor("wg1's turn given back once web is whole", 30*time.Second, func() bool { return turnOf(f.cluster(), "wg1") == nil })
	f.waitFor("wg2 rebooted after", 60*time.Second, func() bool {
		return agents["wg2"].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	if !events.has("GatesPassed") {
		t.Errorf("no GatesPassed Event")
	}
	t.Logf("the turn was given back %s after web's pods could be ready", time.Since(passedAt).Round(time.Millisecond))
}

// TestJobGateFailureHalts (issue 27 items 2 and 3): a gate that runs a Job from a suspended
// CronJob's template, once per turn: its failure fails the machine's gates, gives the turn
// back, is recorded in the Cluster's status and, at maxFailures 1, halts the rollout with
// the other machine untouched; resumed with a template that succeeds, the next machine
// passes.
func TestJobGateFailureHalts(t *testing.T) {
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) {
		s.RebootPolicy = v1alpha1.RebootAuto
		s.Rollout = &v1alpha1.Rollout{Gates: []v1alpha1.RolloutGate{{Name: "smoke", Job: &v1alpha1.JobGate{Namespace: "jg", CronJob: "smoke"}}}}
	}, machines("jg", 2, v1alpha1.RoleAgent))
	f.nodeSide("jg")
	suspend, none := true, int32(0)
	cronJob := func(result string) *batchv1.CronJob {
		return &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "smoke", Namespace: "jg"}, Spec: batchv1.CronJobSpec{
			Schedule: "0 0 * * *", Suspend: &suspend,
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{BackoffLimit: &none, Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{gateResult: result}},
				Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "check", Image: "registry.invalid/check"}}}}}}}}
	}
	if _, err := f.admin.BatchV1().CronJobs("jg").Create(t.Context(), cronJob("fail"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seen := f.watchTurns()
	agents := f.agents(time.Second, f.names...)
	events := &reasons{}
	metrics := f.coordinatorWith("srv-jg", true, func(c *Config) { c.Events = events })
	for _, a := range agents {
		a.ask()
	}
	f.waitFor("the rollout halted by the failed gate", 90*time.Second, func() bool {
		st := f.cluster().Status
		return st.Rollout != nil && st.Rollout.Halted != nil && len(st.Turns) == 0
	})
	st := f.cluster().Status
	failed := st.Rollout.Halted.Machines[0]
	other := map[string]string{"jg1": "jg2", "jg2": "jg1"}[failed]
	if gf := st.Rollout.GateFailures; len(gf) != 1 || gf[0].Machine != failed || gf[0].Key != GateFailureKey+"smoke" || gf[0].Reason != v1alpha1.ReasonGateFailed ||
		!strings.Contains(gf[0].Message, "gate smoke failed: Job jg/liken-gate-smoke-"+failed+"-") {
		t.Errorf("gate failures %+v; want %s's smoke gate", gf, failed)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ClusterRolloutPaused); c == nil || c.Reason != v1alpha1.ReasonHalted || !strings.Contains(c.Message, "gate smoke") {
		t.Errorf("RolloutPaused %+v; want Halted naming the gate", c)
	}
	jobs, err := f.admin.BatchV1().Jobs("jg").List(t.Context(), metav1.ListOptions{LabelSelector: GateJobGateLabel + "=smoke," + GateJobMachineLabel + "=" + failed})
	if err != nil || len(jobs.Items) != 1 || jobs.Items[0].Spec.TTLSecondsAfterFinished == nil || jobs.Items[0].OwnerReferences[0].Name != "smoke" {
		t.Fatalf("the gate's Jobs for %s: %+v, %v; want one, owned by the CronJob, with a TTL", failed, jobs, err)
	}
	time.Sleep(3 * time.Second)
	for _, holders := range seen() {
		for _, h := range holders {
			if h != failed {
				t.Fatalf("%s was given a turn after %s's gate failed", h, failed)
			}
		}
	}
	if agents[other].reboots.Load() != 0 {
		t.Fatalf("%s rebooted after the halt", other)
	}
	if !events.has(v1alpha1.ReasonGateFailed) || !events.has("RolloutHalted") {
		t.Errorf("Events %v; want GateFailed and RolloutHalted", events.seen)
	}
	if n := testutil.ToFloat64(metrics.GateFailures); n != 1 {
		t.Errorf("liken_coordinator_gate_failures_total = %v, want 1", n)
	}

	// The operator fixes the check and resumes: the other machine goes, and its Job passes.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cj, err := f.admin.BatchV1().CronJobs("jg").Get(t.Context(), "smoke", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cj.Spec.JobTemplate = cronJob("pass").Spec.JobTemplate
		_, err = f.admin.BatchV1().CronJobs("jg").Update(t.Context(), cj, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := f.cluster()
		now := metav1.NewTime(time.Now().UTC().Truncate(time.Second).Add(time.Second))
		cl.Spec.Rollout.ResumedAt = &now
		_, err := f.liken.UpdateCluster(t.Context(), cl)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.waitFor(other+" rebooted and passed its gate", 90*time.Second, func() bool {
		return agents[other].reboots.Load() == 1 && len(f.cluster().Status.Turns) == 0
	})
	if st := f.cluster().Status; st.Rollout.Halted != nil {
		t.Errorf("halted again: %+v", st.Rollout.Halted)
	}
	if !events.has("GatesPassed") {
		t.Errorf("no GatesPassed Event for %s", other)
	}
}
