package vm

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/lab"
)

// workload is the lab's demo (lab.DemoName: a Deployment spread over the machines by a
// preferred anti-affinity, with a PodDisruptionBudget that keeps minAvailable of them), as an
// operator protects a service.
type workload struct {
	client       kubernetes.Interface
	name         string
	replicas     int32
	minAvailable int
}

// runningPods are the workload's pods whose containers run and are ready, by node.
func (w *workload) runningPods(ctx context.Context) (map[string]corev1.Pod, error) {
	pods, err := w.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name})
	if err != nil {
		return nil, err
	}
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && ready(&p) {
			out[p.Spec.NodeName] = p
		}
	}
	return out, nil
}

func ready(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitOnNodes waits until a pod of the workload runs on each node, its container really
// started (a container ID and start time from containerd) and its address in that node's pod
// CIDR (flannel's subnet), and returns the pods by node. bound comes from the ledger: pods
// started within 2 minutes of their machines being Ready in the lab under TCG.
func (w *workload) waitOnNodes(t *testing.T, nodes []string, bound time.Duration) map[string]corev1.Pod {
	t.Helper()
	var pods map[string]corev1.Pod
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 2*time.Second, bound, true, func(ctx context.Context) (bool, error) {
		pods, last = w.runningPods(ctx)
		if last != nil {
			return false, nil
		}
		for _, n := range nodes {
			p, ok := pods[n]
			if !ok {
				last = fmt.Errorf("no pod running on %s", n)
				return false, nil
			}
			node, err := w.client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				last = err
				return false, nil
			}
			_, cidr, err := net.ParseCIDR(node.Spec.PodCIDR)
			if err != nil || !cidr.Contains(net.ParseIP(p.Status.PodIP)) {
				return false, fmt.Errorf("pod %s on %s has address %q, outside its node's pod CIDR %q", p.Name, n, p.Status.PodIP, node.Spec.PodCIDR)
			}
			if len(p.Status.ContainerStatuses) != 1 || !strings.HasPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://") ||
				p.Status.ContainerStatuses[0].State.Running == nil {
				return false, fmt.Errorf("pod %s on %s: container %+v, want one running under containerd", p.Name, n, p.Status.ContainerStatuses)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%s's pods on %v: %v (last: %v)", w.name, nodes, err, last)
	}
	return pods
}

// watched is what availability saw of the workload's pods while it watched.
type watched struct {
	// fewest is the fewest pods ready at once, at when.
	fewest int
	at     time.Time
	// then describes the pods at that moment: which were not ready and why (their Ready
	// condition, a deletion), so a failure says whether a drain or something else did it.
	then string
	// fewestAtEviction is the fewest other pods ready when one was deleted (an eviction by
	// a drain: what a PodDisruptionBudget governs), with evictionThen describing them; -1
	// when none was deleted.
	fewestAtEviction int
	evictionThen     string
	// changes counts the changes seen.
	changes int
	// cameBack names, by node, the pods that became ready (where drained pods came back);
	// gone, the pods deleted (their kubelet stopped their containers, or their node is gone).
	cameBack map[string][]string
	gone     map[string]bool
}

// availability watches the workload's pods until stop is called, and returns then what it
// saw: the fewest ready at once, so a test proves its budget held throughout, where pods
// became ready and which were deleted. While the API is down (a server rebooting) nothing
// changes in it; a pod deleted meanwhile is missing from the list made after.
func (w *workload) availability(t *testing.T) (stop func() watched) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var mu sync.Mutex
	readyPods := map[string]bool{}
	last := map[string]*corev1.Pod{}
	seen := watched{fewest: int(w.replicas), fewestAtEviction: -1, cameBack: map[string][]string{}, gone: map[string]bool{}}
	watching := map[string]bool{} // pods seen ready when the watch began, or since
	listed := false
	// describe says how the pods are now, under mu.
	describe := func() string {
		var b strings.Builder
		for name, p := range last {
			fmt.Fprintf(&b, "%s on %q: ready %v", name, p.Spec.NodeName, readyPods[name])
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady {
					fmt.Fprintf(&b, " (Ready %s since %s, %s %s)", c.Status, c.LastTransitionTime.Format(time.TimeOnly), c.Reason, c.Message)
				}
			}
			if p.DeletionTimestamp != nil {
				fmt.Fprintf(&b, ", deleted at %s", p.DeletionTimestamp.Format(time.TimeOnly))
			}
			b.WriteString("; ")
		}
		return b.String()
	}
	// evicted records, as pod name is deleted (its deletion begins, or it is gone without
	// the watch having seen that), how many of the others are ready, under mu.
	evicted := func(name string) {
		n := 0
		for other, r := range readyPods {
			if r && other != name {
				n++
			}
		}
		if seen.fewestAtEviction < 0 || n < seen.fewestAtEviction {
			seen.fewestAtEviction, seen.evictionThen = n, name+" deleted; "+describe()
		}
	}
	// update records pod name's state (p nil: deleted), under mu.
	update := func(name string, p *corev1.Pod) {
		if old := last[name]; listed && (p == nil && old != nil && old.DeletionTimestamp == nil || p != nil && p.DeletionTimestamp != nil && (old == nil || old.DeletionTimestamp == nil)) {
			evicted(name)
		}
		if p == nil {
			delete(readyPods, name)
			delete(last, name)
			seen.gone[name] = true
		} else {
			last[name] = p.DeepCopy()
			readyPods[name] = p.DeletionTimestamp == nil && ready(p)
			if readyPods[name] && !watching[name] {
				watching[name] = true
				if listed {
					seen.cameBack[p.Spec.NodeName] = append(seen.cameBack[p.Spec.NodeName], name)
				}
			}
		}
	}
	// counted records how many are ready now, after a change or a list, under mu.
	counted := func() {
		n := 0
		for _, r := range readyPods {
			if r {
				n++
			}
		}
		if n < seen.fewest {
			seen.fewest, seen.at = n, time.Now()
			seen.then = describe()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		rv := ""
		for ctx.Err() == nil {
			if rv == "" {
				pods, err := w.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name})
				if err != nil {
					time.Sleep(2 * time.Second)
					continue
				}
				mu.Lock()
				now := map[string]bool{}
				for i := range pods.Items {
					now[pods.Items[i].Name] = true
					update(pods.Items[i].Name, &pods.Items[i])
				}
				for name := range readyPods {
					if !now[name] {
						update(name, nil)
					}
				}
				counted()
				listed = true
				mu.Unlock()
				rv = pods.ResourceVersion
			}
			watch, err := w.client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name, ResourceVersion: rv})
			if err != nil {
				rv = ""
				time.Sleep(2 * time.Second)
				continue
			}
			for ev := range watch.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					rv = "" // an error event (resource version too old): list again
					break
				}
				rv = p.ResourceVersion
				mu.Lock()
				if ev.Type == "DELETED" {
					update(p.Name, nil)
				} else {
					update(p.Name, p)
				}
				counted()
				seen.changes++
				mu.Unlock()
			}
			watch.Stop()
		}
	}()
	return func() watched {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// waitRunning waits until the workload's replicas all run and are ready, wherever, and
// returns them.
func (w *workload) waitRunning(t *testing.T, bound time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 2*time.Second, bound, true, func(ctx context.Context) (bool, error) {
		list, err := w.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + w.name})
		if err != nil {
			return false, nil
		}
		pods = nil
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && ready(&p) {
				pods = append(pods, p)
			}
		}
		return len(pods) == int(w.replicas), nil
	})
	if err != nil {
		t.Fatalf("%s: %d of its %d pods running after %s", w.name, len(pods), w.replicas, bound)
	}
	return pods
}

