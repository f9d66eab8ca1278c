package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/state"
)

// TestServerSnapshotsBeforeItsDrain (issue 28 item 4), with the real coordinator and API
// server: a server whose Node carries k3s's etcd role, its reboot approved and its turn
// given, takes its etcd snapshot before the coordinator cordons it. A failed snapshot is in
// status.etcdSnapshot with its error, with a Warning Event, and holds the drain; the next
// try's snapshot names the turn, with an EtcdSnapshotTaken Event, and the machine is then
// drained and rebooted. The snapshot is taken once for the turn.
func TestServerSnapshotsBeforeItsDrain(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"es1": v1alpha1.RoleServer})
	boot := f.bootedOnClusterRelease(t)
	es1 := newSim(t, "es1", v1alpha1.RoleServer)
	es1.bootCtl = boot
	var mu sync.Mutex
	var calls []bool // whether the Node was cordoned at each call
	es1.snapshot = func(ctx context.Context) (k3s.Snapshot, error) {
		n, err := f.admin.CoreV1().Nodes().Get(ctx, "es1", metav1.GetOptions{})
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, err != nil || n.Spec.Unschedulable)
		if len(calls) == 1 {
			return k3s.Snapshot{}, errors.New("the test's first snapshot fails")
		}
		return k3s.Snapshot{Name: "liken-es1-1796600000", Path: "/var/lib/rancher/k3s/server/db/snapshots/liken-es1-1796600000", Size: 5 << 20, At: time.Unix(1796600000, 0)}, nil
	}
	es1.snapshotRetry = 2 * time.Second
	es1.boot(t, f)
	es1.start(t)
	f.waitFor(t, "es1", "running with nothing pending", func(m *v1alpha1.Machine, n *corev1.Node) bool {
		return n != nil && m.Status.Reboot.State == v1alpha1.RebootNone
	})
	// k3s labels a server running an etcd member so.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := f.admin.CoreV1().Nodes().Get(t.Context(), "es1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[k3s.EtcdRoleLabel] = "true"
		_, err = f.admin.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.editMachine("es1", func(m *v1alpha1.Machine) {
		m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
	})
	f.waitFor(t, "es1", "the network change waiting for approval", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.network") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
	})
	approve(f, "es1")
	var failed *v1alpha1.EtcdSnapshotStatus
	f.waitFor(t, "es1", "its failed snapshot reported, nothing cordoned", func(m *v1alpha1.Machine, n *corev1.Node) bool {
		failed = m.Status.EtcdSnapshot
		return failed != nil && failed.Error != "" && !n.Spec.Unschedulable
	})
	if !strings.Contains(failed.Error, "the test's first snapshot fails") || boot.rebootCount() != 0 {
		t.Errorf("after the failed snapshot: status %+v, %d reboots", failed, boot.rebootCount())
	}
	waitCount(t, "the approved reboot, after the second try's snapshot", func() bool { return boot.rebootCount() == 1 })
	m, err := f.liken.Machine(t.Context(), "es1")
	if err != nil {
		t.Fatal(err)
	}
	s := m.Status.EtcdSnapshot
	if s == nil || s.Error != "" || s.Name != "liken-es1-1796600000" || s.SizeBytes != 5<<20 || s.TakenAt == nil || s.Turn.IsZero() ||
		!strings.HasPrefix(s.For, "pending set sha256:") {
		t.Errorf("status.etcdSnapshot after the reboot: %+v", s)
	}
	mu.Lock()
	got := append([]bool(nil), calls...)
	mu.Unlock()
	if len(got) != 2 || got[0] || got[1] {
		t.Errorf("snapshots taken %d times (want 2: a failure, then one), the Node cordoned at each: %v", len(got), got)
	}
	waitCount(t, "the snapshots' Events", func() bool {
		list, err := f.admin.CoreV1().Events(authority.EventNamespace).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=es1"})
		if err != nil {
			return false
		}
		seen := map[string]int{}
		for _, e := range list.Items {
			seen[e.Reason] += max(int(e.Count), 1)
		}
		return seen["EtcdSnapshotFailed"] >= 1 && seen["EtcdSnapshotTaken"] == 1
	})
	es1.stop()
}

// TestStatusSaysTheLastEtcdRestore: the restore init recorded before the agent started (a
// failed one, here) is the Machine's status.etcdRestore, and the rejoin it recorded is
// status.etcdRejoin.
func TestStatusSaysTheLastEtcdRestore(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"er1": v1alpha1.RoleServer})
	boot := f.bootedOnClusterRelease(t)
	er1 := newSim(t, "er1", v1alpha1.RoleServer)
	er1.bootCtl = boot
	at := metav1.NewTime(time.Unix(1796700000, 0).UTC())
	rec := v1alpha1.EtcdRestoreStatus{Snapshot: "liken-er1-1796600000", Request: "1", At: at, Error: "no snapshot liken-er1-1796600000 on this server"}
	dir := filepath.Join(er1.dir, "state")
	os.MkdirAll(dir, 0o700)
	if err := state.SaveEtcdRestore(dir, rec); err != nil {
		t.Fatal(err)
	}
	rejoin := v1alpha1.EtcdRejoinStatus{Request: "2", At: at, MovedTo: "etcd-old-1796700000"}
	if err := state.SaveEtcdRejoin(dir, rejoin); err != nil {
		t.Fatal(err)
	}
	er1.boot(t, f)
	er1.start(t)
	f.waitFor(t, "er1", "status.etcdRestore says the failed restore", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		r := m.Status.EtcdRestore
		j := m.Status.EtcdRejoin
		return r != nil && r.Snapshot == rec.Snapshot && r.Request == "1" && r.At.Equal(&at) && r.Error == rec.Error &&
			j != nil && j.Request == "2" && j.MovedTo == rejoin.MovedTo && j.At.Equal(&at)
	})
}
