package coordinator

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"liken.dev/liken/api/v1alpha1"
)

// TestPlanCountsAMachineBackFromItsRebootAsDown: a machine whose agent says it is going
// down or not yet healthy on this boot counts against the budget though its Node shows a
// Ready posted before the reboot, so no other machine is given a turn meanwhile.
func TestPlanCountsAMachineBackFromItsRebootAsDown(t *testing.T) {
	ready := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	}
	for _, tt := range []struct {
		state v1alpha1.RebootState
		grant bool
	}{
		{v1alpha1.RebootNone, true},
		{v1alpha1.RebootRebooting, false},
		{v1alpha1.RebootVerifying, false},
	} {
		t.Run(string(tt.state), func(t *testing.T) {
			one := intstr.FromInt32(1)
			cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{DisruptionBudget: v1alpha1.DisruptionBudget{MaxUnavailable: &one}}}
			m1 := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
			m1.Status.Reboot.State = tt.state
			m2 := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m2"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
			m2.Status.Reboot.State, m2.Status.PendingHash = v1alpha1.RebootWaitingForTurn, "sha256:aa"
			m2.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: "sha256:aa"}}
			p, err := MakePlan(Fleet{Cluster: cl, Machines: []v1alpha1.Machine{m1, m2},
				Nodes: map[string]*corev1.Node{"m1": ready("m1"), "m2": ready("m2")}, Self: "s", Now: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			if granted := len(p.Granted) == 1; granted != tt.grant {
				t.Errorf("m1 %s: granted %v, want a turn for m2: %v (waiting %+v)", tt.state, p.Granted, tt.grant, p.Status.Waiting)
			}
		})
	}
}

// TestPlanIgnoresMachinesNeverJoined: a Machine listed in the layer but never installed (no
// Node, no status) takes none of the budget, so the others still reboot under
// maxUnavailable 1, and the Cluster's status names it; one whose agent has reported and
// whose Node is gone still counts.
func TestPlanIgnoresMachinesNeverJoined(t *testing.T) {
	ready := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "m1"}, Status: corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	cl := &v1alpha1.Cluster{}
	m1 := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
	m1.Status.Reboot.State, m1.Status.PendingHash = v1alpha1.RebootWaitingForTurn, "sha256:aa"
	m1.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: "sha256:aa"}}
	never := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m9"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
	p, err := MakePlan(Fleet{Cluster: cl, Machines: []v1alpha1.Machine{m1, never}, Nodes: map[string]*corev1.Node{"m1": ready}, Self: "s", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ClusterAvailable)
	if len(p.Granted) != 1 || c == nil || !strings.Contains(c.Message, "m9 never joined") {
		t.Errorf("granted %v (waiting %+v), Available %+v; want m1 granted and m9 named as never joined", p.Granted, p.Status.Waiting, c)
	}

	gone := never
	gone.Status.ObservedGeneration = 1 // its agent reported once; its Node is gone now
	p, err = MakePlan(Fleet{Cluster: cl, Machines: []v1alpha1.Machine{m1, gone}, Nodes: map[string]*corev1.Node{"m1": ready}, Self: "s", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Granted) != 0 {
		t.Errorf("granted %v while m9, which joined once, has no Node", p.Granted)
	}
}

// TestPlanTakesBackATurnDuringADownload: a machine that holds a turn and must write its
// release again (its agent restarted mid-write) gives the turn back, its Node uncordoned,
// rather than holding the budget for the whole download.
func TestPlanTakesBackATurnDuringADownload(t *testing.T) {
	for _, phase := range []v1alpha1.TurnPhase{v1alpha1.TurnDraining, v1alpha1.TurnDrained} {
		t.Run(string(phase), func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "m1"}, Spec: corev1.NodeSpec{Unschedulable: true}, Status: corev1.NodeStatus{
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
			cl := &v1alpha1.Cluster{Status: v1alpha1.ClusterStatus{Turns: []v1alpha1.Turn{{Machine: "m1", PendingHash: "sha256:aa", Phase: phase}}}}
			m1 := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
			m1.Status.Reboot.State, m1.Status.PendingHash = v1alpha1.RebootWaitingForTurn, "sha256:aa"
			m1.Status.Upgrade.State = v1alpha1.UpgradeDownloading
			p, err := MakePlan(Fleet{Cluster: cl, Machines: []v1alpha1.Machine{m1}, Nodes: map[string]*corev1.Node{"m1": node}, Self: "s", Now: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Status.Turns) != 0 || !strings.Contains(p.Released["m1"], "write its release") || len(p.Uncordon) != 1 {
				t.Errorf("turns %+v, released %v, uncordon %v; want the turn given back and the Node uncordoned", p.Status.Turns, p.Released, p.Uncordon)
			}
		})
	}
}

// TestPlanServersDownFromTheApproval: a NotReady server's approval that names the other
// server down lets it go, and the plan says who accepted which servers down (for the
// TurnGranted Event); an approval of an earlier pending set does not.
func TestPlanServersDownFromTheApproval(t *testing.T) {
	node := func(name string, ready corev1.ConditionStatus) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
	}
	three := intstr.FromInt32(3)
	for _, tt := range []struct {
		name, approved string
		grant          bool
	}{
		{"approval of the pending set", "sha256:aa", true},
		{"approval of an earlier set", "sha256:bb", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{DisruptionBudget: v1alpha1.DisruptionBudget{MaxUnavailable: &three}}}
			server := func(name string) v1alpha1.Machine {
				m := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleServer}}
				return m
			}
			s1, s2, s3 := server("s1"), server("s2"), server("s3")
			s1.Status.Reboot.State, s1.Status.PendingHash = v1alpha1.RebootWaitingForTurn, "sha256:aa"
			s1.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: tt.approved, ApprovedBy: "ops", ServersDown: []string{"s2"}}}
			p, err := MakePlan(Fleet{Cluster: cl, Machines: []v1alpha1.Machine{s1, s2, s3},
				Nodes: map[string]*corev1.Node{"s1": node("s1", corev1.ConditionFalse), "s2": node("s2", corev1.ConditionUnknown), "s3": node("s3", corev1.ConditionTrue)},
				Self:  "s3", Now: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			if granted := len(p.Granted) == 1 && p.Granted[0] == "s1"; granted != tt.grant {
				t.Fatalf("granted %v; want s1 granted: %v (waiting %+v)", p.Granted, tt.grant, p.Status.Waiting)
			}
			if why := p.Despite["s1"]; tt.grant != (why != "") || tt.grant && !strings.Contains(why, "while s2 is down too, as ops accepted") {
				t.Errorf("the plan says %q of s1's turn", why)
			}
		})
	}
}

