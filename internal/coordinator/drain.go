package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
)

// drainOutcome is how one drain ended.
type drainOutcome struct {
	// drained: the Node holds no pod the drain must move (DaemonSet and mirror pods stay;
	// on a Node that is not Ready, pods already being deleted do not count).
	drained bool
	// forced: pods the policy lets go that were still in place at the timeout, deleted
	// with PDBs bypassed (drain.force).
	forced []string
	// blocking are the pods still in place when the timeout passed, and why.
	blocking []string
	message  string
}

// drainTimeout is the Cluster's drain.timeout (10 minutes when unset).
func drainTimeout(p v1alpha1.DrainPolicy) time.Duration {
	if p.Timeout == nil || p.Timeout.Duration <= 0 {
		return 10 * time.Minute
	}
	return p.Timeout.Duration
}

// drainNode evicts a cordoned Node's pods through the eviction API (so every
// PodDisruptionBudget is honoured) until none is left to move or deadline passes. kubectl's
// drain package decides which pods move: DaemonSet and mirror pods stay, pods with
// emptyDir data or without a controller move only when the policy allows it. Every pod it
// allows is evicted at once, even while it refuses others; evictions a PDB refuses are asked
// again every retry. At the deadline, with drain.force and nothing refused, the pods left
// are deleted without eviction; otherwise they are named, with why each stays.
func drainNode(ctx context.Context, kc kubernetes.Interface, node string, policy v1alpha1.DrainPolicy, deadline time.Time, retry time.Duration, logf func(string)) (drainOutcome, error) {
	d := &drainer{kc: kc, node: node, policy: policy, retry: retry, logf: logf,
		asked: map[string]time.Time{}, told: map[string]bool{},
		h: &drain.Helper{
			Ctx:                 ctx,
			Client:              kc,
			IgnoreAllDaemonSets: true,
			DeleteEmptyDirData:  policy.DeleteEmptyDirData,
			Force:               policy.DeleteUnmanagedPods,
			GracePeriodSeconds:  -1, // each pod's own grace period
		}}
	// A pod that went is seen within a second, while a PDB's refusal is asked again only
	// every retry (asked): the eviction API is not hammered for an answer that will not
	// change sooner.
	poll := min(retry, time.Second)
	for {
		// A drain resumed after its deadline (a new leader) evicts nothing: it goes
		// straight to the outcome.
		final := !time.Now().Before(deadline)
		r, err := d.look(ctx, !final)
		if err != nil {
			return drainOutcome{}, err
		}
		if len(r.moving) == 0 && len(r.refused) == 0 {
			return drainOutcome{drained: true}, nil
		}
		if final {
			return d.outcome(ctx, r)
		}
		select {
		case <-ctx.Done():
			return drainOutcome{}, ctx.Err()
		case <-time.After(min(poll, time.Until(deadline))):
		}
	}
}

// drainer is one drain of one Node.
type drainer struct {
	kc     kubernetes.Interface
	h      *drain.Helper
	node   string
	policy v1alpha1.DrainPolicy
	retry  time.Duration
	logf   func(string)
	// asked is when each pod's eviction was last asked for.
	asked map[string]time.Time
	// told are the refusals already logged: asked again every retry, a PDB's would fill
	// the log with one line.
	told map[string]bool
}

func (d *drainer) tell(s string) {
	if !d.told[s] {
		d.told[s] = true
		d.logf(s)
	}
}

// remaining is what one look at the Node found still on it.
type remaining struct {
	// moving are the pods the policy lets go that are still there: terminating, or their
	// eviction refused (a PDB).
	moving []corev1.Pod
	// refused are the pods the drain library will not move under the policy, with its
	// reasons.
	refused []refusal
}

type refusal struct {
	pod corev1.Pod
	// why is the drain library's own words.
	why []string
}