// podsOn names the pods by node, for messages.
func podsOn(pods map[string]corev1.Pod) string {
	var out []string
	for n, p := range pods {
		out = append(out, fmt.Sprintf("%s on %s (%s, %s)", p.Name, n, p.Status.PodIP, p.Status.ContainerStatuses[0].ContainerID))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// k3sRestartKeepsPods edits the Cluster's registries (a mirror), which restarts k3s in place
// on every machine (the change's class), and checks that the workload's containers kept
// running through it, as with k3s: each machine's agent records RestartedK3s, and then the
// same pods run the same containers (IDs and start times), none restarted.
func k3sRestartKeepsPods(t *testing.T, lc *kube.Client, admin kubernetes.Interface, w *workload, before map[string]corev1.Pod) {
	t.Helper()
	// Counted, not dated: the machines' clocks are not the host's.
	restarts := func(ctx context.Context) (map[string]int32, error) {
		events, err := admin.CoreV1().Events(authority.EventNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=RestartedK3s"})
		if err != nil {
			return nil, err
		}
		n := map[string]int32{}
		for _, e := range events.Items {
			n[e.InvolvedObject.Name] += max(e.Count, 1)
		}
		return n, nil
	}
	var was map[string]int32
	eventually(t, "counting k3s's restarts so far", func(ctx context.Context) (err error) { was, err = restarts(ctx); return err })
	eventually(t, "adding a registry mirror to the Cluster", func(ctx context.Context) error {
		c, err := lc.Cluster(ctx)
		if err != nil {
			return err
		}
		if c.Spec.Registries == nil {
			c.Spec.Registries = &v1alpha1.Registries{}
		}
		c.Spec.Registries.Mirrors = append(c.Spec.Registries.Mirrors, v1alpha1.RegistryMirror{Registry: "registry.liken.test", Endpoints: []string{"http://10.0.2.2:5000"}})
		_, err = lc.UpdateCluster(ctx, c)
		return err
	})
	// Bound: a server's k3s restart brings its control plane back, about a minute under TCG.
	var now map[string]int32
	err := wait.PollUntilContextTimeout(t.Context(), 2*time.Second, 6*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := restarts(ctx)
		if err != nil {
			return false, nil // the server's API is down while its k3s restarts
		}
		now = got
		for n := range before {
			if now[n] <= was[n] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the registries edit did not restart k3s on every machine within 6 minutes (RestartedK3s Events before %v, after %v)", was, now)
	}
	nodes := make([]string, 0, len(before))
	for n := range before {
		nodes = append(nodes, n)
	}
	after := w.waitOnNodes(t, nodes, 4*time.Minute)
	for n, p := range after {
		b := before[n]
		was, now := b.Status.ContainerStatuses[0], p.Status.ContainerStatuses[0]
		if p.UID != b.UID || now.ContainerID != was.ContainerID || !now.State.Running.StartedAt.Equal(&was.State.Running.StartedAt) || now.RestartCount != 0 {
			t.Errorf("on %s, k3s's restart in place did not keep the container running: before %s %s started %s, after %s %s started %s (restarts %d)",
				n, b.Name, was.ContainerID, was.State.Running.StartedAt, p.Name, now.ContainerID, now.State.Running.StartedAt, now.RestartCount)
		}
	}
	t.Logf("k3s restarted in place on %v; the same containers run: %s", nodes, podsOn(after))
}

// prober sends a request to the demo's NodePort every half second, as an external load
// balancer with health checks would: to one machine's forwarded port, and on no answer
// within 5 seconds (a machine rebooting, or one whose pod was drained: its node port drops
// the traffic, which stays local) to the next, until one answers. A request no machine
// answered is lost.
type prober struct {
	stop func() probeStats
}

type probeStats struct {
	sent, lost int
	// longestGap is the longest time between two answered requests.
	longestGap time.Duration
	// firstLost says when the first lost request was sent, and what each machine said.
	firstLost string
}

func (s probeStats) String() string {
	return fmt.Sprintf("%d requests, %d answered by no machine, longest time without an answer %s", s.sent, s.lost, s.longestGap.Round(10*time.Millisecond))
}

// probe starts a prober of the demo on ports (one per machine, the lab's DemoPorts).
func probe(t *testing.T, ports []int) *prober {
	ctx, cancel := context.WithCancel(t.Context())
	var st probeStats
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := time.Now()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var why []string
			answered := false
			for j := range ports {
				port := ports[(i+j)%len(ports)] // the first machine asked takes turns
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				a, err := lab.DemoAnswer(rctx, port, "/")
				rcancel()
				if err == nil && strings.HasPrefix(a, "liken-demo: pod ") {
					answered = true
					break
				}
				why = append(why, fmt.Sprintf("port %d: %v %q", port, err, a))
			}
			if ctx.Err() != nil {
				return
			}
			st.sent++
			now := time.Now()
			if answered {
				st.longestGap = max(st.longestGap, now.Sub(last))
				last = now
			} else {
				st.lost++
				if st.firstLost == "" {
					st.firstLost = now.Format(time.TimeOnly) + ": " + strings.Join(why, "; ")
				}
			}
		}
	}()
	return &prober{stop: func() probeStats {
		cancel()
		<-done
		return st
	}}
}

// demoReachesTheCluster asks the demo's pods, through each machine's forwarded node port,
// for what only the cluster's own networking answers: the Service's name through cluster DNS
// (CoreDNS as k3s deploys it), the Service by that name, and the pod on the other machine by
// its address (flannel's vxlan between the machines).
func demoReachesTheCluster(t *testing.T, client kubernetes.Interface, ports map[string]int, pods map[string]corev1.Pod) {
	t.Helper()
	var svc *corev1.Service
	eventually(t, "reading Service "+lab.DemoName, func(ctx context.Context) (err error) {
		svc, err = client.CoreV1().Services("default").Get(ctx, lab.DemoName, metav1.GetOptions{})
		return err
	})
	name := lab.DemoName + ".default.svc.cluster.local"
	// Bound: CoreDNS's image is imported after the kubelet starts and its pod scheduled
	// once the server's deploy applies coredns.yaml; a minute or two under TCG.
	for node, port := range ports {
		var got string
		err := wait.PollUntilContextTimeout(t.Context(), 2*time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
			a, err := lab.DemoAnswer(ctx, port, "/lookup?name="+name)
			got = fmt.Sprint(a, err)
			return err == nil && a == svc.Spec.ClusterIP, nil
		})
		if err != nil {
			t.Errorf("the pod on %s looked %s up: %s; want its ClusterIP %s", node, name, got, svc.Spec.ClusterIP)
			continue
		}
		if a, err := fetchFrom(t, node, port, "http://"+name+"/", func(a string) bool { return strings.HasPrefix(a, "liken-demo: pod ") }); err != nil {
			t.Errorf("the pod on %s fetched http://%s/: %q %v", node, name, a, err)
		}
		for other, p := range pods {
			if other == node {
				continue
			}
			want := "liken-demo: pod " + p.Name + " on node " + other
			if a, err := fetchFrom(t, node, port, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/", func(a string) bool { return a == want }); err != nil {
				t.Errorf("the pod on %s fetched the pod on %s at %s: %q %v; want %q", node, other, p.Status.PodIP, a, err, want)
			}
		}
	}
}

// fetchFrom has the demo's pod on node (through its NodePort on the host's port) fetch url,
// until the answer is right or two minutes have passed, and returns the last answer. Each
// try passes through the host's port forward, a NodePort and a pod, and then across the
// pod network: under emulation, beside other machines, one such try outlived a 5-second
// bound in CI while the next ones answered (December 2026). The ledger line says how long
// it took.
func fetchFrom(t *testing.T, node string, port int, url string, ok func(string) bool) (string, error) {
	t.Helper()
	var a string
	var last error
	err := waitUntil(t, "the pod on "+node+" fetching "+url, 2*time.Second, 2*time.Minute, func(ctx context.Context) (bool, error) {
		// Longer than the demo's own 10 s for the fetch it makes.
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		a, last = lab.DemoAnswer(ctx, port, "/get?url="+url)
		return last == nil && ok(a), nil
	})
	if err != nil && last != nil {
		err = fmt.Errorf("%w (last error: %v)", err, last)
	}
	return a, err
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// metricsThroughTheCluster scrapes the machines' agent metrics (port 9470, TLS, the API
// server deciding who may) from the demo's pod on the other machine, with the pod's
// ServiceAccount token, as a Prometheus in the cluster does: the agent's refused while RBAC
// does not let that ServiceAccount get /metrics, the server's served once a
// ClusterRoleBinding does (docs/metrics.md), its agent's and its coordinator's metrics
// both. The served scrape is of the other machine: the refused one's answer stays in its
// agent's review cache for 30 s, which the lab test need not wait out (the cache has tests
// of its own, internal/metrics).
func metricsThroughTheCluster(t *testing.T, client kubernetes.Interface, ports map[string]int) {
	t.Helper()
	ips := map[string]string{}
	eventually(t, "reading the Nodes' addresses", func(ctx context.Context) error {
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range nodes.Items {
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					ips[n.Name] = a.Address
				}
			}
		}
		return nil
	})
	scrape := func(from, of, want string) string {
		t.Helper()
		target := "https://" + net.JoinHostPort(ips[of], "9470") + "/metrics"
		path := "/get?url=" + url.QueryEscape(target) + "&token=serviceaccount&insecure=1"
		var a string
		var last error
		if err := waitUntil(t, "the pod on "+from+" scraping "+target+" for "+want, 2*time.Second, 2*time.Minute, func(ctx context.Context) (bool, error) {
			ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			a, last = lab.DemoAnswer(ctx, ports[from], path)
			return strings.Contains(a, want) || (last != nil && strings.Contains(last.Error(), want)), nil
		}); err != nil {
			t.Errorf("the pod on %s scraping %s's metrics: %v; last answer %.300q, error %v; want %q", from, of, err, a, last, want)
		}
		return a
	}
	// Refused: the pods' ServiceAccount (default/default) may not get /metrics.
	scrape("lab-server-1", "lab-agent-1", "403 Forbidden: Forbidden: system:serviceaccount:default:default may not get /metrics")
	eventually(t, "letting default/default read the metrics", func(ctx context.Context) error {
		_, err := client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "liken-metrics-reader"},
			Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "demo-liken-metrics"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "liken-metrics-reader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: "default"}}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
	if a := scrape("lab-agent-1", "lab-server-1", "liken_coordinator_leader"); !strings.Contains(a, "liken_agent_status_writes_total") {
		t.Errorf("the server's metrics hold its coordinator's but not its agent's: %.300q", a)
	}
}