// TestPlanPaused: while the Cluster's rollout is paused no turn is given, whoever waits
// waits for the pause (who paused, when and why), a turn given before stays with its
// machine, and the RolloutPaused condition says so; resumed, the turn is given.
func TestPlanPaused(t *testing.T) {
	ready := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	}
	two := intstr.FromInt32(2)
	at := metav1.NewTime(time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC))
	cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{DisruptionBudget: v1alpha1.DisruptionBudget{MaxUnavailable: &two},
		Rollout: &v1alpha1.Rollout{Paused: true, PausedBy: "ops", PausedAt: &at, Reason: "the canary's workloads"}},
		Status: v1alpha1.ClusterStatus{Turns: []v1alpha1.Turn{{Machine: "m1", PendingHash: "sha256:aa", Phase: v1alpha1.TurnDraining}}}}
	waiting := func(name string) v1alpha1.Machine {
		m := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
		m.Status.Reboot.State, m.Status.PendingHash = v1alpha1.RebootWaitingForTurn, "sha256:aa"
		m.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: "sha256:aa"}}
		return m
	}
	fleet := Fleet{Cluster: cl, Machines: []v1alpha1.Machine{waiting("m1"), waiting("m2")},
		Nodes: map[string]*corev1.Node{"m1": ready("m1"), "m2": ready("m2")}, Self: "s", Now: time.Now()}
	p, err := MakePlan(fleet)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Granted) != 0 {
		t.Errorf("granted %v while the rollout is paused", p.Granted)
	}
	if len(p.Status.Turns) != 1 || p.Status.Turns[0].Machine != "m1" || len(p.Released) != 0 {
		t.Errorf("turns %+v, released %v: the turn given before the pause must stay with m1", p.Status.Turns, p.Released)
	}
	if len(p.Status.Waiting) != 1 || p.Status.Waiting[0].Machine != "m2" ||
		p.Status.Waiting[0].Reason != "the rollout is paused (spec.rollout.paused, by ops at 2026-12-03T17:00:00Z): the canary's workloads; no new reboot turn until liken rollout resume" {
		t.Errorf("waiting %+v; want m2 waiting for the pause, saying who paused, when and why", p.Status.Waiting)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ClusterRolloutPaused); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "by ops") {
		t.Errorf("RolloutPaused %+v, want True naming who paused", c)
	}

	cl.Spec.Rollout = nil
	p, err = MakePlan(fleet)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Granted) != 1 || p.Granted[0] != "m2" {
		t.Errorf("resumed: granted %v, want m2", p.Granted)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ClusterRolloutPaused); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("resumed: RolloutPaused %+v, want False", c)
	}
}
