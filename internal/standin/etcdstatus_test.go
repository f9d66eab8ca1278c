package standin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/syncbuf"
)

// TestNextEtcdCondition: what the stand-in writes of its member, as k3s's leader does: a
// new condition once, then nothing while it holds and its heartbeat is younger than 5
// minutes, a fresh heartbeat after, a transition when the member's health changes.
func TestNextEtcdCondition(t *testing.T) {
	now := time.Unix(1785000000, 0)
	voter := etcdCondition(memberState{}, true)
	unhealthy := etcdCondition(memberState{health: errors.New("etcd /health: 503")}, true)
	at := func(c corev1.NodeCondition, beat, moved time.Duration) corev1.NodeCondition {
		c.LastHeartbeatTime, c.LastTransitionTime = metav1.NewTime(now.Add(-beat)), metav1.NewTime(now.Add(-moved))
		return c
	}
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	for _, tt := range []struct {
		name  string
		conds []corev1.NodeCondition
		want  corev1.NodeCondition
		write *corev1.NodeCondition
	}{
		{"first report", []corev1.NodeCondition{ready}, voter, ptr(at(voter, 0, 0))},
		{"unchanged, heartbeat fresh", []corev1.NodeCondition{ready, at(voter, time.Minute, time.Hour)}, voter, nil},
		{"unchanged, heartbeat 5 minutes old", []corev1.NodeCondition{at(voter, 5*time.Minute, time.Hour)}, voter, ptr(at(voter, 0, time.Hour))},
		{"unhealthy", []corev1.NodeCondition{at(voter, time.Minute, time.Hour)}, unhealthy, ptr(at(unhealthy, 0, 0))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := nextEtcdCondition(tt.conds, tt.want, now)
			if (got == nil) != (tt.write == nil) || got != nil && !equalCondition(*got, *tt.write) {
				t.Errorf("writes %+v; want %+v", got, tt.write)
			}
		})
	}
	for _, c := range []struct {
		s      memberState
		member bool
		reason string
	}{
		{memberState{health: errors.New("x")}, true, k3s.EtcdReasonUnhealthy},
		{memberState{learner: true}, true, k3s.EtcdReasonLearner},
		{memberState{}, false, k3s.EtcdReasonNotAMember},
	} {
		if got := etcdCondition(c.s, c.member); got.Status != corev1.ConditionFalse || got.Reason != c.reason || c.s.health != nil && !strings.Contains(got.Message, "x") {
			t.Errorf("the condition of %+v (a member: %v): %+v; want False, %s", c.s, c.member, got, c.reason)
		}
	}
	if voter.Status != corev1.ConditionTrue || voter.Reason != k3s.EtcdReasonVoter || voter.Message != "Node is a voting member of the etcd cluster" {
		t.Errorf("a voter's condition: %+v", voter)
	}
}

func ptr[T any](v T) *T { return &v }

func equalCondition(a, b corev1.NodeCondition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message &&
		a.LastHeartbeatTime.Equal(&b.LastHeartbeatTime) && a.LastTransitionTime.Equal(&b.LastTransitionTime)
}

// TestReportEtcd: against a real API server, the stand-in labels its server's Node with the
// etcd role and annotates it with its member, and, as the leader, sets EtcdIsVoter on every
// etcd Node from its view of the members, beside the kubelet's conditions, which stay: a
// voter, a learner, a Node whose member the cluster does not have; then, 15 s later, the
// learner promoted and this member unhealthy.
func TestReportEtcd(t *testing.T) {
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const self, other, gone = "etcd-report-1", "etcd-report-2", "etcd-report-3"
	for _, name := range []string{self, other, gone} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if name != self { // the others' servers labelled theirs
			n.Labels = map[string]string{k3s.EtcdRoleLabel: "true"}
			n.Annotations = map[string]string{k3s.EtcdNodeNameAnnotation: name + "-0000abcd"}
		}
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		n, _ = admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	view := etcdView{leader: true, members: map[string]memberState{self + "-1234abcd": {}, other + "-0000abcd": {learner: true}}}
	check := func(context.Context) (etcdView, error) { mu.Lock(); defer mu.Unlock(); return view, nil }
	var log syncbuf.Buffer
	go reportEtcd(ctx, admin, self, self+"-1234abcd", "192.0.2.10", check, &log)
	condition := func(name string) (*corev1.Node, *corev1.NodeCondition) {
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, nil
		}
		i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == k3s.EtcdIsVoter })
		if i < 0 {
			return n, nil
		}
		return n, &n.Status.Conditions[i]
	}
	waitFor := func(name, what string, ok func(*corev1.Node, *corev1.NodeCondition) bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if n, c := condition(name); n != nil && ok(n, c) {
				return
			}
			if time.Now().After(deadline) {
				n, _ := condition(name)
				t.Fatalf("%s: %s: not within 30 s; the Node: %+v\nthe stand-in said:\n%s", name, what, n, log.String())
			}
		}
	}
	is := func(status corev1.ConditionStatus, reason string) func(*corev1.Node, *corev1.NodeCondition) bool {
		return func(n *corev1.Node, c *corev1.NodeCondition) bool {
			return c != nil && c.Status == status && c.Reason == reason &&
				slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady && c.Reason == "KubeletReady" })
		}
	}
	waitFor(self, "a voter, labelled and annotated as k3s does", func(n *corev1.Node, c *corev1.NodeCondition) bool {
		return is(corev1.ConditionTrue, k3s.EtcdReasonVoter)(n, c) && n.Labels[k3s.EtcdRoleLabel] == "true" &&
			n.Annotations[k3s.EtcdNodeNameAnnotation] == self+"-1234abcd" && n.Annotations[k3s.EtcdNodeAddressAnnotation] == "192.0.2.10"
	})
	waitFor(other, "a learner", is(corev1.ConditionFalse, k3s.EtcdReasonLearner))
	waitFor(gone, "no member", is(corev1.ConditionFalse, k3s.EtcdReasonNotAMember))
	mu.Lock()
	view = etcdView{leader: true, members: map[string]memberState{self + "-1234abcd": {health: errors.New("etcd /health: 503")}, other + "-0000abcd": {}}}
	mu.Unlock()
	// The next check is 15 s later, as k3s's.
	waitFor(self, "unhealthy", func(n *corev1.Node, c *corev1.NodeCondition) bool {
		return is(corev1.ConditionFalse, k3s.EtcdReasonUnhealthy)(n, c) && strings.Contains(c.Message, "503")
	})
	waitFor(other, "promoted", is(corev1.ConditionTrue, k3s.EtcdReasonVoter))
	if !strings.Contains(log.String(), "Node "+self+": EtcdIsVoter False (Unhealthy)") {
		t.Errorf("the stand-in did not say its member went unhealthy:\n%s", log.String())
	}
}
