package lab

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCrowdedPod: up deletes one demo pod only when a machine has none and another has
// several, all placed and running; the newest of the crowded machine's goes.
func TestCrowdedPod(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 22, 0, 0, 0, time.UTC)
	pod := func(name, node string, phase corev1.PodPhase, age time.Duration) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-age))},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	}
	machines := []string{"server", "agent"}
	deleted := pod("d", "server", corev1.PodRunning, time.Second)
	deleted.DeletionTimestamp = &metav1.Time{Time: t0}
	for _, tt := range []struct {
		name string
		pods []corev1.Pod
		want string
	}{
		{"spread", []corev1.Pod{pod("a", "server", corev1.PodRunning, time.Minute), pod("b", "agent", corev1.PodRunning, time.Minute)}, ""},
		{"both on the server", []corev1.Pod{pod("a", "server", corev1.PodRunning, 2*time.Minute), pod("b", "server", corev1.PodRunning, time.Minute)}, "b"},
		{"both on the agent", []corev1.Pod{pod("b", "agent", corev1.PodRunning, 2*time.Minute), pod("a", "agent", corev1.PodRunning, 3*time.Minute)}, "b"},
		{"one not placed yet", []corev1.Pod{pod("a", "server", corev1.PodRunning, time.Minute), pod("b", "", corev1.PodPending, time.Minute)}, ""},
		{"one still starting", []corev1.Pod{pod("a", "server", corev1.PodRunning, time.Minute), pod("b", "server", corev1.PodPending, time.Minute)}, ""},
		{"one already going", []corev1.Pod{pod("a", "server", corev1.PodRunning, time.Minute), deleted}, ""},
		{"one pod alone", []corev1.Pod{pod("a", "server", corev1.PodRunning, time.Minute)}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := crowdedPod(tt.pods, machines); got != tt.want {
				t.Errorf("crowdedPod = %q, want %q", got, tt.want)
			}
		})
	}
}
