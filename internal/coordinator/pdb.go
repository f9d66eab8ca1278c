package coordinator

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"liken.dev/liken/internal/kube"
)

// budgetLags says which PodDisruptionBudget covering p has a status that allows a
// disruption that the pods it covers, as they are now, do not: its disruption controller
// has not caught up with a pod that went unready, and the eviction API, which reads only the
// status, would let p go below the budget. "" when none. Seen in the lab (December 2026):
// a starved machine's readiness probe failed, and 27 s later an eviction still took the
// other machine's last ready pod, the budget's status unchanged. pdbs and pods are those of
// p's namespace.
func budgetLags(pdbs []policyv1.PodDisruptionBudget, pods []corev1.Pod, p *corev1.Pod) string {
	if !podHealthy(p) {
		// Its eviction takes no ready pod away (a finished one, say): the eviction API's own
		// rule for unhealthy pods stands.
		return ""
	}
	for _, b := range pdbs {
		if b.Status.DisruptionsAllowed <= 0 {
			continue // the eviction API refuses it anyway
		}
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		covered, healthy := 0, 0
		for i := range pods {
			if sel.Matches(labels.Set(pods[i].Labels)) {
				covered++
				if podHealthy(&pods[i]) {
					healthy++
				}
			}
		}
		expected := int(b.Status.ExpectedPods)
		if expected == 0 {
			expected = covered
		}
		var desired int
		switch {
		case b.Spec.MinAvailable != nil:
			desired, err = intstr.GetScaledValueFromIntOrPercent(b.Spec.MinAvailable, expected, true)
		case b.Spec.MaxUnavailable != nil:
			var unavailable int
			unavailable, err = intstr.GetScaledValueFromIntOrPercent(b.Spec.MaxUnavailable, expected, true)
			desired = expected - unavailable
		default:
			continue
		}
		if err != nil {
			continue
		}
		if healthy-1 < desired {
			return fmt.Sprintf("PodDisruptionBudget %s/%s's status allows %d disruptions, but %d of its pods are ready now and %d must stay: waiting for its controller to catch up",
				b.Namespace, b.Name, b.Status.DisruptionsAllowed, healthy, desired)
		}
	}
	return ""
}

// podHealthy: Ready and not being deleted, as the disruption controller counts a pod.
func podHealthy(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && kube.PodReady(p)
}
