package agent

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
)

// peersToWaitFor names the machines a server's trial of new network settings waits for: the
// other Nodes Ready now. A server's agent reaches its own k3s over loopback, so its Node
// Ready proves nothing about an address the others cannot reach; one of them reaching this
// server does. None for an agent (it reaches a remote API server already), for a trial that
// keeps the network, or for a lone server.
func (a *Agent) peersToWaitFor(ctx context.Context, m *v1alpha1.Machine, v *upgradeView) []string {
	if m.Spec.Role != v1alpha1.RoleServer || v.trialSettings == "" || !slices.Contains(a.trialFields(m), "machine.spec.network") {
		return nil
	}
	nodes, err := a.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		a.log.Warn("listing Nodes for the network trial's peers; the trial waits for none", "err", err)
		return nil
	}
	var peers []string
	for _, n := range nodes.Items {
		if n.Name != a.cfg.Machine && kube.NodeReady(&n) {
			peers = append(peers, n.Name)
		}
	}
	sort.Strings(peers)
	return peers
}

// peersReach says what the trial still waits for ("" once a peer reached this server): a
// peer's kubelet renewing its Lease in kube-node-lease after this agent first looked. The
// renewal is a write this server's API server took (or, with several servers, its
// datastore), so it proves the peer reaches this machine on the network it boots with; the
// Lease's resourceVersion is compared, not its time, so no clock is trusted. A server that
// may not read Leases (RBAC from a layer built before this check: Forbidden) cannot tell,
// and waits for nothing, as before; any other error keeps it waiting.
func (a *Agent) peersReach(ctx context.Context, peers []string) string {
	if a.peerLeases == nil {
		a.peerLeases = map[string]string{}
	}
	for _, p := range peers {
		l, err := a.kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, p, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if apierrors.IsForbidden(err) {
			a.log.Warn("may not read the peers' Node Leases; the network trial commits on this server's own health", "err", err)
			return ""
		}
		if err != nil {
			// Not evidence either way (the API server busy, a timeout): an error read on
			// the new network is no reason to commit it.
			return fmt.Sprintf("reading %s's Node Lease: %v", p, err)
		}
		if d := l.Spec.LeaseDurationSeconds; d != nil && *d > a.peerLeaseSeconds {
			a.peerLeaseSeconds = *d
		}
		seen, ok := a.peerLeases[p]
		if ok && seen != l.ResourceVersion {
			return ""
		}
		if !ok {
			a.peerLeases[p] = l.ResourceVersion
		}
	}
	return fmt.Sprintf("no other machine has reached this server on its new network since it booted (none of %s renewed its Node Lease through it)", strings.Join(peers, ", "))
}

// peerWait is how long a trial healthy on its own waits for a peer (Config.PeerWait): by
// default three of the peers' Lease durations. A peer whose kubelet has not renewed its
// Lease through this server for that long is one the cluster takes for lost; three leave
// its kubelet room to find the server again after the reboot (its Lease renewals retry
// within seconds, and it renews every quarter of the duration). Init's deadline still
// bounds the whole trial.
func (a *Agent) peerWait() time.Duration {
	if a.cfg.PeerWait > 0 {
		return a.cfg.PeerWait
	}
	d := a.peerLeaseSeconds
	if d <= 0 {
		d = 40 // the kubelet's default nodeLeaseDurationSeconds
	}
	return 3 * time.Duration(d) * time.Second
}
