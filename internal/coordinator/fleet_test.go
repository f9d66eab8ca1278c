package coordinator

import (
	"slices"
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

// TestPlanHalts: once spec.rollout.maxFailures machines failed the trial of the release
// they are meant to run (or of the same kernel arguments), no turn is given and a turn
// still draining is taken back, while one drained already goes on; failures of another
// release, or accepted by a resume, do not count.
func TestPlanHalts(t *testing.T) {
	ready := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	}
	t1 := metav1.NewTime(time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC))
	t2 := metav1.NewTime(t1.Add(time.Minute))
	failedV2 := func(at metav1.Time) []v1alpha1.FailedRelease {
		return []v1alpha1.FailedRelease{{Digest: "sha256:v2", Version: "v2", Reason: v1alpha1.ReasonHealthDeadline, Message: "k3s never healthy", At: at}}
	}
	type machine struct {
		name      string
		state     v1alpha1.RebootState
		failed    []v1alpha1.FailedRelease
		args      *v1alpha1.FailedArgs
		turnPhase v1alpha1.TurnPhase // holds a turn in this phase
		retry     v1alpha1.Digest    // its spec.retryFailedDigest
	}
	args := &v1alpha1.FailedArgs{Args: "quiet", Reason: v1alpha1.ReasonKernelPanic, Message: "panic", At: t1}
	for _, tt := range []struct {
		name        string
		maxFailures int32
		resumedAt   *metav1.Time
		version     string
		machines    []machine
		halted      []string // the machines the halt names; nil: no halt
		key         string
		granted     []string
		released    []string
		failures    int // listed in status.rollout.failures
	}{
		{name: "one failure halts by default", version: "v2", machines: []machine{
			{name: "m1", failed: failedV2(t1)},
			{name: "m2", state: v1alpha1.RebootDraining, turnPhase: v1alpha1.TurnDraining},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, halted: []string{"m1"}, key: "sha256:v2", released: []string{"m2"}, failures: 1},
		{name: "a drained turn goes on", version: "v2", machines: []machine{
			{name: "m1", failed: failedV2(t1)},
			{name: "m2", state: v1alpha1.RebootRebooting, turnPhase: v1alpha1.TurnDrained},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, halted: []string{"m1"}, key: "sha256:v2", failures: 1},
		{name: "below maxFailures", maxFailures: 2, version: "v2", machines: []machine{
			{name: "m1", failed: failedV2(t1)},
			{name: "m2", state: v1alpha1.RebootDraining, turnPhase: v1alpha1.TurnDraining},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, granted: []string{"m3"}, failures: 1},
		{name: "maxFailures reached", maxFailures: 2, version: "v2", machines: []machine{
			{name: "m1", failed: failedV2(t2)},
			{name: "m2", failed: failedV2(t1)},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, halted: []string{"m2", "m1"}, key: "sha256:v2", failures: 2},
		{name: "accepted by a resume", resumedAt: &t1, version: "v2", machines: []machine{
			{name: "m1", failed: failedV2(t1)},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, granted: []string{"m3"}, failures: 1},
		{name: "a failure after the resume halts again", resumedAt: &t1, version: "v2", machines: []machine{
			{name: "m1", failed: failedV2(t1)},
			{name: "m2", failed: failedV2(t2)},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, halted: []string{"m2"}, key: "sha256:v2", failures: 2},
		{name: "a retry accepts the machine's failure", version: "v2", machines: []machine{
			{name: "m1", failed: failedV2(t1), retry: "sha256:v2"},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, granted: []string{"m3"}, failures: 1},
		{name: "the retry's own failure counts", version: "v2", machines: []machine{
			{name: "m1", failed: []v1alpha1.FailedRelease{{Digest: "sha256:v2", Reason: v1alpha1.ReasonWatchdog, At: t2, Retried: true}}, retry: "sha256:v2"},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, halted: []string{"m1"}, key: "sha256:v2", failures: 1},
		{name: "another release's failure is history", version: "v3", machines: []machine{
			{name: "m1", failed: failedV2(t1)},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, granted: []string{"m3"}},
		{name: "the same kernel arguments", maxFailures: 2, version: "v2", machines: []machine{
			{name: "m1", args: args},
			{name: "m2", args: args},
			{name: "m3", state: v1alpha1.RebootWaitingForTurn},
		}, halted: []string{"m1", "m2"}, key: KernelArgsKey + "quiet", failures: 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			budget := intstr.FromInt32(2)
			cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{Version: v1alpha1.ReleaseVersion(tt.version),
				Releases:         map[string]v1alpha1.Digest{"v2": "sha256:v2", "v3": "sha256:v3"},
				DisruptionBudget: v1alpha1.DisruptionBudget{MaxUnavailable: &budget}}}
			if tt.maxFailures != 0 || tt.resumedAt != nil {
				cl.Spec.Rollout = &v1alpha1.Rollout{ResumedAt: tt.resumedAt}
				if tt.maxFailures != 0 {
					cl.Spec.Rollout.MaxFailures = &tt.maxFailures
				}
			}
			f := Fleet{Cluster: cl, Nodes: map[string]*corev1.Node{}, Self: "s", Now: t2.Add(time.Minute)}
			for _, x := range tt.machines {
				m := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: x.name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
				m.Status.Reboot.State, m.Spec.RetryFailedDigest = x.state, x.retry
				m.Status.Upgrade.FailedReleases, m.Status.Upgrade.FailedKernelArgs = x.failed, x.args
				if x.state != "" {
					m.Status.PendingHash = "sha256:aa"
					m.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: "sha256:aa"}}
				}
				if x.turnPhase != "" {
					cl.Status.Turns = append(cl.Status.Turns, v1alpha1.Turn{Machine: x.name, PendingHash: "sha256:aa", Phase: x.turnPhase, Since: t1})
				}
				f.Machines = append(f.Machines, m)
				f.Nodes[x.name] = ready(x.name)
			}
			p, err := MakePlan(f)
			if err != nil {
				t.Fatal(err)
			}
			ro := p.Status.Rollout
			if len(ro.Failures) != tt.failures {
				t.Errorf("status.rollout.failures %+v, want %d", ro.Failures, tt.failures)
			}
			c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ClusterRolloutPaused)
			if tt.halted == nil {
				if ro.Halted != nil || c.Status != metav1.ConditionFalse {
					t.Errorf("halted %+v, RolloutPaused %+v; want no halt", ro.Halted, c)
				}
			} else {
				if ro.Halted == nil || strings.Join(ro.Halted.Machines, ",") != strings.Join(tt.halted, ",") || ro.Halted.Key != tt.key {
					t.Fatalf("halted %+v, want %v for %s", ro.Halted, tt.halted, tt.key)
				}
				if c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonHalted || !strings.Contains(c.Message, tt.halted[0]+" (") {
					t.Errorf("RolloutPaused %+v, want True, Halted, naming %s and why", c, tt.halted[0])
				}
				for _, w := range p.Status.Waiting {
					if w.Reason != c.Message {
						t.Errorf("%s waits for %q, want the halt", w.Machine, w.Reason)
					}
				}
			}
			if strings.Join(p.Granted, ",") != strings.Join(tt.granted, ",") {
				t.Errorf("granted %v, want %v", p.Granted, tt.granted)
			}
			var released []string
			for m := range p.Released {
				released = append(released, m)
			}
			if strings.Join(released, ",") != strings.Join(tt.released, ",") || strings.Join(p.Uncordon, ",") != strings.Join(tt.released, ",") {
				t.Errorf("released %v, uncordoned %v; want %v", p.Released, p.Uncordon, tt.released)
			}
		})
	}
}

// TestPlanWaitsForGates: a machine back from its reboot and healthy by its own account keeps
// its drained turn until its gates have passed or failed; a failure is recorded once in the
// Cluster's status, against the release the machine now runs (or the gate, when it runs
// another), and halts the rollout at maxFailures like a failed trial.
func TestPlanWaitsForGates(t *testing.T) {
	node := func(name, boot string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
		n.Status.NodeInfo.BootID = boot
		return n
	}
	since := metav1.NewTime(time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC))
	for _, tt := range []struct {
		name      string
		gates     *v1alpha1.TurnGates
		runs      string // the digest m1 runs
		noNode    bool
		keep      bool
		why       string // in the release reason
		failure   string // the key of the failure recorded; "" none
		halted    bool
		grantedM2 bool
	}{
		{name: "not judged yet", keep: true},
		{name: "checking", gates: &v1alpha1.TurnGates{Phase: v1alpha1.GateChecking, BootID: "b2", Since: since, Gate: "workloads", Message: "web has 1 of 2"}, keep: true},
		{name: "passed", gates: &v1alpha1.TurnGates{Phase: v1alpha1.GatePassed, BootID: "b2", Since: since}, why: "passed its health gate and its gates", grantedM2: true},
		{name: "failed on the new release", runs: "sha256:v2", gates: &v1alpha1.TurnGates{Phase: v1alpha1.GateFailed, BootID: "b2", Since: since, Gate: "smoke", Message: "gate smoke failed: Job x failed"},
			why: "its gates failed: gate smoke failed", failure: "sha256:v2", halted: true},
		{name: "failed on another release", runs: "sha256:v1", gates: &v1alpha1.TurnGates{Phase: v1alpha1.GateFailed, BootID: "b2", Since: since, Gate: "smoke", Message: "gate smoke failed"},
			why: "its gates failed", failure: GateFailureKey + "smoke", halted: true},
		{name: "no Node", noNode: true, why: "no Node"}, // a machine with no Node counts against the budget itself
	} {
		t.Run(tt.name, func(t *testing.T) {
			one := intstr.FromInt32(1)
			cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{Version: "v2", Releases: map[string]v1alpha1.Digest{"v2": "sha256:v2"},
				RebootPolicy: v1alpha1.RebootAuto, DisruptionBudget: v1alpha1.DisruptionBudget{MaxUnavailable: &one}}}
			cl.Status.Turns = []v1alpha1.Turn{{Machine: "m1", Since: since, PendingHash: "sha256:p1", Phase: v1alpha1.TurnDrained, BootID: "b1"}}
			m1 := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
			m1.Status.Reboot.State = v1alpha1.RebootNone
			if tt.runs != "" {
				m1.Status.Release = &v1alpha1.RunningRelease{Version: "v2", Digest: tt.runs}
			}
			m2 := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m2"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
			m2.Status.Reboot.State, m2.Status.PendingHash = v1alpha1.RebootWaitingForTurn, "sha256:p2"
			nodes := map[string]*corev1.Node{"m2": node("m2", "c1")}
			if !tt.noNode {
				nodes["m1"] = node("m1", "b2")
			}
			f := Fleet{Cluster: cl, Machines: []v1alpha1.Machine{m1, m2}, Nodes: nodes, Self: "s", Now: since.Add(time.Minute), Gates: map[string]v1alpha1.TurnGates{}}
			if tt.gates != nil {
				f.Gates[GateKey(cl.Status.Turns[0])] = *tt.gates
			}
			p, err := MakePlan(f)
			if err != nil {
				t.Fatal(err)
			}
			why, released := p.Released["m1"]
			if released == tt.keep {
				t.Fatalf("m1's turn released %v (%q); want kept %v", released, why, tt.keep)
			}
			if tt.keep {
				if g := p.Status.Turns[0].Gates; !equalGates(g, tt.gates) {
					t.Errorf("the kept turn's gates %+v; want %+v", g, tt.gates)
				}
			} else if !strings.Contains(why, tt.why) {
				t.Errorf("m1's turn released because %q; want it to say %q", why, tt.why)
			}
			var gf []v1alpha1.TrialFailure
			if p.Status.Rollout != nil {
				gf = p.Status.Rollout.GateFailures
			}
			switch {
			case tt.failure == "" && len(gf) > 0:
				t.Errorf("gate failures recorded: %+v", gf)
			case tt.failure != "" && (len(gf) != 1 || gf[0].Key != tt.failure || gf[0].Machine != "m1" || gf[0].Reason != v1alpha1.ReasonGateFailed || !gf[0].At.Equal(&since)):
				t.Errorf("gate failures %+v; want one of m1 with key %s", gf, tt.failure)
			}
			if halted := p.Status.Rollout != nil && p.Status.Rollout.Halted != nil; halted != tt.halted {
				t.Errorf("halted %v; want %v", halted, tt.halted)
			}
			if granted := slices.Contains(p.Granted, "m2"); granted != tt.grantedM2 {
				t.Errorf("m2 granted %v; want %v (waiting %+v)", granted, tt.grantedM2, p.Status.Waiting)
			}
			if tt.failure != "" {
				// Planned again from what it wrote: recorded once.
				cl.Status = p.Status
				f.Cluster = cl
				p2, err := MakePlan(f)
				if err != nil {
					t.Fatal(err)
				}
				if n := len(p2.Status.Rollout.GateFailures); n != 1 {
					t.Errorf("after a second plan %d gate failures; want the one", n)
				}
			}
		})
	}
}

func equalGates(a, b *v1alpha1.TurnGates) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Phase == b.Phase && a.Message == b.Message && a.BootID == b.BootID
}

