package agent

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/k3s"
)

// A server running an etcd member takes an etcd snapshot for each of its disruption-budget
// turns, before its drain, as an operator would before touching a control-plane machine
// (issue 28): its turn's drain waits until the Machine's status.etcdSnapshot names the turn
// (internal/coordinator). k3s takes it (`k3s etcd-snapshot save --name liken`), into its
// snapshot directory, under its retention.

// snapshotTimeout bounds one try: a snapshot of a small cluster's etcd takes seconds.
const snapshotTimeout = 3 * time.Minute

// snapshotRetry is how long a failed snapshot waits before the next try.
func (a *Agent) snapshotRetry() time.Duration {
	if a.cfg.SnapshotRetry > 0 {
		return a.cfg.SnapshotRetry
	}
	return time.Minute
}

// heldDrainingTurn is this machine's turn being drained for exactly the pending set hash.
func heldDrainingTurn(c *v1alpha1.Cluster, machine, hash string) *v1alpha1.Turn {
	for i, t := range c.Status.Turns {
		if t.Machine == machine && t.ReleasedBy == "" && t.Phase == v1alpha1.TurnDraining && t.PendingHash == hash {
			return &c.Status.Turns[i]
		}
	}
	return nil
}

// etcdMember: k3s labels the Node of a server running an etcd member with the etcd role.
func etcdMember(node *corev1.Node) bool {
	return node != nil && node.Labels[k3s.EtcdRoleLabel] == "true"
}

// snapshotFor says what a turn for the pending set is for, in words.
func snapshotFor(pending []v1alpha1.PendingChange, hash string) string {
	for _, p := range pending {
		if p.Field == "cluster.spec.version" && p.To != "" {
			return "release " + p.To
		}
	}
	return "pending set " + hash
}

// snapshotForTurn takes the snapshot this server's turn waits for: once per turn, while
// the turn is being drained for exactly the pending set, again a minute after a failure. It
// returns what status.etcdSnapshot says (nil: leave it as it is).
func (a *Agent) snapshotForTurn(ctx context.Context, m *v1alpha1.Machine, c *v1alpha1.Cluster, node *corev1.Node, pending []v1alpha1.PendingChange, hash string) *v1alpha1.EtcdSnapshotStatus {
	if m.Spec.Role != v1alpha1.RoleServer || !etcdMember(node) {
		return nil
	}
	turn := heldDrainingTurn(c, a.cfg.Machine, hash)
	if turn == nil {
		return nil
	}
	last := a.snapshot
	if last == nil {
		last = m.Status.EtcdSnapshot
	}
	if last != nil && last.Turn.Equal(&turn.Since) {
		if last.Error == "" {
			return last
		}
		if wait := a.snapshotRetry() - a.cfg.Now().Sub(a.snapshotTried); !a.snapshotTried.IsZero() && wait > 0 {
			a.queue.AddAfter(keyReconcile, wait)
			return last
		}
	}
	take := a.cfg.Snapshot
	if take == nil {
		take = a.k3sSnapshot
	}
	start := a.cfg.Now()
	tctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	s, err := take(tctx)
	cancel()
	a.snapshotTried = a.cfg.Now()
	st := &v1alpha1.EtcdSnapshotStatus{Turn: turn.Since, For: snapshotFor(pending, hash)}
	if err != nil {
		st.Error = err.Error()
		a.log.Warn("etcd snapshot before the drain failed; the drain waits, and it is tried again", "err", err, "in", a.snapshotRetry())
		a.events.Eventf(m, corev1.EventTypeWarning, "EtcdSnapshotFailed", "the etcd snapshot for the turn given at %s failed (tried again in %s; the drain waits): %v", turn.Since.UTC().Format(time.RFC3339), a.snapshotRetry(), err)
		a.queue.AddAfter(keyReconcile, a.snapshotRetry())
	} else {
		at := metav1.NewTime(s.At)
		st.Name, st.SizeBytes, st.TakenAt = s.Name, s.Size, &at
		took := a.cfg.Now().Sub(start).Round(time.Millisecond)
		a.log.Info("etcd snapshot taken before the drain", "snapshot", s.Path, "bytes", s.Size, "took", took, "for", st.For)
		a.events.Eventf(m, corev1.EventTypeNormal, "EtcdSnapshotTaken", "etcd snapshot %s (%d bytes) taken in %s before the drain, for %s", s.Name, s.Size, took, st.For)
	}
	a.snapshot = st
	return st
}

// k3sSnapshot is the snapshot as an operator takes one on a server: `k3s etcd-snapshot save
// --name liken`, then `prune --name liken`, which keeps k3s's retention of liken's
// snapshots (a prune that fails leaves more snapshots than the retention, and is said).
func (a *Agent) k3sSnapshot(ctx context.Context) (k3s.Snapshot, error) {
	s, err := k3s.SaveSnapshot(ctx, "/usr/bin/k3s", a.cfg.K3sPaths.DataDir, a.cfg.Machine, k3s.SnapshotName)
	if err != nil {
		return s, err
	}
	if err := k3s.PruneSnapshots(ctx, "/usr/bin/k3s", k3s.SnapshotName); err != nil {
		a.log.Warn("pruning liken's etcd snapshots to k3s's retention", "err", err)
	}
	return s, nil
}
