package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/internal/host/k3s"
)

// k3s's etcd leader checks its members every 15 s (manageTickerTime) and refreshes an
// unchanged EtcdIsVoter condition every 5 minutes (heartbeatInterval), pkg/etcd/etcd.go.
const (
	etcdStatusEvery    = 15 * time.Second
	etcdHeartbeatEvery = 5 * time.Minute
)

// etcdCondition is the EtcdIsVoter condition k3s's leader gives a member's Node
// (setEtcdStatusCondition): a voter whose status check passed, a learner, a member whose
// check failed (its error in the message), or no member (ok false: the Node names a member
// the cluster does not have).
func etcdCondition(s memberState, ok bool) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: k3s.EtcdIsVoter, Status: corev1.ConditionFalse}
	switch {
	case !ok:
		c.Reason, c.Message = k3s.EtcdReasonNotAMember, "Node is not a member of the etcd cluster"
	case s.learner:
		c.Reason, c.Message = k3s.EtcdReasonLearner, "Node has not been promoted from learner to voting member"
	case s.health != nil:
		c.Reason, c.Message = k3s.EtcdReasonUnhealthy, "failed to check etcd member status: "+s.health.Error()
	default:
		c.Status, c.Reason, c.Message = corev1.ConditionTrue, k3s.EtcdReasonVoter, k3s.EtcdMessageVoter
	}
	return c
}

// nextEtcdCondition is what to write over the Node's conditions for want at now, as k3s
// does: nothing while an unchanged condition's heartbeat is younger than 5 minutes, a new
// heartbeat when older, a new transition when it changed.
func nextEtcdCondition(conds []corev1.NodeCondition, want corev1.NodeCondition, now time.Time) *corev1.NodeCondition {
	t := metav1.NewTime(now)
	if i := slices.IndexFunc(conds, func(c corev1.NodeCondition) bool { return c.Type == k3s.EtcdIsVoter }); i >= 0 {
		old := conds[i]
		if old.Status == want.Status && old.Reason == want.Reason && old.Message == want.Message {
			if now.Sub(old.LastHeartbeatTime.Time) < etcdHeartbeatEvery {
				return nil
			}
			old.LastHeartbeatTime = t
			return &old
		}
	}
	want.LastHeartbeatTime, want.LastTransitionTime = t, t
	return &want
}

// reportEtcd tells the cluster of the etcd members as k3s does: this server labels its own
// Node with the etcd role and annotates it with its member's name and address once
// (metadata_controller.go handleSelf), and every 15 s, where check finds this member the
// leader, sets EtcdIsVoter on every Node with the etcd role from the leader's view of its
// member (the Node's node-name annotation), until ctx ends. The Node may not be registered
// yet: until the first label lands, it tries every 2 s.
func reportEtcd(ctx context.Context, client kubernetes.Interface, node, member, address string, check func(context.Context) (etcdView, error), log io.Writer) {
	labelled, said := false, ""
	for {
		err := func() error {
			if !labelled {
				patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
					"labels":      map[string]string{k3s.EtcdRoleLabel: "true"},
					"annotations": map[string]string{k3s.EtcdNodeNameAnnotation: member, k3s.EtcdNodeAddressAnnotation: address}}})
				if _, err := client.CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
					return fmt.Errorf("labelling Node %s with the etcd role: %w", node, err)
				}
				labelled = true
			}
			v, err := check(ctx)
			if err != nil || !v.leader {
				return err
			}
			nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: k3s.EtcdRoleLabel + "=true"})
			if err != nil {
				return err
			}
			var errs []error
			for _, n := range nodes.Items {
				s, ok := v.members[n.Annotations[k3s.EtcdNodeNameAnnotation]]
				c := nextEtcdCondition(n.Status.Conditions, etcdCondition(s, ok), time.Now())
				if c == nil {
					continue
				}
				// A strategic merge of the one condition, keyed by its type, as k3s writes it
				// (nodeHelper.SetNodeCondition): the kubelet's conditions stay.
				patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{*c}}})
				if _, err := client.CoreV1().Nodes().PatchStatus(ctx, n.Name, patch); err != nil {
					errs = append(errs, fmt.Errorf("setting Node %s's EtcdIsVoter condition: %w", n.Name, err))
					continue
				}
				if c.LastTransitionTime.Equal(&c.LastHeartbeatTime) {
					fmt.Fprintf(log, "k3s-standin: etcd member of Node %s: EtcdIsVoter %s (%s)\n", n.Name, c.Status, c.Reason)
				}
			}
			return errors.Join(errs...)
		}()
		if err == nil {
			said = ""
		} else if ctx.Err() == nil && err.Error() != said {
			said = err.Error()
			fmt.Fprintf(log, "k3s-standin: etcd status: %v\n", err)
		}
		every := etcdStatusEvery
		if !labelled {
			every = 2 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
