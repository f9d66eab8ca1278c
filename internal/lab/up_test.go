package lab

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestSchedulable: a Node takes the demo's pods once nothing keeps the scheduler off it,
// not merely once Ready (the not-ready taint lingers after Ready).
func TestSchedulable(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec corev1.NodeSpec
		want bool
	}{
		{"no taint", corev1.NodeSpec{}, true},
		{"the not-ready taint the controller manager has not lifted yet", corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}}}, false},
		{"unreachable, NoExecute", corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute}}}, false},
		{"a PreferNoSchedule taint only", corev1.NodeSpec{Taints: []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectPreferNoSchedule}}}, true},
		{"cordoned", corev1.NodeSpec{Unschedulable: true}, false},
	} {
		if got := schedulable(&corev1.Node{Spec: tc.spec}); got != tc.want {
			t.Errorf("%s: schedulable = %v; want %v", tc.name, got, tc.want)
		}
	}
}
