package agent

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/test/apiserver"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// newRequestLog records what an idle component sends besides its watches and the
// coordinator's election (apiserver.RequestLog).
func newRequestLog() *apiserver.RequestLog {
	return &apiserver.RequestLog{LeasePath: "/apis/coordination.k8s.io/v1/namespaces/" + v1alpha1.SecretNamespace + "/leases/" + authority.LeaseName}
}

// TestIdleMachinesOnlyWatch: a settled server, whose agent runs the reboot coordinator and
// leads, and a settled agent machine send no API request but their watches and the
// coordinator's Lease renewals, while their kubelets report their Nodes again (as a kubelet
// does every few minutes with nothing changed) and each agent and the coordinator
// reconcile on every report. A loop that reads or writes on every pass fails here.
func TestIdleMachinesOnlyWatch(t *testing.T) {
	machines := map[string]v1alpha1.Role{"quiet-s1": v1alpha1.RoleServer, "quiet-a1": v1alpha1.RoleAgent}
	f := setupFleet(t, machines)
	logs := map[string]*apiserver.RequestLog{}
	sims := map[string]*sim{}
	for n, role := range machines {
		s := newSim(t, n, role)
		sims[n] = s
		boot := f.bootedOnClusterRelease(t)
		// Init reports the boot time to the second (internal/initd), as the API keeps it in
		// status. The fake boot's is finer, and the agent, which compares the status it
		// would write with the one it read back, then wrote the same status on every pass.
		boot.mu.Lock()
		boot.info.BootTime = boot.info.BootTime.UTC().Truncate(time.Second)
		boot.mu.Unlock()
		s.bootCtl = boot
		s.coordinator = s.role == v1alpha1.RoleServer
		logs[n] = newRequestLog()
		s.wrap = logs[n].Wrap
		s.boot(t, f)
		s.start(t)
		t.Cleanup(s.stop)
	}
	for n := range logs {
		f.waitFor(t, n, "Ready on its release, nothing pending", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return condTrue(m, v1alpha1.MachineReady) && m.Status.Release != nil && len(m.Status.Pending) == 0 && m.Status.Reboot.State == v1alpha1.RebootNone
		})
	}
	waitCount(t, "quiet-s1 leading reboot coordination", func() bool {
		c, err := f.liken.Cluster(t.Context())
		return err == nil && c.Status.Coordinator == "quiet-s1"
	})
	time.Sleep(3 * time.Second) // what they wrote last seen back through their watches

	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for n := range logs {
				f.reportNode(t, n)
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	requests, renewals := map[string]int{}, map[string]int{}
	passes := map[string]uint64{}
	for n, l := range logs {
		requests[n], renewals[n] = l.Mark()
		passes[n] = sims[n].passes()
	}
	const window = 6 * time.Second
	time.Sleep(window)
	stop()
	wg.Wait()
	// The reports reached the agents: each reconciled on them, and sent nothing.
	for n, s := range sims {
		if got := s.passes() - passes[n]; got == 0 {
			t.Errorf("%s did not reconcile once in %s of Node reports every 500 ms: its silence shows nothing", n, window)
		}
	}
	for n, l := range logs {
		got := l.Since(requests[n])
		for _, r := range got {
			t.Errorf("idle, %s sent %s", n, r)
		}
		if len(got) > 0 {
			t.Errorf("%s: %d requests in %s besides its watches and the coordinator's Lease; want none", n, len(got), window)
		}
	}
	// The logs are in the agents' paths (the server's saw its coordinator's renewals) and
	// the agents still answer: an edit is applied and reported.
	if r := logs["quiet-s1"].RenewedSince(renewals["quiet-s1"]); r == 0 {
		t.Errorf("no Lease renewal went through quiet-s1's request log in %s", window)
	}
	for n, l := range logs {
		before, _ := l.Mark()
		f.editMachine(n, func(m *v1alpha1.Machine) { m.Spec.NodeLabels = map[string]v1alpha1.LabelValue{"idle-test": "done"} })
		f.waitFor(t, n, "the label applied", func(m *v1alpha1.Machine, node *corev1.Node) bool {
			return node.Labels["idle-test"] == "done" && m.Status.AppliedGeneration == m.Generation
		})
		if len(l.Since(before)) == 0 {
			t.Errorf("%s applied an edit without a request through its request log", n)
		}
	}
}

// reportNode reports a Node's status again with a new heartbeat time, as its kubelet does.
func (f *fixture) reportNode(t *testing.T, name string) {
	if err := apiserver.Heartbeat(context.Background(), f.admin, name); err != nil {
		t.Errorf("reporting Node %s: %v", name, err)
	}
}
