package apiserver

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestControlPlane starts the control plane twice (the first start is the cold one: it
// builds missing binaries and reads them from disk; the second is warm), and checks it is
// configured as k3s configures its API server.
func TestControlPlane(t *testing.T) {
	ctx := t.Context()
	cold, err := Start(ctx, Options{ControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Stop()
	warm, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	warm.Stop()
	Report("apiserver start: cold %s (tools %s, ready %s, CRDs %s); warm %s (ready %s, CRDs %s)",
		cold.Timings.Total.Round(time.Millisecond), cold.Timings.Tools.Round(time.Millisecond),
		cold.Timings.Ready.Round(time.Millisecond), cold.Timings.CRDs.Round(time.Millisecond),
		warm.Timings.Total.Round(time.Millisecond), warm.Timings.Ready.Round(time.Millisecond),
		warm.Timings.CRDs.Round(time.Millisecond))

	env := cold
	admin := kubernetes.NewForConfigOrDie(env.Admin)

	t.Run("anonymous requests are refused", func(t *testing.T) {
		cfg := rest.AnonymousClientConfig(env.Admin)
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Get(env.Host + "/api/v1/namespaces")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("anonymous GET answered %s, want 401", resp.Status)
		}
	})

	t.Run("RBAC governs minted users", func(t *testing.T) {
		cfg, err := env.UserConfig("someone", "some-group")
		if err != nil {
			t.Fatal(err)
		}
		_, err = kubernetes.NewForConfigOrDie(cfg).CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("a user without RBAC bindings listed namespaces: err = %v, want Forbidden", err)
		}
		if !strings.Contains(err.Error(), `User "someone"`) {
			t.Errorf("the API server did not see the minted user name: %v", err)
		}
	})

	t.Run("NodeRestriction confines a node to itself", func(t *testing.T) {
		cfg, err := env.UserConfig("system:node:n1", "system:nodes")
		if err != nil {
			t.Fatal(err)
		}
		node := kubernetes.NewForConfigOrDie(cfg)
		if _, err := node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("node n1 could not register itself: %v", err)
		}
		_, err = node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("node n1 created node n2: err = %v, want Forbidden", err)
		}
	})

	t.Run("controller-manager computes PodDisruptionBudget status", func(t *testing.T) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pdb-test"}}
		if _, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		one := intstr.FromInt32(1)
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "pdb-test"},
			Spec: policyv1.PodDisruptionBudgetSpec{
				MinAvailable: &one,
				Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			},
		}
		if _, err := admin.PolicyV1().PodDisruptionBudgets("pdb-test").Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := admin.PolicyV1().PodDisruptionBudgets("pdb-test").Get(ctx, "web", metav1.GetOptions{})
			return err == nil && got.Status.ObservedGeneration == got.Generation, err
		})
		if err != nil {
			t.Fatalf("the disruption controller never observed the PDB: %v", err)
		}
	})
}

// TestStartAgainWhenPortTaken: the port chosen for kube-apiserver is taken by another
// server before kube-apiserver binds it (as when test packages run in parallel); Start
// starts the control plane again on other ports instead of failing.
func TestStartAgainWhenPortTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	calls := 0
	pickPort = func() int {
		calls++
		if calls == 3 { // etcd's client and peer ports come first, then kube-apiserver's
			return takenPort
		}
		return FreePort()
	}
	defer func() { pickPort = FreePort }()

	env, err := Start(t.Context(), Options{})
	if err != nil {
		t.Fatalf("Start with its first port taken: %v", err)
	}
	defer env.Stop()
	if calls < 6 {
		t.Errorf("ports picked: %d; want a second round after the first failed", calls)
	}
	if env.Host == fmt.Sprintf("https://127.0.0.1:%d", takenPort) {
		t.Errorf("the API server is said to be on the taken port %d", takenPort)
	}
	if _, err := kubernetes.NewForConfigOrDie(env.Admin).Discovery().ServerVersion(); err != nil {
		t.Errorf("the API server started the second time does not answer: %v", err)
	}
}
