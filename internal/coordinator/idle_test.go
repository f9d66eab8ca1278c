package coordinator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/test/apiserver"
)

// newRequestLog records what an idle component sends besides its watches and the
// coordinator's election (apiserver.RequestLog).
func newRequestLog() *apiserver.RequestLog {
	return &apiserver.RequestLog{LeasePath: "/apis/coordination.k8s.io/v1/namespaces/" + v1alpha1.SecretNamespace + "/leases/" + authority.LeaseName}
}

// TestIdleCoordinatorOnlyWatches: a leader with nothing to do sends no API request but its
// watches and its Lease renewals, while the fleet goes on as an idle fleet does (kubelets
// report their Nodes, agents the clocks they set) and the leader plans again on each of
// those changes and on every Resync. A loop that reads or writes on each plan (the
// machines' Secrets Role was read twenty times a second with a thousand machines) fails
// here, instead of showing only as a figure of BenchmarkIdle.
func TestIdleCoordinatorOnlyWatches(t *testing.T) {
	const n = 20
	f := newFleet(t, nil, machines("quiet", n, v1alpha1.RoleAgent))
	log := newRequestLog()
	f.coordinatorWith("srv-quiet", true, func(c *Config) {
		c.REST.Wrap(log.Wrap)
		// The usual election timing, not the tests' quick one: a loaded machine missing a
		// 2 s renewal deadline would lead anew and list its caches again.
		c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	})
	f.waitFor("the coordinator leading and counting the fleet", time.Minute, func() bool {
		st := f.cluster().Status
		return st.Coordinator == "srv-quiet" && st.Machines == n && countsUnavailable(st, 0, n)
	})
	time.Sleep(2 * time.Second) // its own status write seen back through its watch

	// Each Node and each Machine changes about every 2 s: the leader plans on every change.
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			name := f.names[i%n]
			f.heartbeat(name)
			f.clockSet(name)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	requests, renewals := log.Mark()
	const window = 6 * time.Second
	time.Sleep(window)
	stop()
	wg.Wait()
	got := log.Since(requests)
	for _, r := range got {
		t.Errorf("idle, the coordinator sent %s", r)
	}
	if len(got) > 0 {
		t.Errorf("%d requests in %s besides its watches and its Lease (%.0f a minute); want none", len(got), window, float64(len(got))*float64(time.Minute)/float64(window))
	}
	// The log saw the election's renewals, so it is in the coordinator's path, and the
	// leader still leads: a change that matters is written at once.
	if r := log.RenewedSince(renewals); r == 0 {
		t.Errorf("no Lease renewal went through the request log in %s", window)
	}
	f.setReady(f.names[0], false)
	f.waitFor("the coordinator counting a Node gone NotReady", 30*time.Second, func() bool { return countsUnavailable(f.cluster().Status, 1, n) })
}

// countsUnavailable says whether the Cluster's Available condition counts down machines of n
// unavailable.
func countsUnavailable(st v1alpha1.ClusterStatus, down, n int) bool {
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ClusterAvailable)
	return c != nil && strings.HasPrefix(c.Message, fmt.Sprintf("%d of %d machines unavailable", down, n))
}

// heartbeat reports a Node's status again as a kubelet does: the same status, a new
// heartbeat time.
func (f *fleetFixture) heartbeat(node string) {
	f.t.Helper()
	if err := apiserver.Heartbeat(context.Background(), f.admin, node); err != nil {
		f.t.Errorf("reporting Node %s: %v", node, err)
	}
}

// clockSet reports in a Machine's status that its agent set the clock, as it does every
// 15 minutes.
func (f *fleetFixture) clockSet(machine string) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := f.liken.Machine(context.Background(), machine)
		if err != nil {
			return err
		}
		now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
		m.Status.Clock = &v1alpha1.ClockStatus{Source: "192.0.2.123:123", Offset: "+1.234ms", LastSync: &now}
		_, err = f.liken.UpdateMachineStatus(context.Background(), m)
		return err
	})
	if err != nil {
		f.t.Errorf("reporting %s's clock: %v", machine, err)
	}
}

