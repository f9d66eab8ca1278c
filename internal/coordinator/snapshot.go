package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/k3s"
)

// A server running an etcd member (k3s's etcd role label on its Node) is drained only once
// its agent took an etcd snapshot for the turn (internal/agent/snapshot.go) and its
// status.etcdSnapshot names the turn: the last state of the cluster before a control-plane
// machine is touched, on the machine, for restoring it should the quorum be lost.

// snapshotWait is what a server's drain still waits for before it begins: "" once the
// machine's snapshot for turn t is taken (or the machine runs no etcd member).
func (c *Coordinator) snapshotWait(t v1alpha1.Turn) string {
	o, ok, _ := c.nodes.GetByKey(t.Machine)
	if !ok || o.(*corev1.Node).Labels[k3s.EtcdRoleLabel] != "true" {
		return ""
	}
	var s *v1alpha1.EtcdSnapshotStatus
	if o, ok, _ := c.machines.GetByKey(t.Machine); ok {
		s = o.(*v1alpha1.Machine).Status.EtcdSnapshot
	}
	switch {
	case s == nil || !s.Turn.Equal(&t.Since):
		return "the machine has not reported its etcd snapshot for this turn yet"
	case s.Error != "":
		return "its etcd snapshot failed (tried again every minute): " + s.Error
	}
	return ""
}

// awaitSnapshot waits until snapshotWait has nothing left, looking every poll, and says
// why it stopped waiting: "" once the snapshot is taken; what it last waited for at the
// deadline (the drain is then blocked, as for pods that would not go).
func (c *Coordinator) awaitSnapshot(ctx context.Context, t v1alpha1.Turn, deadline time.Time, poll time.Duration, log *slog.Logger) (string, error) {
	said := ""
	for {
		why := c.snapshotWait(t)
		if why == "" {
			if said != "" {
				if o, ok, _ := c.machines.GetByKey(t.Machine); ok {
					s := o.(*v1alpha1.Machine).Status.EtcdSnapshot
					log.Info("etcd snapshot taken: draining", "snapshot", s.Name, "bytes", s.SizeBytes)
				}
			}
			return "", nil
		}
		if why != said {
			log.Info("waiting for the server's etcd snapshot before draining", "why", why)
			said = why
		}
		if !c.cfg.Now().Before(deadline) {
			return fmt.Sprintf("the drain did not begin: the server's etcd snapshot was not taken within the drain's timeout (%s)", why), nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(min(poll, max(time.Until(deadline), time.Millisecond))):
		}
	}
}
