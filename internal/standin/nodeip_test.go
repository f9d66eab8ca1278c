package standin

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/test/apiserver"
)

// TestKubeProxyWaitsForTheNodesAddress: with a node-ip the Node does not have yet (a network
// change's boot), kube-proxy's start waits until the kubelet has written it, since upstream
// kube-proxy exits when the Node's addresses change after its start; a Node not there yet, or
// one with the address already, does not wait.
func TestKubeProxyWaitsForTheNodesAddress(t *testing.T) {
	admin, err := kubernetes.NewForConfig(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{NodeName: "moved-1", NodeIP: "192.168.76.99", DataDir: t.TempDir()}
	os.MkdirAll(filepath.Join(n.DataDir, "agent"), 0o755)
	if err := apiserver.WriteKubeconfig(n.agent("kubeproxy.kubeconfig"), env.Admin); err != nil {
		t.Fatal(err)
	}
	wait := func() (chan error, *bytes.Buffer) {
		var log bytes.Buffer
		done := make(chan error, 1)
		go func() { done <- n.waitNodeIP(t.Context(), make(chan error), &log) }()
		return done, &log
	}
	done, _ := wait()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("no Node yet: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kube-proxy's start waited for a Node that the kubelet registers with its address")
	}

	node, err := admin.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.NodeName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(t.Context(), n.NodeName, metav1.DeleteOptions{}) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.76.10"}, {Type: corev1.NodeHostName, Address: n.NodeName}}
	if node, err = admin.CoreV1().Nodes().UpdateStatus(t.Context(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	done, log := wait()
	select {
	case err := <-done:
		t.Fatalf("kube-proxy's start did not wait for the Node's new address: %v", err)
	case <-time.After(5 * time.Second):
	}
	node.Status.Addresses[0].Address = n.NodeIP
	if _, err := admin.CoreV1().Nodes().UpdateStatus(t.Context(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("kube-proxy's start still waits after the Node got its new address")
	}
	if !strings.Contains(log.String(), "is at [192.168.76.10], its node-ip now 192.168.76.99") || !strings.Contains(log.String(), "has its address 192.168.76.99") {
		t.Errorf("the stand-in did not say why kube-proxy waited and when it started:\n%s", log.String())
	}
	done, _ = wait()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kube-proxy's start waited for a Node that has its address already")
	}
}
