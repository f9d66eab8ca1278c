package coordinator

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"liken.dev/liken/api/v1alpha1"
)

// TestClusterDeletedMidRollout (issue 24 item 9): the Cluster is deleted while a machine's
// drain is under way. The turns went with the Cluster's status and no machine reboots
// without a Cluster, so the coordinator lifts the cordon it made for the turn (found by its
// mark on the Node) and stops the drain; an operator's own cordon stays.
func TestClusterDeletedMidRollout(t *testing.T) {
	two := intstr.FromInt32(2) // del2's cordon takes one
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) { s.DisruptionBudget.MaxUnavailable = &two }, machines("del", 2, v1alpha1.RoleAgent))
	f.setCordon("del2", true) // an operator's
	f.kubelet("del1")
	f.pod("gone", "scratch-0", "del1", nil, true) // emptyDir, not allowed to move: the drain goes on
	agents := f.agents(100*time.Millisecond, "del1")
	f.coordinator("srv-del", true)
	agents["del1"].ask()
	f.waitFor("del1 cordoned and marked for its turn, its drain under way", 30*time.Second, func() bool {
		n := f.node("del1")
		_, marked := n.Annotations[TurnCordon]
		st := f.cluster().Status
		return n.Spec.Unschedulable && marked && len(st.Turns) == 1 && st.Turns[0].Phase == v1alpha1.TurnDraining
	})

	if err := f.liken.DeleteCluster(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.waitFor("del1 uncordoned and its mark gone once the Cluster is", 30*time.Second, func() bool {
		n := f.node("del1")
		_, marked := n.Annotations[TurnCordon]
		return !n.Spec.Unschedulable && !marked
	})
	if !f.node("del2").Spec.Unschedulable {
		t.Error("the operator's cordon of del2 was lifted")
	}
	if _, ok := f.node("del2").Annotations[TurnCordon]; ok {
		t.Error("del2, which liken never cordoned, carries the turn's mark")
	}
}
