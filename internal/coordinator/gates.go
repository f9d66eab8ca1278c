package coordinator

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
)

// WorkloadsGate is the name of the built-in gate: the workloads that had pods on a machine
// when its drain began are as available as they were.
const WorkloadsGate = "workloads"

// Labels and annotations of a gate's Job, so that the Job's pods can tell which machine
// they check (the downward API reads annotations) and an operator can find them.
const (
	GateJobMachineLabel = "liken.dev/gate-machine"
	GateJobGateLabel    = "liken.dev/gate"
	// gateJobTTL cleans up a gate's finished Job after an hour, when its template sets no
	// ttlSecondsAfterFinished.
	gateJobTTL = int32(3600)
)

// Kinds of the workloads a gate waits for.
const (
	KindDeployment  = "Deployment"
	KindStatefulSet = "StatefulSet"
	KindDaemonSet   = "DaemonSet"
)

// workloadsOn lists the Deployments, StatefulSets and DaemonSets with pods on the node, with
// how many of their pods are available now: what the machine's gates wait for after its
// reboot. Pods owned by anything else (bare pods, Jobs) are not waited for: nothing brings
// them back.
func workloadsOn(ctx context.Context, kc kubernetes.Interface, node string) ([]v1alpha1.TurnWorkload, error) {
	pods, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, fmt.Errorf("listing the pods on %s: %w", node, err)
	}
	type key struct{ kind, ns, name string }
	seen := map[key]bool{}
	var out []v1alpha1.TurnWorkload
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ref := metav1.GetControllerOf(&p)
		if ref == nil {
			continue
		}
		k := key{ref.Kind, p.Namespace, ref.Name}
		switch ref.Kind {
		case "ReplicaSet":
			rs, err := kc.AppsV1().ReplicaSets(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("reading ReplicaSet %s/%s: %w", p.Namespace, ref.Name, err)
			}
			owner := metav1.GetControllerOf(rs)
			if owner == nil || owner.Kind != KindDeployment {
				continue // a ReplicaSet of its own: nothing rolls it back into shape
			}
			k = key{KindDeployment, p.Namespace, owner.Name}
		case KindStatefulSet, KindDaemonSet:
		default:
			continue
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		w := v1alpha1.TurnWorkload{Kind: k.kind, Namespace: k.ns, Name: k.name}
		st, err := workloadState(ctx, kc, w)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		w.Available = st.available
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.Name < b.Name
	})
	return out, nil
}

// workload is what a gate reads of a workload's status.
type workload struct {
	// desired and available pods; upToDate: the controller has seen the latest spec and
	// every desired pod runs it.
	desired, available int32
	upToDate           bool
}

func workloadState(ctx context.Context, kc kubernetes.Interface, w v1alpha1.TurnWorkload) (workload, error) {
	switch w.Kind {
	case KindDeployment:
		d, err := kc.AppsV1().Deployments(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return workload{}, err
		}
		return deploymentState(d), nil
	case KindStatefulSet:
		s, err := kc.AppsV1().StatefulSets(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return workload{}, err
		}
		return statefulSetState(s), nil
	case KindDaemonSet:
		d, err := kc.AppsV1().DaemonSets(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return workload{}, err
		}
		return daemonSetState(d), nil
	}
	return workload{}, fmt.Errorf("a workload of kind %q", w.Kind)
}

func deploymentState(d *appsv1.Deployment) workload {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	return workload{desired: want, available: s.AvailableReplicas,
		upToDate: s.ObservedGeneration >= d.Generation && s.UpdatedReplicas >= want && s.Replicas == s.UpdatedReplicas}
}

func statefulSetState(ss *appsv1.StatefulSet) workload {
	want := int32(1)
	if ss.Spec.Replicas != nil {
		want = *ss.Spec.Replicas
	}
	s := ss.Status
	return workload{desired: want, available: s.AvailableReplicas,
		upToDate: s.ObservedGeneration >= ss.Generation && s.UpdatedReplicas >= want}
}

