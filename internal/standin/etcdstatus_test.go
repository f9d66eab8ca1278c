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
	voter := etcdCondition(nil)
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
		{"unhealthy", []corev1.NodeCondition{at(voter, time.Minute, time.Hour)}, etcdCondition(errors.New("etcd /health: 503")),
			ptr(at(etcdCondition(errors.New("etcd /health: 503")), 0, 0))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := nextEtcdCondition(tt.conds, tt.want, now)
			if (got == nil) != (tt.write == nil) || got != nil && !equalCondition(*got, *tt.write) {
				t.Errorf("writes %+v; want %+v", got, tt.write)
			}
		})
	}
	if u := etcdCondition(errors.New("x")); u.Status != corev1.ConditionFalse || u.Reason != k3s.EtcdReasonUnhealthy || !strings.Contains(u.Message, "x") {
		t.Errorf("an unhealthy member's condition: %+v", u)
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
// etcd role, annotates it with its member, and sets EtcdIsVoter from etcd's health beside
// the kubelet's conditions, which stay; a member whose health check fails is Unhealthy.
func TestReportEtcd(t *testing.T) {
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const name = "etcd-report-1"
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	n, _ = admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var healthErr atomicErr
	var log syncbuf.Buffer
	go reportEtcd(ctx, admin, name, "192.0.2.10", func(context.Context) error { return healthErr.get() }, &log)
	condition := func() (*corev1.Node, *corev1.NodeCondition) {
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
	waitFor := func(what string, ok func(*corev1.Node, *corev1.NodeCondition) bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if n, c := condition(); n != nil && ok(n, c) {
				return
			}
			if time.Now().After(deadline) {
				n, _ := condition()
				t.Fatalf("%s: not within 30 s; the Node: %+v\nthe stand-in said:\n%s", what, n, log.String())
			}
		}
	}
	waitFor("a voter, labelled and annotated as k3s does", func(n *corev1.Node, c *corev1.NodeCondition) bool {
		return c != nil && c.Status == corev1.ConditionTrue && c.Reason == k3s.EtcdReasonVoter &&
			n.Labels[k3s.EtcdRoleLabel] == "true" && n.Annotations[k3s.EtcdNodeNameAnnotation] == name && n.Annotations[k3s.EtcdNodeAddressAnnotation] == "192.0.2.10" &&
			slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady && c.Reason == "KubeletReady" })
	})
	healthErr.set(errors.New("etcd /health: 503"))
	// The next check is 15 s later, as k3s's.
	waitFor("unhealthy", func(_ *corev1.Node, c *corev1.NodeCondition) bool {
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == k3s.EtcdReasonUnhealthy && strings.Contains(c.Message, "503")
	})
	if !strings.Contains(log.String(), "EtcdIsVoter False (Unhealthy)") {
		t.Errorf("the stand-in did not say its member went unhealthy:\n%s", log.String())
	}
}

// atomicErr is an error read by one goroutine and set by another.
type atomicErr struct {
	mu  sync.Mutex
	err error
}

func (a *atomicErr) get() error    { a.mu.Lock(); defer a.mu.Unlock(); return a.err }
func (a *atomicErr) set(err error) { a.mu.Lock(); a.err = err; a.mu.Unlock() }
