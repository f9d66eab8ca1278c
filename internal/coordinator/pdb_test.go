package coordinator

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestBudgetLags: a budget whose status allows a disruption that its pods, as they are now,
// do not (its controller lagging behind a pod gone unready) holds the eviction back; one
// whose status is right, or that covers other pods, does not.
func TestBudgetLags(t *testing.T) {
	pod := func(name string, ready bool, app string) corev1.Pod {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "d", Labels: map[string]string{"app": app}},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
	}
	deleting := func(p corev1.Pod) corev1.Pod { now := metav1.Now(); p.DeletionTimestamp = &now; return p }
	pdb := func(min, max *intstr.IntOrString, allowed, expected int32) policyv1.PodDisruptionBudget {
		return policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "d"},
			Spec:   policyv1.PodDisruptionBudgetSpec{MinAvailable: min, MaxUnavailable: max, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
			Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, ExpectedPods: expected}}
	}
	one, half := intstr.FromInt32(1), intstr.FromString("50%")
	a, b := pod("a", true, "web"), pod("b", true, "web")
	bUnready := pod("b", false, "web")
	for _, tt := range []struct {
		name   string
		pdbs   []policyv1.PodDisruptionBudget
		pods   []corev1.Pod
		target corev1.Pod
		lags   bool
	}{
		{"the status right: two ready, one may go", []policyv1.PodDisruptionBudget{pdb(&one, nil, 1, 2)}, []corev1.Pod{a, b}, a, false},
		{"the status stale: the other went unready", []policyv1.PodDisruptionBudget{pdb(&one, nil, 1, 2)}, []corev1.Pod{a, bUnready}, a, true},
		{"the other being deleted", []policyv1.PodDisruptionBudget{pdb(&one, nil, 1, 2)}, []corev1.Pod{a, deleting(b)}, a, true},
		{"an unready pod goes: it takes nothing", []policyv1.PodDisruptionBudget{pdb(&one, nil, 1, 2)}, []corev1.Pod{a, bUnready}, bUnready, false},
		{"maxUnavailable 50% of 2, stale", []policyv1.PodDisruptionBudget{pdb(nil, &half, 1, 2)}, []corev1.Pod{a, bUnready}, a, true},
		{"maxUnavailable 50% of 2, right", []policyv1.PodDisruptionBudget{pdb(nil, &half, 1, 2)}, []corev1.Pod{a, b}, a, false},
		{"the status allows none: the eviction API refuses it itself", []policyv1.PodDisruptionBudget{pdb(&one, nil, 0, 2)}, []corev1.Pod{a, bUnready}, a, false},
		{"another app's pod", []policyv1.PodDisruptionBudget{pdb(&one, nil, 1, 2)}, []corev1.Pod{a, bUnready, pod("c", true, "db")}, pod("c", true, "db"), false},
		{"no budget", nil, []corev1.Pod{a, bUnready}, a, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			why := budgetLags(tt.pdbs, tt.pods, &tt.target)
			if (why != "") != tt.lags {
				t.Errorf("budgetLags = %q; want lagging %v", why, tt.lags)
			}
			if tt.lags && !strings.Contains(why, "PodDisruptionBudget d/web's status allows 1 disruptions, but 1 of its pods are ready now and 1 must stay") {
				t.Errorf("the reason: %q", why)
			}
		})
	}
}