// TestPlanTakesBackATurnGivenWhileDown: a machine given its turn while NotReady took nothing
// from the budget; back before its drain ended, its turn counts as any other, so with m1
// granted a turn meanwhile it gives its turn back (uncordoned) rather than go down beside
// m1. Drained already, or still down, or with room in the budget, it keeps it.
func TestPlanTakesBackATurnGivenWhileDown(t *testing.T) {
	node := func(name string, ready, cordoned bool) *corev1.Node {
		st := corev1.ConditionTrue
		if !ready {
			st = corev1.ConditionFalse
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}}}
	}
	for _, tt := range []struct {
		name      string
		m2Ready   bool
		phase     v1alpha1.TurnPhase
		budget    int32
		takenBack bool
	}{
		{"back before its drain ended", true, v1alpha1.TurnDraining, 1, true},
		{"still NotReady", false, v1alpha1.TurnDraining, 1, false},
		{"drained already: it goes down", true, v1alpha1.TurnDrained, 1, false},
		{"room in the budget", true, v1alpha1.TurnDraining, 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			max := intstr.FromInt32(tt.budget)
			since := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
			cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{DisruptionBudget: v1alpha1.DisruptionBudget{MaxUnavailable: &max}}}
			cl.Status.Turns = []v1alpha1.Turn{
				{Machine: "m1", Since: since, PendingHash: "sha256:aa", Phase: v1alpha1.TurnDraining},
				{Machine: "m2", Since: since, PendingHash: "sha256:aa", Phase: tt.phase, GrantedUnavailable: "NotReady"},
			}
			var ms []v1alpha1.Machine
			for _, name := range []string{"m1", "m2", "m3"} {
				m := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
				m.Status.Reboot.State, m.Status.PendingHash = v1alpha1.RebootDraining, "sha256:aa"
				ms = append(ms, m)
			}
			ms[2].Status.Reboot.State, ms[2].Status.PendingHash = v1alpha1.RebootNone, ""
			p, err := MakePlan(Fleet{Cluster: cl, Machines: ms, Self: "m3", Now: time.Now(),
				Nodes: map[string]*corev1.Node{"m1": node("m1", true, true), "m2": node("m2", tt.m2Ready, true), "m3": node("m3", true, false)}})
			if err != nil {
				t.Fatal(err)
			}
			why, released := p.Released["m2"]
			if released != tt.takenBack {
				t.Fatalf("m2's turn taken back: %v (%q); want %v (turns %+v)", released, why, tt.takenBack, p.Status.Turns)
			}
			if _, ok := p.Released["m1"]; ok {
				t.Errorf("m1's turn was taken back: %q", p.Released["m1"])
			}
			if !tt.takenBack {
				return
			}
			if !strings.Contains(why, "given its turn while unavailable") || !strings.Contains(why, "are: m1") {
				t.Errorf("why m2 gives its turn back: %q", why)
			}
			if !slices.Contains(p.Uncordon, "m2") {
				t.Errorf("m2 is not uncordoned: %v", p.Uncordon)
			}
			if len(p.Status.Turns) != 1 || p.Status.Turns[0].Machine != "m1" {
				t.Errorf("turns after: %+v; want m1's alone", p.Status.Turns)
			}
		})
	}
}