func daemonSetState(d *appsv1.DaemonSet) workload {
	s := d.Status
	return workload{desired: s.DesiredNumberScheduled, available: s.NumberAvailable,
		upToDate: s.ObservedGeneration >= d.Generation && s.UpdatedNumberScheduled >= s.DesiredNumberScheduled}
}

// describe names a workload for messages.
func describe(w v1alpha1.TurnWorkload) string {
	return fmt.Sprintf("%s %s/%s", w.Kind, w.Namespace, w.Name)
}

// gateCheck is one look at a machine's gates: passed, failed (for good), or what is still
// waited for.
type gateCheck struct {
	passed, failed bool
	gate, message  string
}

// gateChecker reads the API for the gates of a machine that is back from its reboot.
type gateChecker struct {
	kc  kubernetes.Interface
	now time.Time
}

// check looks at every gate of the turn in order: the workloads that ran on the machine,
// then spec.rollout.gates. since is when the machine was first seen back; each gate's
// timeout counts from it.
func (g gateChecker) check(ctx context.Context, r *v1alpha1.Rollout, t v1alpha1.Turn, since time.Time) (gateCheck, error) {
	elapsed := g.now.Sub(since)
	var waits []string
	first := ""
	wait := func(gate, why string) {
		if first == "" {
			first = gate
		}
		waits = append(waits, why)
	}
	// The workloads that ran here before the drain.
	var behind []string
	for _, w := range t.Workloads {
		st, err := workloadState(ctx, g.kc, w)
		if apierrors.IsNotFound(err) {
			continue // deleted since: nothing to wait for
		}
		if err != nil {
			return gateCheck{}, fmt.Errorf("reading %s: %w", describe(w), err)
		}
		if need := min(w.Available, st.desired); st.available < need {
			behind = append(behind, fmt.Sprintf("%s has %d of %d pods available", describe(w), st.available, need))
		}
	}
	if len(behind) > 0 {
		why := "the workloads that ran on it before its drain are not back: " + strings.Join(behind, ", ")
		if limit := r.WorkloadsWait(); elapsed > limit {
			return gateCheck{failed: true, gate: WorkloadsGate, message: fmt.Sprintf("%s, %s after it was back (spec.rollout.workloadsTimeout %s)", why, elapsed.Round(time.Second), limit)}, nil
		}
		wait(WorkloadsGate, why)
	}
	if r != nil {
		for _, gate := range r.Gates {
			ok, failed, why, err := g.one(ctx, gate, t)
			if err != nil {
				return gateCheck{}, fmt.Errorf("gate %s: %w", gate.Name, err)
			}
			if failed {
				return gateCheck{failed: true, gate: gate.Name, message: fmt.Sprintf("gate %s failed: %s", gate.Name, why)}, nil
			}
			if ok {
				continue
			}
			if elapsed > gate.Wait() {
				return gateCheck{failed: true, gate: gate.Name, message: fmt.Sprintf("gate %s did not pass within its timeout of %s: %s", gate.Name, gate.Wait(), why)}, nil
			}
			wait(gate.Name, "gate "+gate.Name+": "+why)
		}
	}
	if len(waits) > 0 {
		return gateCheck{gate: first, message: strings.Join(waits, "; ")}, nil
	}
	return gateCheck{passed: true, message: "every gate passed"}, nil
}

// one looks at one of spec.rollout.gates: passed, failed for good, or why not yet.
func (g gateChecker) one(ctx context.Context, gate v1alpha1.RolloutGate, t v1alpha1.Turn) (ok, failed bool, why string, err error) {
	switch {
	case gate.Workloads != nil:
		return g.workloads(ctx, gate.Workloads)
	case gate.Job != nil:
		return g.job(ctx, gate, t)
	}
	return false, true, "it names neither workloads nor a job", nil
}