// kubeletNode is a Node as k3s's kubelet and server leave it: labels and annotations, the
// pod CIDR, and a full status (addresses, capacity, the usual conditions, system info and
// the images pulled), so the coordinator's caches and the figures hold what a cluster's
// do. It is Ready.
func kubeletNode(name string, i int) *corev1.Node {
	ip := fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256)
	cidr := fmt.Sprintf("10.42.%d.0/24", i%256)
	since := metav1.NewTime(time.Now().Add(-72 * time.Hour).Truncate(time.Second))
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, st corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: st, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: since}
	}
	var images []corev1.ContainerImage
	for j, repo := range []string{"rancher/mirrored-pause", "rancher/mirrored-coredns-coredns", "rancher/local-path-provisioner",
		"rancher/mirrored-metrics-server", "rancher/klipper-helm", "rancher/mirrored-library-traefik", "rancher/klipper-lb",
		"quay.io/prometheus/node-exporter", "registry.k8s.io/kube-state-metrics/kube-state-metrics", "docker.io/library/nginx",
		"docker.io/library/redis", "docker.io/library/postgres", "ghcr.io/fluxcd/source-controller", "ghcr.io/fluxcd/kustomize-controller",
		"quay.io/jetstack/cert-manager-controller", "quay.io/jetstack/cert-manager-webhook", "quay.io/jetstack/cert-manager-cainjector",
		"docker.io/grafana/promtail", "docker.io/grafana/loki", "quay.io/cilium/cilium", "quay.io/cilium/operator-generic",
		"registry.k8s.io/ingress-nginx/controller", "docker.io/bitnami/kubectl", "docker.io/library/busybox"} {
		images = append(images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("%s@sha256:%064x", repo, j*7919+i), fmt.Sprintf("%s:v1.%d.%d", repo, j, i%10)},
			SizeBytes: int64(300_000 + j*2_345_678),
		})
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32863248Ki"),
		corev1.ResourceEphemeralStorage: resource.MustParse("245016792Ki"), corev1.ResourcePods: resource.MustParse("110"),
		"hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0"),
	}
	alloc := res.DeepCopy()
	alloc[corev1.ResourceEphemeralStorage] = resource.MustParse("238353074722")
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "k3s", "beta.kubernetes.io/os": "linux",
				"kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "k3s",
				"topology.kubernetes.io/zone": fmt.Sprintf("rack-%d", i%8)},
			Annotations: map[string]string{
				"alpha.kubernetes.io/provided-node-ip":                   ip,
				"flannel.alpha.coreos.com/backend-data":                  fmt.Sprintf(`{"VNI":1,"VtepMAC":"62:1c:%02x:%02x:9a:7e"}`, i/256%256, i%256),
				"flannel.alpha.coreos.com/backend-type":                  "vxlan",
				"flannel.alpha.coreos.com/kube-subnet-manager":           "true",
				"flannel.alpha.coreos.com/public-ip":                     ip,
				"k3s.io/hostname":                                        name,
				"k3s.io/internal-ip":                                     ip,
				"k3s.io/node-args":                                       `["agent","--config","/etc/rancher/k3s/config.yaml","--node-ip","` + ip + `","--kubelet-arg","max-pods=110"]`,
				"k3s.io/node-config-hash":                                "N4ZJ6S3RZSJ3M2FZKCQFQZDV4MCOV7SO3VT2XQ5YN4TWU2MTL7HQ====",
				"k3s.io/node-env":                                        "{}",
				"node.alpha.kubernetes.io/ttl":                           "0",
				"volumes.kubernetes.io/controller-managed-attach-detach": "true",
			}},
		Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}, ProviderID: "k3s://" + name},
		Status: corev1.NodeStatus{
			Capacity: res, Allocatable: alloc,
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
			},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo: corev1.NodeSystemInfo{
				MachineID: fmt.Sprintf("%032x", i+1), SystemUUID: fmt.Sprintf("4c4c4544-0042-%04x-8031-b4c04f4e3332", i%65536),
				BootID: fmt.Sprintf("%08x-6d1b-4d5e-9f3a-0c2b7e1d4a5f", i), KernelVersion: "6.1.0-37-amd64", OSImage: "liken 2026.07.20-001",
				ContainerRuntimeVersion: "containerd://2.0.5-k3s1", KubeletVersion: "v1.37.2+k3s1", OperatingSystem: "linux", Architecture: "amd64",
			},
			Images: images,
		},
	}
}
