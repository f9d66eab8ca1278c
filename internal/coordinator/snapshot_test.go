package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/k3s"
)

// TestServerDrainWaitsForItsEtcdSnapshot (issue 28 item 4), against the real API server: a
// server whose Node carries k3s's etcd role is not cordoned on its turn until its Machine's
// status.etcdSnapshot names that turn (a failed snapshot, or one taken for an earlier turn,
// does not count); once it does, the drain runs and the machine reboots. An agent, with no
// etcd member, is drained at once. A snapshot that never comes blocks the drain at its
// timeout, saying why, the Node never cordoned.
func TestServerDrainWaitsForItsEtcdSnapshot(t *testing.T) {
	budget := intstr.FromInt32(2)
	f := newFleet(t, func(s *v1alpha1.ClusterSpec) {
		s.DisruptionBudget.MaxUnavailable = &budget
		s.Drain.Timeout = &metav1.Duration{Duration: 10 * time.Second}
	}, map[string]v1alpha1.Role{"sn1": v1alpha1.RoleServer, "sn2": v1alpha1.RoleAgent})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n := f.node("sn1")
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[k3s.EtcdRoleLabel] = "true"
		_, err := f.admin.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cordons := f.watchCordons()
	agents := f.agents(300*time.Millisecond, "sn1", "sn2")
	f.coordinator("ctl-sn", true)
	turnOf := func(machine string) *v1alpha1.Turn {
		for _, tn := range f.cluster().Status.Turns {
			if tn.Machine == machine {
				return &tn
			}
		}
		return nil
	}
	agents["sn1"].ask()
	agents["sn2"].ask()
	f.waitFor("the agent sn2 drained and rebooted, and sn1 holding a turn", 30*time.Second, func() bool {
		return agents["sn2"].reboots.Load() == 1 && turnOf("sn1") != nil
	})
	turn := turnOf("sn1")
	// Held, not cordoned, with nothing reported; then with a failed snapshot for the turn.
	for _, snap := range []*v1alpha1.EtcdSnapshotStatus{nil, {Turn: turn.Since, Error: "the test's snapshot failed"}} {
		if snap != nil {
			agents["sn1"].writeStatus(func(s *v1alpha1.MachineStatus) { s.EtcdSnapshot = snap })
		}
		time.Sleep(1500 * time.Millisecond)
		if cordons()["sn1"] || agents["sn1"].reboots.Load() != 0 {
			t.Fatalf("sn1 was cordoned or rebooted before its etcd snapshot (reported: %+v)", snap)
		}
		if tn := turnOf("sn1"); tn == nil || tn.Phase != v1alpha1.TurnDraining {
			t.Fatalf("sn1's turn while its snapshot is awaited: %+v", tn)
		}
	}
	agents["sn1"].writeStatus(func(s *v1alpha1.MachineStatus) {
		at := metav1.Now()
		s.EtcdSnapshot = &v1alpha1.EtcdSnapshotStatus{Turn: turn.Since, For: "release 2026.07.20-002", Name: "liken-sn1-1796600000", SizeBytes: 4 << 20, TakenAt: &at}
	})
	f.waitFor("sn1 drained and rebooted once its snapshot names its turn", 30*time.Second, func() bool {
		return agents["sn1"].reboots.Load() == 1 && cordons()["sn1"] && len(f.cluster().Status.Turns) == 0
	})

	// The next turn: the snapshot on record is the last turn's, and none comes for this one.
	f.setCordon("sn1", false)
	cordons = f.watchCordons()
	agents["sn1"].ask()
	f.waitFor("sn1's drain blocked at its timeout for want of a snapshot", 40*time.Second, func() bool {
		for _, b := range f.cluster().Status.DrainBlocked {
			if b.Machine == "sn1" {
				if !strings.Contains(b.Message, "etcd snapshot was not taken within the drain's timeout") || !strings.Contains(b.Message, "has not reported its etcd snapshot for this turn") {
					t.Errorf("the blocked drain's message: %s", b.Message)
				}
				return true
			}
		}
		return false
	})
	if agents["sn1"].reboots.Load() != 1 || cordons()["sn1"] {
		t.Errorf("sn1 rebooted %d times, cordoned %v: its second turn, without a snapshot, must do neither", agents["sn1"].reboots.Load(), cordons()["sn1"])
	}
}