// TestPlanRecordsATurnGivenWhileDown: the turn of a machine granted because it was down
// already says so, and that of one granted from the budget does not.
func TestPlanRecordsATurnGivenWhileDown(t *testing.T) {
	two := intstr.FromInt32(2)
	cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{DisruptionBudget: v1alpha1.DisruptionBudget{MaxUnavailable: &two}}}
	var ms []v1alpha1.Machine
	nodes := map[string]*corev1.Node{}
	for i, name := range []string{"m1", "m2", "m3"} {
		m := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
		m.Status.Reboot.State, m.Status.PendingHash = v1alpha1.RebootWaitingForTurn, "sha256:aa"
		m.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: "sha256:aa"}}
		ms = append(ms, m)
		st := corev1.ConditionTrue
		if i == 1 {
			st = corev1.ConditionFalse
		}
		nodes[name] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}}}
	}
	p, err := MakePlan(Fleet{Cluster: cl, Machines: ms, Nodes: nodes, Self: "x", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, tr := range p.Status.Turns {
		got[tr.Machine] = tr.GrantedUnavailable
	}
	want := map[string]string{"m1": "", "m2": "NotReady"}
	if len(got) != 2 || got["m1"] != want["m1"] || got["m2"] != want["m2"] {
		t.Errorf("turns given (machine: granted while): %v; want %v", got, want)
	}
}

// TestPlanSoaksAndCanaries: with spec.rollout.canaries the canary takes the first turn
// though others waited longer, and the rest wait while it has a reboot ahead of it or in
// progress; once its turn ends well (rebooted, gates passed), nobody gets a turn until
// spec.rollout.soak has passed; soakTurns limits the soak to the first turns, a canary's
// turn aside; an invalid selector holds every turn and says why.
func TestPlanSoaksAndCanaries(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	one := intstr.FromInt32(1)
	node := func(name string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
		n.Status.NodeInfo.BootID = "boot-" + name
		return n
	}
	newFleet := func(soakTurns int32, selector *metav1.LabelSelector) Fleet {
		cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{Version: "v2", RebootPolicy: v1alpha1.RebootAuto,
			DisruptionBudget: v1alpha1.DisruptionBudget{MaxUnavailable: &one},
			Rollout:          &v1alpha1.Rollout{Soak: &metav1.Duration{Duration: 10 * time.Minute}, SoakTurns: &soakTurns, Canaries: selector}}}
		f := Fleet{Cluster: cl, Nodes: map[string]*corev1.Node{}, Self: "server", Now: t0, Gates: map[string]v1alpha1.TurnGates{}}
		for i, name := range []string{"m1", "m2", "m3"} {
			m := v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-time.Hour))},
				Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
			if name == "m3" {
				m.Labels = map[string]string{"liken.dev/canary": "true"}
			}
			m.Status.Reboot.State, m.Status.PendingHash = v1alpha1.RebootWaitingForTurn, "sha256:p-"+name
			since := metav1.NewTime(t0.Add(time.Duration(i-10) * time.Minute)) // m1 waits longest
			m.Status.Reboot.Since = &since
			f.Machines = append(f.Machines, m)
			f.Nodes[name] = node(name)
		}
		return f
	}
	plan := func(t *testing.T, f *Fleet) Plan {
		t.Helper()
		p, err := MakePlan(*f)
		if err != nil {
			t.Fatal(err)
		}
		f.Cluster.Status = p.Status
		return p
	}
	// back puts name's turn as drained, its machine back and healthy with its gates passed.
	back := func(f *Fleet, name string) {
		for i := range f.Cluster.Status.Turns {
			tr := &f.Cluster.Status.Turns[i]
			if tr.Machine == name {
				tr.Phase = v1alpha1.TurnDrained
				f.Gates[GateKey(*tr)] = v1alpha1.TurnGates{Phase: v1alpha1.GatePassed, BootID: "new", Since: metav1.NewTime(f.Now)}
			}
		}
		for i := range f.Machines {
			if f.Machines[i].Name == name {
				f.Machines[i].Status.Reboot.State, f.Machines[i].Status.PendingHash = v1alpha1.RebootNone, ""
			}
		}
	}
	reason := func(p Plan, name string) string {
		for _, w := range p.Status.Waiting {
			if w.Machine == name {
				return w.Reason
			}
		}
		return ""
	}
	canary := &metav1.LabelSelector{MatchLabels: map[string]string{"liken.dev/canary": "true"}}

	t.Run("canary first, then the soak", func(t *testing.T) {
		f := newFleet(0, canary)
		p := plan(t, &f)
		if !slices.Equal(p.Granted, []string{"m3"}) {
			t.Fatalf("granted %v; want the canary m3 first", p.Granted)
		}
		if r := reason(p, "m1"); !strings.Contains(r, "canaries first") || !strings.Contains(r, "m3 (WaitingForTurn)") {
			t.Errorf("m1 waits for %q; want the canary named", r)
		}
		back(&f, "m3")
		f.Now = t0.Add(time.Minute)
		p = plan(t, &f)
		if len(p.Granted) != 0 || p.Released["m3"] == "" {
			t.Fatalf("the canary's turn ended: released %v, granted %v; want m3 released and nobody granted", p.Released, p.Granted)
		}
		ro := p.Status.Rollout
		if ro.TurnsEnded != 1 || ro.LastTurnEnded == nil || ro.LastTurnEnded.Machine != "m3" || !ro.LastTurnEnded.Canary ||
			ro.SoakUntil == nil || !ro.SoakUntil.Time.Equal(t0.Add(11*time.Minute)) {
			t.Fatalf("status.rollout %+v; want m3's canary turn ended, the soak until %s", ro, t0.Add(11*time.Minute))
		}
		if r := reason(p, "m1"); !strings.Contains(r, "soaking") || !strings.Contains(r, "m3's canary turn") {
			t.Errorf("m1 waits for %q; want the soak", r)
		}
		f.Now = t0.Add(10 * time.Minute)
		if p = plan(t, &f); len(p.Granted) != 0 || p.Status.Rollout.SoakUntil == nil {
			t.Fatalf("granted %v during the soak", p.Granted)
		}
		f.Now = t0.Add(11*time.Minute + time.Second)
		if p = plan(t, &f); !slices.Equal(p.Granted, []string{"m1"}) || p.Status.Rollout.SoakUntil != nil {
			t.Fatalf("after the soak granted %v (soak until %v); want m1, the longest waiting", p.Granted, p.Status.Rollout.SoakUntil)
		}
	})
	t.Run("soakTurns", func(t *testing.T) {
		f := newFleet(1, nil)
		if p := plan(t, &f); !slices.Equal(p.Granted, []string{"m1"}) {
			t.Fatalf("granted %v; want m1", p.Granted)
		}
		back(&f, "m1")
		f.Now = t0.Add(time.Minute)
		if p := plan(t, &f); len(p.Granted) != 0 {
			t.Fatalf("granted %v right after the first turn ended; want the soak", p.Granted)
		}
		f.Now = t0.Add(12 * time.Minute)
		if p := plan(t, &f); !slices.Equal(p.Granted, []string{"m2"}) {
			t.Fatalf("granted %v after the soak; want m2", p.Granted)
		}
		back(&f, "m2")
		f.Now = t0.Add(13 * time.Minute)
		p := plan(t, &f)
		if !slices.Equal(p.Granted, []string{"m3"}) || p.Status.Rollout.TurnsEnded != 2 {
			t.Fatalf("the second turn ended (soakTurns 1): granted %v, turns ended %d; want m3 at once, 2", p.Granted, p.Status.Rollout.TurnsEnded)
		}
	})
	t.Run("no canary busy", func(t *testing.T) {
		f := newFleet(0, canary)
		f.Machines[2].Status.Reboot.State, f.Machines[2].Status.PendingHash = v1alpha1.RebootNone, ""
		if p := plan(t, &f); !slices.Equal(p.Granted, []string{"m1"}) {
			t.Fatalf("granted %v with the canary up to date; want m1", p.Granted)
		}
	})
	t.Run("invalid selector", func(t *testing.T) {
		f := newFleet(0, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}})
		p := plan(t, &f)
		if len(p.Granted) != 0 || !strings.Contains(reason(p, "m1"), "spec.rollout.canaries is not a valid label selector") {
			t.Fatalf("granted %v, m1 waits for %q; want nobody, and why", p.Granted, reason(p, "m1"))
		}
	})
}
