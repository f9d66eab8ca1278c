package standin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestLoadBalancerState: an agent's load balancer listens on k3s's port unless told, takes
// the server it joined with as its default, and keeps k3s's state file: the server URL and
// the servers learned.
func TestLoadBalancerState(t *testing.T) {
	dir := t.TempDir()
	lb, err := newLoadBalancer(dir, "https://192.168.76.10:6443", lbServerPort, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if lb.URL() != "https://127.0.0.1:6444" || lb.Default != "192.168.76.10:6443" {
		t.Errorf("the load balancer: %s, default %s; want https://127.0.0.1:6444, 192.168.76.10:6443", lb.URL(), lb.Default)
	}
	lb.Listen = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := lb.serve(ctx); err != nil {
		t.Fatal(err)
	}
	lb.SetServers([]string{"192.168.76.10:6443", "192.168.76.11:6443"})
	var state struct {
		ServerURL       string
		ServerAddresses []string
	}
	raw, err := os.ReadFile(filepath.Join(dir, "agent", "etc", "k3s-agent-load-balancer.json"))
	if err != nil || json.Unmarshal(raw, &state) != nil || state.ServerURL != "https://192.168.76.10:6443" ||
		!slices.Equal(state.ServerAddresses, []string{"192.168.76.10:6443", "192.168.76.11:6443"}) {
		t.Errorf("the state file: %s (%v)", raw, err)
	}
	if _, err := newLoadBalancer(dir, "192.168.76.10", lbServerPort, os.Stderr); err == nil {
		t.Error("a server that is no URL was taken")
	}
}

// TestAPIServers: the servers' addresses from the kubernetes Endpoints, as k3s reads them.
func TestAPIServers(t *testing.T) {
	e := &corev1.Endpoints{Subsets: []corev1.EndpointSubset{{
		Addresses: []corev1.EndpointAddress{{IP: "192.168.76.12"}, {IP: "192.168.76.10"}, {IP: "fd00::1"}},
		Ports:     []corev1.EndpointPort{{Name: "https", Port: 6443}},
	}}}
	if got, want := apiServers(e), []string{"192.168.76.10:6443", "192.168.76.12:6443", "[fd00::1]:6443"}; !slices.Equal(got, want) {
		t.Errorf("apiServers = %v; want %v", got, want)
	}
	if got := apiServers(&corev1.Endpoints{}); len(got) != 0 {
		t.Errorf("no subsets: %v", got)
	}
}
