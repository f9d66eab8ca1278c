package standin

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/internal/standin/flannel"
	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) {
	if flannel.CNIMain(os.Args[0]) { // the test binary is the CNI plugin in TestPodOnFlannelsNetwork
		os.Exit(0)
	}
	os.Exit(apiserver.Main(m, "standin", apiserver.Options{}, &env))
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func noEnv(string) string { return "" }

func TestParse(t *testing.T) {
	regDir := t.TempDir()
	goodReg := filepath.Join(regDir, "good.yaml")
	os.WriteFile(goodReg, []byte("mirrors:\n  docker.io:\n    endpoint: [\"https://m\"]\n"), 0o600)
	badReg := filepath.Join(regDir, "bad.yaml")
	os.WriteFile(badReg, []byte("mirror: {}\n"), 0o600)
	tests := []struct {
		name, role, config, wantErr string
	}{
		{"server with server keys", "server", "cluster-init: true\ndisable: [traefik]\nnode-name: s1\n", ""},
		{"agent with shared keys", "agent", "server: https://s1:6443\ntoken-file: /t\nnode-name: a1\n", ""},
		{"agent with a server-only key", "agent", "server: https://s1:6443\ncluster-init: true\n", "flag provided but not defined: -cluster-init"},
		{"agent with disable", "agent", "server: https://s1:6443\ndisable: [traefik]\n", "flag provided but not defined: -disable"},
		{"agent with an unknown key", "agent", "server: https://s1:6443\nfrobnicate: 1\n", "flag provided but not defined: -frobnicate"},
		{"registries read", "server", "private-registry: " + goodReg + "\n", ""},
		{"registries with a bad key", "server", "private-registry: " + badReg + "\n", `unknown key "mirror"`},
		{"not YAML", "server", "disable: [\n", "parsing config file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]string{tt.role, "--config", writeConfig(t, tt.config)}, noEnv)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
	if _, err := Parse([]string{"etcd"}, noEnv); err == nil {
		t.Error("a command other than server or agent was accepted")
	}
	envCfg := writeConfig(t, "node-name: from-env\n")
	c, err := Parse([]string{"server", "-c", writeConfig(t, "node-name: from-flag\n")}, func(k string) string {
		if k == "K3S_CONFIG_FILE" {
			return envCfg
		}
		return ""
	})
	if err != nil || c.NodeName() != "from-env" {
		t.Errorf("K3S_CONFIG_FILE must win over --config: %v, %v", c, err)
	}
	// A cluster reset, on the command line as k3s's docs give it, or in the config file.
	cfg := writeConfig(t, "node-name: s1\n")
	for _, tc := range []struct {
		args        []string
		reset       bool
		restorePath string
		wantErr     string
	}{
		{[]string{"server", "--config", cfg, "--cluster-reset", "--cluster-reset-restore-path=/var/lib/rancher/k3s/server/db/snapshots/liken-s1-1"}, true, "/var/lib/rancher/k3s/server/db/snapshots/liken-s1-1", ""},
		{[]string{"server", "--config", writeConfig(t, "cluster-reset: true\ncluster-reset-restore-path: /s\n")}, true, "/s", ""},
		{[]string{"server", "--config", cfg, "--cluster-reset"}, true, "", ""},
		{[]string{"server", "--config", cfg, "--cluster-reset-restore-path=/s"}, false, "", "--cluster-reset required with --cluster-reset-restore-path"},
		{[]string{"agent", "--config", writeConfig(t, "server: https://s1:6443\n"), "--cluster-reset"}, false, "", "flag provided but not defined: --cluster-reset"},
	} {
		c, err := Parse(tc.args, noEnv)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: %v; want %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || c.reset != tc.reset || c.restorePath != tc.restorePath {
			t.Errorf("%v: reset %v, restore %q, %v", tc.args, c != nil && c.reset, c.restorePath, err)
		}
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func nodeKubeconfig(t *testing.T, name string) string {
	cfg, err := env.UserConfig("system:node:"+name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := apiserver.WriteKubeconfig(p, cfg); err != nil {
		t.Fatal(err)
	}
	return p
}

func start(t *testing.T, name, role, fault string) (addr string, done chan error, cancel context.CancelFunc) {
	cfgPath := writeConfig(t, fmt.Sprintf("node-name: %s\nnode-label: [example.com/pool=a]\nnode-taint: [\"example.com/x=y:NoSchedule\"]\n", name))
	c, err := Parse([]string{role, "--config", cfgPath}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	addr = freeAddr(t)
	kc := nodeKubeconfig(t, name)
	vars := map[string]string{"LIKEN_STANDIN_KUBECONFIG": kc, "LIKEN_STANDIN_HEALTHZ": addr, "LIKEN_STANDIN_FAULT": fault, "LIKEN_STANDIN_PREFLIGHT": "off"}
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- Run(ctx, c, func(k string) string { return vars[k] }, os.Stderr) }()
	return addr, done, cancel
}

func healthz(addr string) int {
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestRegistersAndHeartbeats(t *testing.T) {
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	addr, done, cancel := start(t, "n1", "server", "")
	defer func() { cancel(); <-done }()
	var node *corev1.Node
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("the stand-in stopped: %v", err)
		default:
		}
		n, err := admin.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return healthz(addr) == http.StatusOK, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the stand-in's Node never became Ready: %v; node %+v", err, node)
	}
	// As a kubelet, it reports the host's boot ID (a reboot shows in the Node) and addresses.
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if got := node.Status.NodeInfo.BootID; got == "" || got != strings.TrimSpace(string(bootID)) {
		t.Errorf("nodeInfo.bootID = %q; want the kernel's %q", got, bootID)
	}
	if len(node.Status.Addresses) == 0 || node.Status.NodeInfo.KernelVersion == "" {
		t.Errorf("the Node reports no addresses or kernel: %+v %+v", node.Status.Addresses, node.Status.NodeInfo)
	}
	// What it can hold, as a kubelet reports it: without it the scheduler places no pod here.
	if pods := node.Status.Allocatable.Pods(); pods.Value() != 110 || node.Status.Capacity.Memory().IsZero() || node.Status.Allocatable.Cpu().IsZero() {
		t.Errorf("the Node's capacity %v and allocatable %v: want 110 pods, the host's CPUs and memory", node.Status.Capacity, node.Status.Allocatable)
	}
	if node.Labels["example.com/pool"] != "a" || node.Labels["node.liken.dev/k3s"] != "stand-in" {
		t.Errorf("registration labels = %v", node.Labels)
	}
	found := false
	for _, tt := range node.Spec.Taints {
		found = found || (tt.Key == "example.com/x" && tt.Value == "y" && tt.Effect == corev1.TaintEffectNoSchedule)
	}
	if !found {
		t.Errorf("registration taint missing: %v", node.Spec.Taints)
	}
	l1, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(t.Context(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	l2, _ := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(t.Context(), "n1", metav1.GetOptions{})
	if !l2.Spec.RenewTime.After(l1.Spec.RenewTime.Time) {
		t.Errorf("the node lease was not renewed")
	}
}

func TestFaults(t *testing.T) {
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	addr, done, cancel := start(t, "sick", "agent", "never-ready")
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, "sick", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionFalse {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("never-ready: the Node was not reported NotReady")
	}
	if code := healthz(addr); code != http.StatusServiceUnavailable {
		t.Errorf("never-ready: healthz answered %d, want 503", code)
	}
	cancel()
	<-done

	_, done, cancel = start(t, "crashy", "agent", "crash-after=1s")
	defer cancel()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "crash-after") {
			t.Errorf("crash-after: Run returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("crash-after=1s: still running after 20s")
	}

	// A fault it does not know is refused at once, not ignored: a test that meant one would
	// otherwise prove nothing.
	_, done, cancel = start(t, "typo", "agent", "never-redy")
	defer cancel()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), `unknown fault "never-redy"`) {
			t.Errorf("an unknown fault: Run returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("an unknown fault: still running after 20s")
	}
}

// TestPods: the stand-in plays the kubelet's part for the pods bound to its Node, with its
// node identity (the Node authorizer and NodeRestriction admit it): a new pod is reported
// Running and Ready, a deleted one stays for its grace period and then goes, and after a
// restart the stand-in reports the pods it finds.
func TestPods(t *testing.T) {
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	_, done, cancel := start(t, "pods1", "agent", "")
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
	}()
	// No kube-controller-manager here to make the namespace's default ServiceAccount.
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	grace := int64(3)
	newPod := func(name string) {
		t.Helper()
		_, err := admin.CoreV1().Pods("default").Create(t.Context(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: "pods1", TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/app"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	// readyIs waits for pod name to be reported Running, its Ready condition ready.
	readyIs := func(name string, ready bool) {
		t.Helper()
		want := corev1.ConditionFalse
		if ready {
			want = corev1.ConditionTrue
		}
		var last *corev1.Pod
		err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
			last = p
			if p.Status.Reason != SimulatedPodReason || !strings.Contains(p.Status.Message, "no container runs") {
				return false, fmt.Errorf("pod %s reported Running by a simulated node with reason %q, message %q: it does not say it is simulated", name, p.Status.Reason, p.Status.Message)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == want {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("pod %s never reported Running with Ready %s: %v; last status %+v", name, want, err, last)
		}
	}
	running := func(name string) { t.Helper(); readyIs(name, true) }
	newPod("web-1")
	running("web-1")

	if err := admin.CoreV1().Pods("default").Delete(t.Context(), "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	// The removal is the evidence the stand-in acted on the deletion; when it came says
	// whether it waited out the grace period.
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := admin.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the deleted pod web-1 was never removed: %v", err)
	}
	if took := time.Since(deleted); took < time.Duration(grace)*time.Second {
		t.Errorf("web-1 was removed %s after its deletion, before its grace period of %ds", took, grace)
	}

	newPod("web-2")
	running("web-2")
	cancel()
	<-done
	stopped = true
	newPod("web-3")
	_, done, cancel = start(t, "pods1", "agent", "")
	stopped = false
	running("web-3")
	running("web-2")

	// Fault pods-not-ready (a release that breaks the workloads, not k3s): the pods it finds,
	// and a new one, are Running but not Ready; the same node without the fault (its release
	// before) reports them Ready again.
	cancel()
	<-done
	_, done, cancel = start(t, "pods1", "agent", "pods-not-ready")
	newPod("web-4")
	readyIs("web-4", false)
	readyIs("web-2", false)
	readyIs("web-3", false)
	cancel()
	<-done
	_, done, cancel = start(t, "pods1", "agent", "")
	running("web-4")
	running("web-2")
}
