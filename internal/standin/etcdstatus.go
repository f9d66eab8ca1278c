package standin

import (
	"context"
	"encoding/json"
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

// etcdCondition is the EtcdIsVoter condition k3s's leader gives a voting member whose
// status check gave healthErr (setEtcdStatusCondition): the stand-in's etcd is one member,
// this server's, never a learner.
func etcdCondition(healthErr error) corev1.NodeCondition {
	if healthErr != nil {
		// k3s puts the check's error in the message of an unhealthy member.
		return corev1.NodeCondition{Type: k3s.EtcdIsVoter, Status: corev1.ConditionFalse, Reason: k3s.EtcdReasonUnhealthy,
			Message: "failed to check etcd member status: " + healthErr.Error()}
	}
	return corev1.NodeCondition{Type: k3s.EtcdIsVoter, Status: corev1.ConditionTrue, Reason: k3s.EtcdReasonVoter, Message: k3s.EtcdMessageVoter}
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

// reportEtcd tells the cluster of this server's etcd member as k3s does: it labels the Node
// with the etcd role and annotates it with the member's name and address once, then sets
// its EtcdIsVoter condition from etcd's health every 15 s, until ctx ends. The Node may not
// be registered yet: until the first report lands, it tries every 2 s.
func reportEtcd(ctx context.Context, client kubernetes.Interface, name, address string, health func(context.Context) error, log io.Writer) {
	labelled, reported, said := false, false, ""
	for {
		err := func() error {
			if !labelled {
				patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
					"labels":      map[string]string{k3s.EtcdRoleLabel: "true"},
					"annotations": map[string]string{k3s.EtcdNodeNameAnnotation: name, k3s.EtcdNodeAddressAnnotation: address}}})
				if _, err := client.CoreV1().Nodes().Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
					return fmt.Errorf("labelling Node %s with the etcd role: %w", name, err)
				}
				labelled = true
			}
			n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			c := nextEtcdCondition(n.Status.Conditions, etcdCondition(health(ctx)), time.Now())
			if c == nil {
				return nil
			}
			// A strategic merge of the one condition, keyed by its type, as k3s writes it
			// (nodeHelper.SetNodeCondition): the kubelet's conditions stay.
			patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{*c}}})
			if _, err := client.CoreV1().Nodes().PatchStatus(ctx, name, patch); err != nil {
				return fmt.Errorf("setting Node %s's EtcdIsVoter condition: %w", name, err)
			}
			if c.LastTransitionTime.Equal(&c.LastHeartbeatTime) {
				fmt.Fprintf(log, "k3s-standin: etcd member %s: EtcdIsVoter %s (%s)\n", name, c.Status, c.Reason)
			}
			return nil
		}()
		if err == nil {
			reported, said = true, ""
		} else if ctx.Err() == nil && err.Error() != said {
			said = err.Error()
			fmt.Fprintf(log, "k3s-standin: etcd status: %v\n", err)
		}
		every := etcdStatusEvery
		if !reported {
			every = 2 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
