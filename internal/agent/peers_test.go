package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestPeersReachOnlyForbiddenCommits: a server's network trial commits on its own health
// only when it may not read Leases (Forbidden: RBAC from an older layer); any other error
// reading a peer's Lease keeps the trial waiting, and says why. A renewed Lease commits. The
// API server here is a fake clientset: what is tested is the agent's reading of its answers.
func TestPeersReachOnlyForbiddenCommits(t *testing.T) {
	leases := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	for _, tt := range []struct {
		name   string
		err    error
		commit bool
		says   string
	}{
		{"forbidden", apierrors.NewForbidden(leases, "p1", nil), true, ""},
		{"unavailable", apierrors.NewServiceUnavailable("etcd is slow"), false, "reading p1's Node Lease"},
		{"timeout", apierrors.NewTimeoutError("request timed out", 1), false, "reading p1's Node Lease"},
		{"not renewed", nil, false, "none of p1 renewed its Node Lease"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kc := fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: corev1.NamespaceNodeLease, ResourceVersion: "1"}})
			if tt.err != nil {
				kc.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tt.err })
			}
			a := &Agent{kube: kc, log: slog.New(slog.DiscardHandler)}
			got := a.peersReach(context.Background(), []string{"p1"})
			got = a.peersReach(context.Background(), []string{"p1"}) // a second look: still no renewal
			if (got == "") != tt.commit || !strings.Contains(got, tt.says) {
				t.Errorf("peersReach = %q; want commit %v, saying %q", got, tt.commit, tt.says)
			}
		})
	}
	t.Run("renewed", func(t *testing.T) {
		kc := fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: corev1.NamespaceNodeLease, ResourceVersion: "1"}})
		a := &Agent{kube: kc, log: slog.New(slog.DiscardHandler)}
		if got := a.peersReach(context.Background(), []string{"p1"}); got == "" {
			t.Fatal("committed before any renewal")
		}
		l, _ := kc.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), "p1", metav1.GetOptions{})
		l.ResourceVersion = "2"
		kc.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(context.Background(), l, metav1.UpdateOptions{})
		if got := a.peersReach(context.Background(), []string{"p1"}); got != "" {
			t.Errorf("a renewed Lease: %q; want the commit", got)
		}
	})
}