func podKey(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// look evicts the pods the drain library allows that are due, when evict, and says what is
// left.
func (d *drainer) look(ctx context.Context, evict bool) (remaining, error) {
	n, err := d.kc.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
	if err != nil {
		return remaining{}, fmt.Errorf("reading Node %s: %w", d.node, err)
	}
	// A Node that is not Ready may have no kubelet to finish a deletion: its pods being
	// deleted would stay Terminating until the timeout, every time, and its approved
	// reboot would never happen. Their deletion was accepted already (a PDB counted it when
	// they were evicted), so they are not waited for, as Cluster API does for unreachable
	// Nodes; the reboot stops whatever still runs.
	ready := kube.NodeReady(n)
	leaving := func(p *corev1.Pod) bool { return !ready && p.DeletionTimestamp != nil }
	list, errs := d.h.GetPodsForDeletion(d.node)
	if list == nil {
		return remaining{}, fmt.Errorf("listing the pods to drain on %s: %w", d.node, errors.Join(errs...))
	}
	var l remaining
	budgets := map[string]func(*corev1.Pod) string{} // by namespace, read once per look
	for _, p := range list.Pods() {
		key := podKey(&p)
		if evict && p.DeletionTimestamp == nil && time.Since(d.asked[key]) >= d.retry {
			d.asked[key] = time.Now()
			lags, ok := budgets[p.Namespace]
			if !ok {
				lags = d.budgets(ctx, p.Namespace)
				budgets[p.Namespace] = lags
			}
			if why := lags(&p); why != "" {
				d.tell(fmt.Sprintf("%s%s yet: %s", notEvictingYet, key, why))
				l.moving = append(l.moving, p)
				continue
			}
			switch err := d.h.EvictPod(p, policyv1.SchemeGroupVersion); {
			case err == nil:
				d.logf("evicted " + key)
				delete(budgets, p.Namespace) // read again for the next: this one is going
				// Accepted: it is being deleted now, though this copy does not say so.
				now := metav1.Now()
				p.DeletionTimestamp = &now
			case apierrors.IsNotFound(err):
				continue
			default:
				d.tell(fmt.Sprintf("evicting %s: %v", key, err))
			}
		}
		// A finished pod holds no workload: it is evicted with the rest, never waited for.
		if leaving(&p) || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		l.moving = append(l.moving, p)
	}
	refused, err := refusals(errs)
	if err != nil {
		return remaining{}, fmt.Errorf("reading the drain's refusals on %s: %w", d.node, err)
	}
	if len(refused) == 0 {
		return l, nil
	}
	for _, e := range errs {
		d.tell("drain held back: " + e.Error())
	}
	// The library names the pods it refuses, not their state: read them to see which are
	// being deleted.
	pods, err := d.kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + d.node})
	if err != nil {
		return remaining{}, fmt.Errorf("listing the pods on %s: %w", d.node, err)
	}
	for _, p := range pods.Items {
		if why, ok := refused[podKey(&p)]; ok && !leaving(&p) {
			l.refused = append(l.refused, refusal{pod: p, why: why})
		}
	}
	return l, nil
}

// notEvictingYet begins the drain's line for a pod held back for its budget's lagging status.
const notEvictingYet = "not evicting "

// budgets reads a namespace's PodDisruptionBudgets and pods, and returns budgetLags over
// them; if they cannot be read, the eviction API's own check stands alone.
func (d *drainer) budgets(ctx context.Context, ns string) func(*corev1.Pod) string {
	pdbs, err := d.kc.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pdbs.Items) == 0 {
		return func(*corev1.Pod) string { return "" }
	}
	pods, err := d.kc.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return func(*corev1.Pod) string { return "" }
	}
	return func(p *corev1.Pod) string { return budgetLags(pdbs.Items, pods.Items, p) }
}

