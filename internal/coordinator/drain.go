package coordinator

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"

	"liken.dev/liken/api/v1alpha1"
)

// drainOutcome is how one drain ended.
type drainOutcome struct {
	// drained: the Node holds no pod the drain must move (DaemonSet and mirror pods stay).
	drained bool
	// forced: pods still in place at the timeout were deleted, PDBs bypassed (drain.force).
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

// logWriter turns the drain helper's progress lines into log records.
type logWriter func(string)

func (w logWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w(l)
	}
	return len(b), nil
}

// drainNode evicts a cordoned Node's pods through the eviction API (so every
// PodDisruptionBudget is honoured) until none is left to move or deadline passes. It uses
// kubectl's drain package: DaemonSet and mirror pods are skipped, pods with emptyDir data or
// without a controller only move when the policy allows it. Evictions a PDB refuses are
// retried every retry. At the deadline, with drain.force, the pods left are deleted
// without eviction; without it, they are named.
func drainNode(ctx context.Context, kc kubernetes.Interface, node string, policy v1alpha1.DrainPolicy, deadline time.Time, retry time.Duration, logf func(string)) (drainOutcome, error) {
	h := &drain.Helper{
		Client:               kc,
		IgnoreAllDaemonSets:  true,
		DeleteEmptyDirData:   policy.DeleteEmptyDirData,
		Force:                policy.DeleteUnmanagedPods,
		GracePeriodSeconds:   -1, // each pod's own grace period
		EvictErrorRetryDelay: retry,
		Out:                  logWriter(logf),
		ErrOut:               logWriter(logf),
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	h.Ctx = dctx
	for {
		h.Timeout = time.Until(deadline)
		if h.Timeout <= 0 {
			break
		}
		list, errs := h.GetPodsForDeletion(node)
		if len(errs) == 0 {
			if err := h.DeleteOrEvictPods(list.Pods()); err == nil {
				return drainOutcome{drained: true}, nil
			} else {
				logf("drain not finished: " + err.Error())
			}
		} else {
			for _, e := range errs {
				logf("drain held back: " + e.Error())
			}
		}
		if ctx.Err() != nil {
			return drainOutcome{}, ctx.Err()
		}
		select {
		case <-dctx.Done():
		case <-time.After(retry):
		}
	}
	if ctx.Err() != nil {
		return drainOutcome{}, ctx.Err()
	}
	left, err := podsLeft(ctx, kc, node)
	if err != nil {
		return drainOutcome{}, err
	}
	if len(left) == 0 {
		return drainOutcome{drained: true}, nil
	}
	if policy.Force {
		var forced []string
		for _, p := range left {
			grace := int64(0)
			if err := kc.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
				return drainOutcome{}, fmt.Errorf("deleting pod %s/%s (drain.force): %w", p.Namespace, p.Name, err)
			}
			forced = append(forced, p.Namespace+"/"+p.Name)
		}
		return drainOutcome{drained: true, forced: forced}, nil
	}
	names, msg := blockers(ctx, kc, left, policy)
	return drainOutcome{blocking: names, message: msg}, nil
}

// podsLeft are the pods on node a drain must move: not DaemonSet or mirror pods, not
// finished, not already gone.
func podsLeft(ctx context.Context, kc kubernetes.Interface, node string) ([]corev1.Pod, error) {
	l, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("listing the pods on %s: %w", node, err)
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			continue
		}
		if c := metav1.GetControllerOf(&p); c != nil && c.Kind == "DaemonSet" {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// blockers names the pods left and why each stays: the PodDisruptionBudget that allows no
// disruption, or the drain policy that keeps it.
func blockers(ctx context.Context, kc kubernetes.Interface, pods []corev1.Pod, policy v1alpha1.DrainPolicy) ([]string, string) {
	var names, why []string
	for _, p := range pods {
		name := p.Namespace + "/" + p.Name
		names = append(names, name)
		var reasons []string
		if metav1.GetControllerOf(&p) == nil && !policy.DeleteUnmanagedPods {
			reasons = append(reasons, "no controller manages it (drain.deleteUnmanagedPods is off)")
		}
		for _, v := range p.Spec.Volumes {
			if v.EmptyDir != nil && !policy.DeleteEmptyDirData {
				reasons = append(reasons, "it uses emptyDir data (drain.deleteEmptyDirData is off)")
				break
			}
		}
		l, err := kc.PolicyV1().PodDisruptionBudgets(p.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, b := range l.Items {
				sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
				if err != nil || sel.Empty() || !sel.Matches(labels.Set(p.Labels)) {
					continue
				}
				reasons = append(reasons, fmt.Sprintf("PodDisruptionBudget %s/%s allows %d disruptions (%d healthy, %d needed)",
					b.Namespace, b.Name, b.Status.DisruptionsAllowed, b.Status.CurrentHealthy, b.Status.DesiredHealthy))
			}
		}
		if len(reasons) == 0 {
			reasons = append(reasons, "it did not terminate in time")
		}
		why = append(why, name+": "+strings.Join(reasons, "; "))
	}
	sort.Strings(names)
	sort.Strings(why)
	return names, "drain.timeout passed with pods in place: " + strings.Join(why, ". ")
}
