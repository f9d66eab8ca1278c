package standin

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/test/apiserver"
)

// TestCoreDNSAnswersForServices runs the CoreDNS test/tools builds (k3s's Corefile's plugins)
// on the host with k3s's Corefile, its kubernetes plugin reading a real API server (through
// a kubeconfig, where a pod would use its service account) and its hosts plugin a NodeHosts
// file: a Service's name resolves to its cluster IP, a node's name to its address, and a
// name nobody knows to nothing.
func TestCoreDNSAnswersForServices(t *testing.T) {
	ctx := t.Context()
	if err := apiserver.EnsureTools(ctx); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := env.AdminKubeconfig
	client := kubernetes.NewForConfigOrDie(env.Admin)
	svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hosts := filepath.Join(dir, "NodeHosts")
	os.WriteFile(hosts, []byte("192.168.76.20 lab-agent-1\n"), 0o644)
	resolv := filepath.Join(dir, "resolv.conf")
	os.WriteFile(resolv, []byte("nameserver 127.0.0.1\n"), 0o644) // forward goes nowhere useful: no network here
	port, health, ready := apiserver.FreePort(), apiserver.FreePort(), apiserver.FreePort()
	corefile := filepath.Join(dir, "Corefile")
	// k3s's Corefile (manifests/coredns.yaml), with the host's ports and files, and the
	// kubeconfig a pod would not need.
	os.WriteFile(corefile, fmt.Appendf(nil, `.:%d {
    errors
    health 127.0.0.1:%d {
      lameduck 5s
    }
    ready 127.0.0.1:%d
    kubernetes cluster.local in-addr.arpa ip6.arpa {
      kubeconfig %s
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
    }
    hosts %s {
      ttl 60
      reload 15s
      fallthrough
    }
    cache 30
    loop
    reload
    loadbalance
    forward . %s
}
`, port, health, ready, kc, hosts, resolv), 0o644)
	cmd := exec.Command(filepath.Join(apiserver.ToolsDir(), "coredns"), "-conf", corefile)
	logPath := filepath.Join(dir, "coredns.log")
	logf, _ := os.Create(logPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() })
	log := func() string { b, _ := os.ReadFile(logPath); return string(b) }

	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", port))
	}}
	lookup := func(name string) ([]string, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return r.LookupHost(ctx, name)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := lookup("web.default.svc.cluster.local")
		if err == nil && slices.Equal(got, []string{svc.Spec.ClusterIP}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("web.default.svc.cluster.local: %v %v, want [%s]; CoreDNS's log:\n%s", got, err, svc.Spec.ClusterIP, log())
		}
		time.Sleep(300 * time.Millisecond)
	}
	if got, err := lookup("lab-agent-1"); err != nil || !slices.Equal(got, []string{"192.168.76.20"}) {
		t.Errorf("lab-agent-1 (NodeHosts): %v %v, want [192.168.76.20]", got, err)
	}
	if got, err := lookup("nothing.default.svc.cluster.local"); err == nil {
		t.Errorf("a Service that does not exist resolved to %v", got)
	}
	if !strings.Contains(log(), "CoreDNS-1.15.0") {
		t.Errorf("CoreDNS's log does not name its version 1.15.0:\n%s", log())
	}
}