// workloads: every Deployment, StatefulSet and DaemonSet the selector picks is Available
// with its latest spec.
func (g gateChecker) workloads(ctx context.Context, w *v1alpha1.WorkloadsGate) (ok, failed bool, why string, err error) {
	sel, err := metav1.LabelSelectorAsSelector(&w.Selector)
	if err != nil {
		return false, true, "its selector: " + err.Error(), nil
	}
	opts := metav1.ListOptions{LabelSelector: sel.String()}
	var behind []string
	note := func(kind string, obj metav1.Object, st workload) {
		if st.available < st.desired || !st.upToDate {
			behind = append(behind, fmt.Sprintf("%s %s/%s has %d of %d pods available%s", kind, obj.GetNamespace(), obj.GetName(), st.available, st.desired,
				map[bool]string{true: "", false: ", not all of them up to date"}[st.upToDate]))
		}
	}
	ds, err := g.kc.AppsV1().Deployments(w.Namespace).List(ctx, opts)
	if err != nil {
		return false, false, "", fmt.Errorf("listing Deployments: %w", err)
	}
	for i := range ds.Items {
		note(KindDeployment, &ds.Items[i], deploymentState(&ds.Items[i]))
	}
	ss, err := g.kc.AppsV1().StatefulSets(w.Namespace).List(ctx, opts)
	if err != nil {
		return false, false, "", fmt.Errorf("listing StatefulSets: %w", err)
	}
	for i := range ss.Items {
		note(KindStatefulSet, &ss.Items[i], statefulSetState(&ss.Items[i]))
	}
	dss, err := g.kc.AppsV1().DaemonSets(w.Namespace).List(ctx, opts)
	if err != nil {
		return false, false, "", fmt.Errorf("listing DaemonSets: %w", err)
	}
	for i := range dss.Items {
		note(KindDaemonSet, &dss.Items[i], daemonSetState(&dss.Items[i]))
	}
	if len(behind) > 0 {
		sort.Strings(behind)
		return false, false, strings.Join(behind, ", "), nil
	}
	return true, false, "", nil
}

// GateJobName is the Job a gate runs for a turn: one per gate, machine and turn, so a new
// leader finds the Job its predecessor made instead of running it twice.
func GateJobName(gate, machine string, since metav1.Time) string {
	name := fmt.Sprintf("liken-gate-%s-%s", gate, machine)
	suffix := "-" + strconv.FormatInt(since.Unix(), 36)
	if len(name)+len(suffix) > 63 {
		name = strings.TrimRight(name[:63-len(suffix)], "-.")
	}
	return name + suffix
}

// job: the gate's Job for this turn, made from its CronJob's template the first time,
// has succeeded (or failed).
func (g gateChecker) job(ctx context.Context, gate v1alpha1.RolloutGate, t v1alpha1.Turn) (ok, failed bool, why string, err error) {
	jg := gate.Job
	name := GateJobName(gate.Name, t.Machine, t.Since)
	jobs := g.kc.BatchV1().Jobs(jg.Namespace)
	j, err := jobs.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cj, err := g.kc.BatchV1().CronJobs(jg.Namespace).Get(ctx, jg.CronJob, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, false, fmt.Sprintf("its CronJob %s/%s does not exist", jg.Namespace, jg.CronJob), nil
		}
		if err != nil {
			return false, false, "", fmt.Errorf("reading CronJob %s/%s: %w", jg.Namespace, jg.CronJob, err)
		}
		j = gateJob(cj, name, gate.Name, t.Machine)
		if j, err = jobs.Create(ctx, j, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			return false, false, "its Job " + name + " was just made", nil
		} else if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			return false, true, fmt.Sprintf("its Job could not be made from CronJob %s/%s: %v", jg.Namespace, jg.CronJob, err), nil
		} else if err != nil {
			return false, false, "", fmt.Errorf("making Job %s/%s: %w", jg.Namespace, name, err)
		}
	} else if err != nil {
		return false, false, "", fmt.Errorf("reading Job %s/%s: %w", jg.Namespace, name, err)
	}
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, false, "", nil
		case batchv1.JobFailed:
			return false, true, fmt.Sprintf("Job %s/%s failed (%s: %s)", jg.Namespace, name, c.Reason, c.Message), nil
		}
	}
	return false, false, fmt.Sprintf("Job %s/%s has not succeeded yet (%d active, %d failed)", jg.Namespace, name, j.Status.Active, j.Status.Failed), nil
}

