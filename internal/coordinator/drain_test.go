package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
)

// The drain tests call drainNode itself, with a server's own credentials (the rights the
// coordinator drains with), against the real API server and kube-controller-manager
// (PodDisruptionBudget status). There is no kubelet: pods are made bound to their Node,
// f.kubelet finishes deletions where a test wants them finished, and a finalizer keeps a
// pod Terminating where it wants them stuck.

// serverKube is a client with server machine name's credentials.
func (f *fleetFixture) serverKube(name string) kubernetes.Interface {
	f.t.Helper()
	if err := authority.InstallServers(f.t.Context(), f.admin, name); err != nil {
		f.t.Fatal(err)
	}
	cfg, err := env.UserConfig(authority.User(name), authority.Group)
	if err != nil {
		f.t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

// editPod changes a pod's metadata (its owners, its finalizers).
func (f *fleetFixture) editPod(ns, name string, change func(*corev1.Pod)) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := f.admin.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(p)
		_, err = f.admin.CoreV1().Pods(ns).Update(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		f.t.Fatalf("changing pod %s/%s: %v", ns, name, err)
	}
}

// stuckPod makes a pod that is being deleted and stays so: a finalizer holds it, as a
// Node whose kubelet is down holds its pods. The finalizer goes at the end of the test.
func (f *fleetFixture) stuckPod(ns, name, node string) {
	f.t.Helper()
	f.pod(ns, name, node, nil, false)
	const hold = "liken.dev/test-hold"
	f.editPod(ns, name, func(p *corev1.Pod) { p.Finalizers = append(p.Finalizers, hold) })
	f.t.Cleanup(func() {
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := f.admin.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				return nil
			}
			p.Finalizers = slices.DeleteFunc(p.Finalizers, func(s string) bool { return s == hold })
			_, err = f.admin.CoreV1().Pods(ns).Update(context.Background(), p, metav1.UpdateOptions{})
			return err
		})
	})
	if err := f.admin.CoreV1().Pods(ns).Delete(f.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// protect gives the pods labelled app=app a PodDisruptionBudget that allows no disruption
// (minAvailable 1 of one pod), and waits for kube-controller-manager to have said so.
func (f *fleetFixture) protect(ns, app string) {
	f.t.Helper()
	one := intstr.FromInt32(1)
	if _, err := f.admin.PolicyV1().PodDisruptionBudgets(ns).Create(f.t.Context(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.waitFor("PodDisruptionBudget "+ns+"/"+app+" computed", 30*time.Second, func() bool {
		b, err := f.admin.PolicyV1().PodDisruptionBudgets(ns).Get(f.t.Context(), app, metav1.GetOptions{})
		return err == nil && b.Status.ObservedGeneration == b.Generation && b.Status.CurrentHealthy == 1 && b.Status.DisruptionsAllowed == 0
	})
}

// drainWatch is a drain running in the background, and when each watched pod went.
type drainWatch struct {
	start    time.Time
	deadline time.Time
	done     chan struct{}
	out      drainOutcome
	err      error
	took     time.Duration

	mu   sync.Mutex
	gone map[string]time.Duration
	logs []string
}

// startDrain runs drainNode on node with the timeout from now, and notes when each of
// the watched pods (namespace/name) is gone from the API.
func (f *fleetFixture) startDrain(kc kubernetes.Interface, node string, policy v1alpha1.DrainPolicy, timeout time.Duration, watch ...string) *drainWatch {
	r := &drainWatch{start: time.Now(), done: make(chan struct{}), gone: map[string]time.Duration{}}
	r.deadline = r.start.Add(timeout)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(r.done)
		r.out, r.err = drainNode(ctx, kc, node, policy, r.deadline, 200*time.Millisecond, func(s string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.logs = append(r.logs, s)
		})
		r.took = time.Since(r.start)
	}()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ctx.Err() == nil {
			for _, w := range watch {
				ns, name, _ := strings.Cut(w, "/")
				_, err := f.admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
				r.mu.Lock()
				if _, seen := r.gone[w]; !seen && apierrors.IsNotFound(err) {
					r.gone[w] = time.Since(r.start)
				}
				r.mu.Unlock()
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	f.t.Cleanup(func() {
		cancel()
		<-r.done
		<-watched
		if f.t.Failed() {
			f.t.Logf("the drain of %s logged: %q", node, r.logs)
		}
	})
	return r
}

// wait waits for the drain's end (the timeout and a margin at most).
func (r *drainWatch) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(time.Until(r.deadline) + 30*time.Second):
		t.Fatal("the drain did not end 30 s after its deadline")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		t.Fatalf("drainNode: %v", r.err)
	}
	t.Logf("drain ended after %s: %+v (pods gone after %v)", r.took.Round(time.Millisecond), r.out, r.gone)
}

// goneWithin says whether pod w went within d of the drain's start, and when.
func (r *drainWatch) goneWithin(w string, d time.Duration) (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.gone[w]
	if !ok {
		return false, "never"
	}
	return g <= d, fmt.Sprintf("after %s", g.Round(time.Millisecond))
}

// present fails unless the pod is there and not being deleted.
func (f *fleetFixture) present(ns, name, why string) {
	f.t.Helper()
	p, err := f.admin.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	switch {
	case err != nil:
		f.t.Errorf("%s/%s (%s): %v", ns, name, why, err)
	case p.DeletionTimestamp != nil:
		f.t.Errorf("%s/%s (%s) is being deleted", ns, name, why)
	}
}

// TestDrainEvictsWhatThePolicyLetsGoAtOnce (issue 24, item 3): a Node holds a pod with
// emptyDir data (drain.deleteEmptyDirData off), one no controller manages
// (drain.deleteUnmanagedPods off), one a PodDisruptionBudget holds and an ordinary
// ReplicaSet pod. The drain library refuses the first two; the ordinary pod is evicted at
// once all the same, not held until the timeout, and at the timeout the block names each
// pod left: the refused ones with the setting that keeps them, the PDB's with its PDB.
func TestDrainEvictsWhatThePolicyLetsGoAtOnce(t *testing.T) {
	const ns, timeout = "drain-a", 8 * time.Second
	f := newFleet(t, nil, machines("dra", 1, v1alpha1.RoleAgent))
	f.kubelet("dra1")
	f.pod(ns, "cache-0", "dra1", nil, true)
	f.pod(ns, "loose-0", "dra1", nil, false)
	f.editPod(ns, "loose-0", func(p *corev1.Pod) { p.OwnerReferences = nil })
	f.pod(ns, "db-0", "dra1", map[string]string{"app": "db"}, false)
	f.protect(ns, "db")
	f.pod(ns, "web-0", "dra1", map[string]string{"app": "web"}, false)

	r := f.startDrain(f.serverKube("srv-dra"), "dra1", v1alpha1.DrainPolicy{}, timeout, ns+"/web-0")
	r.wait(t)
	if ok, when := r.goneWithin(ns+"/web-0", timeout/2); !ok {
		t.Errorf("web-0, which the policy lets go, went %s: not at once (the timeout is %s)", when, timeout)
	}
	if r.out.drained || len(r.out.forced) != 0 {
		t.Errorf("drained %v, forced %v; want blocked, nothing forced", r.out.drained, r.out.forced)
	}
	if r.took < timeout {
		t.Errorf("the drain ended after %s, before its timeout %s (the refused pods may still go)", r.took, timeout)
	}
	if want := []string{ns + "/cache-0", ns + "/db-0", ns + "/loose-0"}; !slices.Equal(r.out.blocking, want) {
		t.Errorf("blocking %v; want %v", r.out.blocking, want)
	}
	for _, want := range []string{
		ns + "/cache-0: the drain may not move it: it uses emptyDir data (drain.deleteEmptyDirData is off)",
		ns + "/loose-0: the drain may not move it: no controller manages it (drain.deleteUnmanagedPods is off)",
		ns + "/db-0: PodDisruptionBudget " + ns + "/db allows 0 disruptions (1 healthy, 1 needed)",
	} {
		if !strings.Contains(r.out.message, want) {
			t.Errorf("the message does not say %q:\n%s", want, r.out.message)
		}
	}
	for _, p := range []string{"cache-0", "loose-0", "db-0"} {
		f.present(ns, p, "kept by a blocked drain")
	}
}

// TestDrainForceCoversOnlyWhatThePolicyLetsGo (issue 24, item 3). How this reads the API:
// drain.force "deletes the pods still in place when the timeout passes, bypassing
// PodDisruptionBudgets, and reboots", while without deleteEmptyDirData or
// deleteUnmanagedPods "such pods block the drain". So force covers the pods the policy lets
// go that are still there at the timeout (held by a PDB, or slow to terminate), never a pod
// the policy keeps; and as deleting past a PDB is worth only the reboot it lets through, it
// deletes nothing while a kept pod stops the reboot anyway.
//
// First, force with an emptyDir pod the policy keeps, a PDB's pod and an ordinary one: the
// ordinary pod is evicted at once; at the timeout the drain is blocked by the emptyDir
// pod, and neither it nor the PDB's pod is deleted. Then with deleteEmptyDirData on: the
// emptyDir pod and a new ordinary pod are evicted at once, and at the timeout force
// deletes only the pod still there, the PDB's.
func TestDrainForceCoversOnlyWhatThePolicyLetsGo(t *testing.T) {
	const ns, timeout = "drain-b", 8 * time.Second
	f := newFleet(t, nil, machines("drf", 1, v1alpha1.RoleAgent))
	f.kubelet("drf1")
	f.pod(ns, "cache-0", "drf1", nil, true)
	f.pod(ns, "db-0", "drf1", map[string]string{"app": "db"}, false)
	f.protect(ns, "db")
	f.pod(ns, "web-0", "drf1", map[string]string{"app": "web"}, false)
	kc := f.serverKube("srv-drf")

	r := f.startDrain(kc, "drf1", v1alpha1.DrainPolicy{Force: true}, timeout, ns+"/web-0")
	r.wait(t)
	if ok, when := r.goneWithin(ns+"/web-0", timeout/2); !ok {
		t.Errorf("web-0, which the policy lets go, went %s: not at once (the timeout is %s)", when, timeout)
	}
	if r.out.drained || len(r.out.forced) != 0 {
		t.Errorf("with the emptyDir pod kept: drained %v, forced %v; want blocked, nothing forced", r.out.drained, r.out.forced)
	}
	if want := []string{ns + "/cache-0", ns + "/db-0"}; !slices.Equal(r.out.blocking, want) {
		t.Errorf("blocking %v; want %v", r.out.blocking, want)
	}
	for _, want := range []string{
		ns + "/cache-0: the drain may not move it: it uses emptyDir data (drain.deleteEmptyDirData is off)",
		"drain.force deleted nothing",
	} {
		if !strings.Contains(r.out.message, want) {
			t.Errorf("the message does not say %q:\n%s", want, r.out.message)
		}
	}
	f.present(ns, "cache-0", "kept by drain.deleteEmptyDirData off, which drain.force does not override")
	f.present(ns, "db-0", "protected by its PDB, not forced while the drain cannot finish")
	if t.Failed() {
		return
	}

	f.pod(ns, "web-1", "drf1", map[string]string{"app": "web"}, false)
	r = f.startDrain(kc, "drf1", v1alpha1.DrainPolicy{Force: true, DeleteEmptyDirData: true}, timeout, ns+"/web-1", ns+"/cache-0", ns+"/db-0")
	r.wait(t)
	for _, p := range []string{"web-1", "cache-0"} {
		if ok, when := r.goneWithin(ns+"/"+p, timeout/2); !ok {
			t.Errorf("%s, which the policy lets go, went %s: not at once (the timeout is %s)", p, when, timeout)
		}
	}
	if !r.out.drained || !slices.Equal(r.out.forced, []string{ns + "/db-0"}) {
		t.Errorf("drained %v, forced %v; want drained with only %s/db-0 forced", r.out.drained, r.out.forced, ns)
	}
	f.waitFor("db-0 deleted", 10*time.Second, func() bool { ok, _ := r.goneWithin(ns+"/db-0", time.Hour); return ok })
	if ok, when := r.goneWithin(ns+"/db-0", timeout); ok {
		t.Errorf("db-0, which its PDB protects, went %s: before the timeout %s", when, timeout)
	}
}

// TestDrainDoesNotWaitOnANotReadyNode (issue 24, item 4): a pod being deleted on a Node that
// is not Ready (no kubelet to finish it: a finalizer holds it here) does not hold the
// drain until its timeout, and a pod still running there is evicted through the API (it
// is being deleted after, not deleted outright) and not waited for either. On a Ready
// Node the same stuck pod holds the drain to its timeout and is named.
func TestDrainDoesNotWaitOnANotReadyNode(t *testing.T) {
	const ns = "drain-c"
	f := newFleet(t, nil, machines("drn", 2, v1alpha1.RoleAgent))
	kc := f.serverKube("srv-drn")
	f.setReady("drn1", false)
	f.stuckPod(ns, "stuck-0", "drn1")
	f.pod(ns, "web-0", "drn1", map[string]string{"app": "web"}, false)

	const long = 20 * time.Second
	r := f.startDrain(kc, "drn1", v1alpha1.DrainPolicy{}, long)
	r.wait(t)
	if !r.out.drained || len(r.out.forced) != 0 {
		t.Errorf("NotReady Node: drained %v, forced %v, blocking %v; want drained, nothing forced", r.out.drained, r.out.forced, r.out.blocking)
	}
	if r.took > long/2 {
		t.Errorf("the drain of the NotReady Node took %s: it waited (the timeout is %s)", r.took, long)
	}
	p, err := f.admin.CoreV1().Pods(ns).Get(t.Context(), "web-0", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil {
		t.Errorf("web-0 on the NotReady Node: want it evicted and Terminating (no kubelet to finish it), got %v", err)
	}

	const short = 4 * time.Second
	f.stuckPod(ns, "stuck-1", "drn2")
	r = f.startDrain(kc, "drn2", v1alpha1.DrainPolicy{}, short)
	r.wait(t)
	if r.out.drained || !slices.Equal(r.out.blocking, []string{ns + "/stuck-1"}) || !strings.Contains(r.out.message, ns+"/stuck-1: it did not terminate in time") {
		t.Errorf("Ready Node: %+v; want blocked by %s/stuck-1, which did not terminate in time", r.out, ns)
	}
	if r.took < short {
		t.Errorf("the drain of the Ready Node ended after %s, before its timeout %s", r.took, short)
	}
}