// refusals are the pods the drain library refused, by namespace/name, with its reasons. It
// reports them as one error per reason, "cannot delete REASON: ns/a, ns/b" (pod names
// hold neither a colon nor a space).
func refusals(errs []error) (map[string][]string, error) {
	out := map[string][]string{}
	for _, e := range errs {
		s := strings.TrimPrefix(e.Error(), "cannot delete ")
		i := strings.LastIndex(s, ": ")
		if i < 0 {
			return nil, e
		}
		for _, name := range strings.Split(s[i+2:], ", ") {
			out[name] = append(out[name], s[:i])
		}
	}
	return out, nil
}

// outcome is the drain's end at its deadline, with pods still in place. drain.force
// covers what the policy lets go (the pods a PDB holds or that did not terminate): it
// deletes them only when nothing else is left, since deleting past a PDB is worth it only
// for the reboot it lets through. What the policy keeps (emptyDir data, no controller) is
// never deleted: its own settings say when it may go.
func (d *drainer) outcome(ctx context.Context, l remaining) (drainOutcome, error) {
	if d.policy.Force && len(l.refused) == 0 {
		var forced []string
		for _, p := range l.moving {
			grace := int64(0)
			// The UID: a pod of the same name made since (a StatefulSet's) is not this one.
			err := d.kc.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return drainOutcome{}, fmt.Errorf("deleting pod %s (drain.force): %w", podKey(&p), err)
			}
			forced = append(forced, podKey(&p))
		}
		sort.Strings(forced)
		return drainOutcome{drained: true, forced: forced}, nil
	}
	var names, why []string
	for _, r := range l.refused {
		names = append(names, podKey(&r.pod))
		why = append(why, podKey(&r.pod)+": the drain may not move it: "+strings.Join(d.kept(&r.pod, r.why), "; "))
	}
	for _, p := range l.moving {
		names = append(names, podKey(&p))
		reasons := held(ctx, d.kc, &p)
		if p.DeletionTimestamp == nil {
			// Held back by liken, not by the eviction API: the budget's status lags.
			if lag := d.budgets(ctx, p.Namespace)(&p); lag != "" {
				reasons = []string{lag}
			}
		}
		why = append(why, podKey(&p)+": "+strings.Join(reasons, "; "))
	}
	sort.Strings(names)
	sort.Strings(why)
	msg := "drain.timeout passed with pods in place: " + strings.Join(why, ". ")
	if d.policy.Force && len(l.moving) > 0 {
		msg += "; drain.force deleted nothing: the pods the drain may not move keep the machine from rebooting anyway"
	}
	return drainOutcome{blocking: names, message: msg}, nil
}

// kept says why the policy keeps p, in the policy's own terms where they apply (both, when
// both do: the library stops at the first), else in the drain library's words.
func (d *drainer) kept(p *corev1.Pod, library []string) []string {
	var why []string
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir != nil && !d.policy.DeleteEmptyDirData {
			why = append(why, "it uses emptyDir data (drain.deleteEmptyDirData is off)")
			break
		}
	}
	if metav1.GetControllerOf(p) == nil && !d.policy.DeleteUnmanagedPods {
		why = append(why, "no controller manages it (drain.deleteUnmanagedPods is off)")
	}
	if len(why) == 0 {
		return library
	}
	return why
}

// held says why a pod the policy lets go is still there: the PodDisruptionBudgets that
// allow no disruption, or its slow termination.
func held(ctx context.Context, kc kubernetes.Interface, p *corev1.Pod) []string {
	var why []string
	if l, err := kc.PolicyV1().PodDisruptionBudgets(p.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, b := range l.Items {
			sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
			if err != nil || sel.Empty() || !sel.Matches(labels.Set(p.Labels)) {
				continue
			}
			why = append(why, fmt.Sprintf("PodDisruptionBudget %s/%s allows %d disruptions (%d healthy, %d needed)",
				b.Namespace, b.Name, b.Status.DisruptionsAllowed, b.Status.CurrentHealthy, b.Status.DesiredHealthy))
		}
	}
	if len(why) == 0 {
		why = append(why, "it did not terminate in time")
	}
	return why
}