// gateJob is the Job a gate runs, from its CronJob's template, labelled and annotated with
// the gate and the machine.
func gateJob(cj *batchv1.CronJob, name, gate, machine string) *batchv1.Job {
	tmpl := cj.Spec.JobTemplate.DeepCopy()
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cj.Namespace, Labels: tmpl.Labels, Annotations: tmpl.Annotations},
		Spec:       tmpl.Spec,
	}
	set := func(m map[string]string, k, v string) map[string]string {
		if m == nil {
			m = map[string]string{}
		}
		m[k] = v
		return m
	}
	j.Labels = set(set(j.Labels, GateJobGateLabel, gate), GateJobMachineLabel, machine)
	j.Annotations = set(j.Annotations, GateJobMachineLabel, machine)
	j.Spec.Template.Annotations = set(j.Spec.Template.Annotations, GateJobMachineLabel, machine)
	if j.Spec.TTLSecondsAfterFinished == nil {
		ttl := gateJobTTL
		j.Spec.TTLSecondsAfterFinished = &ttl
	}
	// Owned by the CronJob, as the CronJob controller's own Jobs are: deleting the template
	// deletes its gate runs.
	ctrl := true
	j.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "CronJob", Name: cj.Name, UID: cj.UID, Controller: &ctrl}}
	return j
}

// back: the machine holding a drained turn has come back from its reboot: its Node is Ready
// on another boot than the one the turn was given on, and its agent reports it back
// (verifying its own health, or done). Only then can its workloads come back.
func back(t v1alpha1.Turn, m *v1alpha1.Machine, n *corev1.Node) bool {
	if t.Phase != v1alpha1.TurnDrained || m == nil || n == nil || !kube.NodeReady(n) {
		return false
	}
	if t.BootID != "" && n.Status.NodeInfo.BootID == t.BootID {
		return false
	}
	st := m.Status.Reboot.State
	return st == v1alpha1.RebootVerifying || st == v1alpha1.RebootNone
}

// GateKey names the turn a gate check is for (Fleet.Gates): its machine and when it was
// given, so a check made for one turn never lands on the machine's next.
func GateKey(t v1alpha1.Turn) string { return t.Machine + "@" + t.Since.UTC().Format(time.RFC3339) }

// Gates looks at the gates of every machine back from its reboot on a drained turn: what
// the plan records in the turn. since is when each check began (the turn's record, or now).
func (g gateChecker) Gates(ctx context.Context, f Fleet) (map[string]v1alpha1.TurnGates, error) {
	out := map[string]v1alpha1.TurnGates{}
	byName := map[string]*v1alpha1.Machine{}
	for i := range f.Machines {
		byName[f.Machines[i].Name] = &f.Machines[i]
	}
	for _, t := range f.Cluster.Status.Turns {
		n := f.Nodes[t.Machine]
		if !back(t, byName[t.Machine], n) {
			continue
		}
		boot := n.Status.NodeInfo.BootID
		since := metav1.NewTime(g.now.UTC().Truncate(time.Second))
		if t.Gates != nil && t.Gates.BootID == boot {
			if t.Gates.Phase != v1alpha1.GateChecking {
				out[GateKey(t)] = *t.Gates // a verdict stands for the boot it was made on
				continue
			}
			since = t.Gates.Since
		}
		c, err := g.check(ctx, f.Cluster.Spec.Rollout, t, since.Time)
		if err != nil {
			return nil, fmt.Errorf("checking %s's gates: %w", t.Machine, err)
		}
		tg := v1alpha1.TurnGates{Phase: v1alpha1.GateChecking, BootID: boot, Since: since, Gate: c.gate, Message: c.message}
		switch {
		case c.passed:
			tg.Phase = v1alpha1.GatePassed
		case c.failed:
			tg.Phase = v1alpha1.GateFailed
		}
		out[GateKey(t)] = tg
	}
	return out, nil
}
