package initd

import (
	"slices"
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/initramfs"
)

// TestAPIAddresses: where the agent reaches the API, and what its connections try in order.
// A server reaches its own k3s, a joining one the server it joined through while its own is
// not running; an agent goes through its k3s's load balancer, the server it joined through
// when k3s is not running; the first server and VM tests with the test's API have nothing
// to fail over to.
func TestAPIAddresses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		role  v1alpha1.Role
		join  string
		cmd   initramfs.Cmdline
		url   string
		addrs []string
	}{
		{"the first server", v1alpha1.RoleServer, "", nil, "https://127.0.0.1:6443", nil},
		{"a joining server", v1alpha1.RoleServer, "https://192.168.76.10:6443", nil, "https://127.0.0.1:6443", []string{"127.0.0.1:6443", "192.168.76.10:6443"}},
		{"an agent", v1alpha1.RoleAgent, "https://k3s.example.com:6443", nil, "https://k3s.example.com:6443", []string{"127.0.0.1:6444", "k3s.example.com:6443"}},
		{"the test's API", v1alpha1.RoleAgent, "https://192.168.76.10:6443", initramfs.Cmdline{"liken.test.api": "https://10.0.2.2:40000"}, "https://10.0.2.2:40000", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &system{cmd: tc.cmd, join: tc.join, machine: &v1alpha1.Machine{Spec: v1alpha1.MachineSpec{Role: tc.role}}}
			if got := s.apiURL(); got != tc.url {
				t.Errorf("apiURL = %s; want %s", got, tc.url)
			}
			if got := s.apiAddresses(); !slices.Equal(got, tc.addrs) {
				t.Errorf("apiAddresses = %v; want %v", got, tc.addrs)
			}
		})
	}
}
