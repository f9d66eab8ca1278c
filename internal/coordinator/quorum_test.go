package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/k3s"
)

// TestDecideByEtcdQuorum: with three etcd voters or more reporting, a server's turn depends
// on the healthy voters that hold no turn, not on its Node's readiness; a voter's reboot,
// healthy or not, must leave a quorum of them; learners take nothing; an operator may
// accept the unhealthy voters as down (serversDown), never a turn holder.
func TestDecideByEtcdQuorum(t *testing.T) {
	t0 := time.Unix(1785000000, 0)
	server := func(name string, since int, e Etcd) Machine {
		return Machine{Name: name, Server: true, Waiting: true, WaitingSince: t0.Add(time.Duration(since) * time.Second), Etcd: e}
	}
	healthy := Etcd{Reported: true, Voter: true, Healthy: true}
	unhealthy := Etcd{Reported: true, Voter: true, Why: "Unhealthy: failed to check etcd member status"}
	learner := Etcd{Reported: true, Why: k3s.EtcdReasonLearner}
	idle := func(m Machine) Machine { m.Waiting = false; return m }
	down := func(m Machine, why string) Machine { m.Unavailable = why; return m }
	holds := func(m Machine) Machine { m.HoldsTurn = true; return m }
	accepts := func(m Machine, names ...string) Machine { m.ServersDown = names; return m }
	three, five := ptr(intstr.FromInt32(3)), ptr(intstr.FromInt32(5))
	for _, tt := range []struct {
		name     string
		machines []Machine
		max      *intstr.IntOrString
		grant    []string
		wait     map[string]string
		despite  map[string][]string
	}{
		{"three healthy voters: one at a time", []Machine{server("s1", 1, healthy), server("s2", 2, healthy), server("s3", 3, healthy)}, three,
			[]string{"s1"}, map[string]string{"s2": "etcd quorum: 2 of the 3 voters (s1, s2, s3) must stay healthy, and s2's reboot would leave 1 (s3); rebooting on a turn: s1", "s3": "would leave 1 (s2)"}, nil},
		{"a NotReady server whose member is a healthy voter counts", []Machine{server("s1", 1, healthy), idle(down(server("s2", 0, healthy), "NotReady")), idle(server("s3", 0, healthy))}, three,
			[]string{"s1"}, nil, nil},
		{"a NotReady server reboots while its member votes, if the others keep the quorum", []Machine{down(server("s1", 1, healthy), "NotReady"), idle(server("s2", 0, healthy)), idle(server("s3", 0, healthy))}, three,
			[]string{"s1"}, nil, nil},
		{"an unhealthy voter: no healthy one goes", []Machine{server("s1", 1, healthy), idle(server("s2", 0, unhealthy)), idle(server("s3", 0, healthy))}, three,
			nil, map[string]string{"s1": "would leave 1 (s3); not healthy: s2 (Unhealthy: failed to check etcd member status); bring s2 back, or, knowing that etcd keeps its quorum without them: liken approve-reboot s1 --servers-down s2"}, nil},
		{"an unhealthy voter goes while the healthy ones keep the quorum", []Machine{server("s1", 1, unhealthy), idle(server("s2", 0, healthy)), idle(server("s3", 0, healthy))}, three,
			[]string{"s1"}, nil, nil},
		{"two unhealthy servers never both out", []Machine{down(server("s1", 1, unhealthy), "NotReady"), down(server("s2", 2, unhealthy), "NotReady"), idle(server("s3", 0, healthy))}, three,
			nil, map[string]string{"s1": "would leave 1 (s3)", "s2": "would leave 1 (s3)"}, nil},
		{"the operator accepts the unhealthy voter as down", []Machine{accepts(server("s1", 1, healthy), "s2"), idle(server("s2", 0, unhealthy)), idle(server("s3", 0, healthy))}, three,
			[]string{"s1"}, nil, map[string][]string{"s1": {"s2"}}},
		{"never a turn holder, whatever the operator says", []Machine{accepts(server("s1", 1, healthy), "s2"), holds(server("s2", 0, healthy)), idle(server("s3", 0, healthy))}, three,
			nil, map[string]string{"s1": "rebooting on a turn: s2"}, nil},
		{"a learner takes nothing from the quorum", []Machine{server("s4", 1, learner), server("s1", 2, healthy), idle(server("s2", 0, healthy)), idle(server("s3", 0, healthy))}, three,
			[]string{"s4", "s1"}, nil, nil},
		{"five voters: two at once, the budget allowing", []Machine{server("s1", 1, healthy), server("s2", 2, healthy), server("s3", 3, healthy), idle(server("s4", 0, healthy)), idle(server("s5", 0, healthy))}, five,
			[]string{"s1", "s2"}, map[string]string{"s3": "3 of the 5 voters"}, nil},
		{"two voters: one server at a time, as without etcd's word", []Machine{server("s1", 1, healthy), idle(down(server("s2", 0, healthy), "NotReady"))}, three,
			nil, map[string]string{"s1": "one server at a time: s2"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := decided(t, tt.machines, tt.max, tt.grant, tt.wait)
			if tt.despite == nil {
				tt.despite = map[string][]string{}
			}
			if diff := cmp.Diff(tt.despite, d.Despite); diff != "" {
				t.Errorf("despite (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEtcdOf: a server's EtcdIsVoter condition as k3s sets it, read.
func TestEtcdOf(t *testing.T) {
	now := time.Unix(1785000000, 0)
	node := func(st corev1.ConditionStatus, reason, msg string, age time.Duration) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionFalse},
			{Type: k3s.EtcdIsVoter, Status: st, Reason: reason, Message: msg, LastHeartbeatTime: metav1.NewTime(now.Add(-age))}}}}
	}
	for _, tt := range []struct {
		name string
		node *corev1.Node
		want Etcd
	}{
		{"no Node", nil, Etcd{}},
		{"no condition", &corev1.Node{}, Etcd{}},
		{"a voter", node(corev1.ConditionTrue, k3s.EtcdReasonVoter, "Node is a voting member of the etcd cluster", time.Minute), Etcd{Reported: true, Voter: true, Healthy: true}},
		{"a voter not refreshed for 11 minutes", node(corev1.ConditionTrue, k3s.EtcdReasonVoter, "", 11*time.Minute), Etcd{Reported: true, Voter: true,
			Why: "its EtcdIsVoter condition was last refreshed at 2026-07-25T17:09:00Z, more than 10m0s ago: no etcd leader has looked since"}},
		{"unhealthy", node(corev1.ConditionFalse, k3s.EtcdReasonUnhealthy, "failed to check etcd member status", 0), Etcd{Reported: true, Voter: true, Why: "Unhealthy: failed to check etcd member status"}},
		{"a learner", node(corev1.ConditionFalse, k3s.EtcdReasonLearner, "Node has not been promoted to voting member of the etcd cluster", 0), Etcd{Reported: true, Why: "MemberIsLearner"}},
		{"not a member", node(corev1.ConditionFalse, k3s.EtcdReasonNotAMember, "Node is not a member of the etcd cluster", 0), Etcd{Reported: true, Why: "NotAMember"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, EtcdOf(tt.node, now)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestQuorumCondition: the Cluster's ControlPlaneQuorum from the servers' etcd membership.
func TestQuorumCondition(t *testing.T) {
	healthy := Etcd{Reported: true, Voter: true, Healthy: true}
	unhealthy := Etcd{Reported: true, Voter: true, Why: "Unhealthy"}
	s := func(name string, e Etcd) Machine { return Machine{Name: name, Server: true, Etcd: e} }
	for _, tt := range []struct {
		name     string
		machines []Machine
		status   metav1.ConditionStatus
		reason   string
		phrase   string
	}{
		{"nothing reported", []Machine{s("s1", Etcd{}), {Name: "a1"}}, metav1.ConditionUnknown, v1alpha1.ReasonNotReported, "servers reboot one at a time"},
		{"one server", []Machine{s("s1", healthy)}, metav1.ConditionFalse, v1alpha1.ReasonTooFewVoters, "1 etcd voter(s) (s1): the quorum is 1"},
		{"two servers", []Machine{s("s1", healthy), s("s2", healthy)}, metav1.ConditionFalse, v1alpha1.ReasonTooFewVoters,
			"2 etcd voter(s) (s1, s2): the quorum is 2, so the API stops while any server reboots"},
		{"three healthy", []Machine{s("s1", healthy), s("s2", healthy), s("s3", healthy)}, metav1.ConditionTrue, v1alpha1.ReasonQuorumKept, "the quorum of 2 holds"},
		{"three, one unhealthy", []Machine{s("s1", healthy), s("s2", unhealthy), s("s3", healthy)}, metav1.ConditionFalse, v1alpha1.ReasonQuorumAtRisk,
			"2 of the 3 etcd voters are healthy and not rebooting (s1, s3), and the quorum is 2: no other server may reboot until one is back (s2 not healthy (Unhealthy))"},
		{"three, one on its turn", []Machine{s("s1", healthy), {Name: "s2", Server: true, HoldsTurn: true, Etcd: healthy}, s("s3", healthy)}, metav1.ConditionFalse, v1alpha1.ReasonQuorumAtRisk,
			"s2 rebooting on its turn"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := quorumCondition(tt.machines, 7)
			if c.Type != v1alpha1.ClusterControlPlaneQuorum || c.Status != tt.status || c.Reason != tt.reason || !strings.Contains(c.Message, tt.phrase) || c.ObservedGeneration != 7 {
				t.Errorf("%+v; want %s/%s saying %q", c, tt.status, tt.reason, tt.phrase)
			}
		})
	}
}
