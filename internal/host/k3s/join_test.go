package k3s

import (
	"fmt"
	"strings"
	"testing"

	"liken.dev/liken/api/v1alpha1"
)

// machine is a Machine of role with the given static addresses (none: DHCP).
func machine(name string, role v1alpha1.Role, addresses ...string) *v1alpha1.Machine {
	m := &v1alpha1.Machine{Spec: v1alpha1.MachineSpec{Role: role}}
	m.Name = name
	iface := v1alpha1.Interface{Name: "eth0", DHCP: len(addresses) == 0, Addresses: addresses}
	m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{iface}}
	return m
}

// TestPlanJoin: which server initialises the cluster and where each other machine joins,
// for clusters with and without a registration address and static addresses.
func TestPlanJoin(t *testing.T) {
	dhcp := func(name string, role v1alpha1.Role) *v1alpha1.Machine { return machine(name, role) }
	tests := []struct {
		name     string
		reg      string
		machines []*v1alpha1.Machine
		init     string
		join     map[string]string // machine → URL it joins; "" for the initialiser
		refused  string            // part of the error of a machine that cannot join
	}{
		{"static servers, no registration address: the first server's address", "",
			[]*v1alpha1.Machine{machine("s2", v1alpha1.RoleServer, "192.0.2.12/24"), machine("s1", v1alpha1.RoleServer, "192.0.2.11/24"), dhcp("a1", v1alpha1.RoleAgent)},
			"s1", map[string]string{"s1": "", "s2": "https://192.0.2.11:6443", "a1": "https://192.0.2.11:6443"}, ""},
		{"static servers and a registration address: joins go through it", "k3s.example.com",
			[]*v1alpha1.Machine{machine("s1", v1alpha1.RoleServer, "192.0.2.11/24"), machine("s2", v1alpha1.RoleServer, "192.0.2.12/24"), dhcp("a1", v1alpha1.RoleAgent)},
			"s1", map[string]string{"s1": "", "s2": "https://k3s.example.com:6443", "a1": "https://k3s.example.com:6443"}, ""},
		{"DHCP servers and a registration address: one server initialises, the others join", "192.0.2.100",
			[]*v1alpha1.Machine{dhcp("s3", v1alpha1.RoleServer), dhcp("s1", v1alpha1.RoleServer), dhcp("s2", v1alpha1.RoleServer), dhcp("a1", v1alpha1.RoleAgent)},
			"s1", map[string]string{"s1": "", "s2": "https://192.0.2.100:6443", "s3": "https://192.0.2.100:6443", "a1": "https://192.0.2.100:6443"}, ""},
		{"an IPv6 registration address in brackets", "2001:db8::100",
			[]*v1alpha1.Machine{dhcp("s1", v1alpha1.RoleServer), dhcp("a1", v1alpha1.RoleAgent)},
			"s1", map[string]string{"s1": "", "a1": "https://[2001:db8::100]:6443"}, ""},
		{"an IPv6 first server: it initialises, the others join it", "",
			[]*v1alpha1.Machine{machine("s1", v1alpha1.RoleServer, "2001:db8::11/64"), machine("s2", v1alpha1.RoleServer, "2001:db8::12/64")},
			"s1", map[string]string{"s1": "", "s2": "https://[2001:db8::11]:6443"}, ""},
		{"a DHCP server before a static one: the static one initialises, as before", "",
			[]*v1alpha1.Machine{dhcp("s1", v1alpha1.RoleServer), machine("s2", v1alpha1.RoleServer, "192.0.2.12/24")},
			"s2", map[string]string{"s2": "", "s1": "https://192.0.2.12:6443"}, ""},
		{"a registration address set later does not move the initialiser", "k3s.example.com",
			[]*v1alpha1.Machine{dhcp("s1", v1alpha1.RoleServer), machine("s2", v1alpha1.RoleServer, "192.0.2.12/24")},
			"s2", map[string]string{"s2": "", "s1": "https://k3s.example.com:6443"}, ""},
		{"one DHCP server alone: nothing to join", "",
			[]*v1alpha1.Machine{dhcp("s1", v1alpha1.RoleServer)},
			"s1", map[string]string{"s1": ""}, ""},
		{"DHCP servers, no registration address: the second server cannot join", "",
			[]*v1alpha1.Machine{dhcp("s1", v1alpha1.RoleServer), dhcp("s2", v1alpha1.RoleServer)},
			"s1", map[string]string{"s1": ""}, "machine s2 has no server to join: the first server, s1, has no static address, and the Cluster has no spec.registrationAddress"},
		{"a DHCP server and an agent, no registration address: the agent cannot join", "",
			[]*v1alpha1.Machine{dhcp("s1", v1alpha1.RoleServer), dhcp("a1", v1alpha1.RoleAgent)},
			"s1", map[string]string{"s1": ""}, "machine a1 has no server to join"},
		{"agents alone, no registration address", "",
			[]*v1alpha1.Machine{dhcp("a1", v1alpha1.RoleAgent)},
			"", nil, "machine a1 has no server to join: the cluster has no server"},
		{"agents alone join an existing cluster through the registration address", "k3s.example.com",
			[]*v1alpha1.Machine{dhcp("a1", v1alpha1.RoleAgent)},
			"", map[string]string{"a1": "https://k3s.example.com:6443"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := PlanJoin(v1alpha1.ClusterSpec{RegistrationAddress: tt.reg}, tt.machines)
			if p.Initialiser != tt.init {
				t.Errorf("initialiser %q, want %q", p.Initialiser, tt.init)
			}
			for name, want := range tt.join {
				got, err := p.For(name)
				if err != nil || got != want {
					t.Errorf("%s joins %q (%v), want %q", name, got, err, want)
				}
			}
			err := p.Check(tt.machines)
			if tt.refused == "" && err != nil {
				t.Errorf("refused: %v", err)
			}
			if tt.refused != "" && (err == nil || !strings.Contains(err.Error(), tt.refused)) {
				t.Errorf("error %v, want one saying %q", err, tt.refused)
			}
		})
	}
}

// TestEachMachineRenders follows each machine from the plan to its k3s config, as init
// renders it: exactly one server sets cluster-init, every other machine has the plan's
// server, and every server (and no agent, whose k3s has no such flag) names the
// registration address in tls-san.
func TestEachMachineRenders(t *testing.T) {
	for _, tt := range []struct {
		name     string
		reg      string
		machines []*v1alpha1.Machine
		server   string // the server key of every machine but the initialiser
	}{
		{"static addresses", "", []*v1alpha1.Machine{machine("s1", v1alpha1.RoleServer, "192.0.2.11/24"), machine("s2", v1alpha1.RoleServer, "192.0.2.12/24"), machine("a1", v1alpha1.RoleAgent, "192.0.2.21/24")}, "https://192.0.2.11:6443"},
		{"static addresses and a registration address", "k3s.example.com", []*v1alpha1.Machine{machine("s1", v1alpha1.RoleServer, "192.0.2.11/24"), machine("s2", v1alpha1.RoleServer, "192.0.2.12/24"), machine("a1", v1alpha1.RoleAgent, "192.0.2.21/24")}, "https://k3s.example.com:6443"},
		{"DHCP and a registration address", "k3s.example.com", []*v1alpha1.Machine{machine("s1", v1alpha1.RoleServer), machine("s2", v1alpha1.RoleServer), machine("s3", v1alpha1.RoleServer), machine("a1", v1alpha1.RoleAgent)}, "https://k3s.example.com:6443"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			spec := clusterSpec()
			spec.RegistrationAddress = tt.reg
			p := PlanJoin(spec, tt.machines)
			inits := 0
			for _, m := range tt.machines {
				join, err := p.For(m.Name)
				if err != nil {
					t.Fatal(err)
				}
				out, err := Render(Input{Role: m.Spec.Role, NodeName: m.Name, Cluster: spec, Join: join, Secrets: secrets, Paths: DefaultPaths})
				if err != nil {
					t.Fatalf("%s: %v", m.Name, err)
				}
				cfg := keys(t, out[DefaultPaths.Config])
				if cfg["cluster-init"] == true {
					inits++
					if _, ok := cfg["server"]; ok || m.Spec.Role != v1alpha1.RoleServer {
						t.Errorf("%s (%s) initialises the cluster with server %v", m.Name, m.Spec.Role, cfg["server"])
					}
				} else if cfg["server"] != tt.server {
					t.Errorf("%s joins %v, want %s", m.Name, cfg["server"], tt.server)
				}
				wantSAN := any(nil)
				if tt.reg != "" && m.Spec.Role == v1alpha1.RoleServer {
					wantSAN = []any{tt.reg}
				}
				if fmt.Sprint(cfg["tls-san"]) != fmt.Sprint(wantSAN) {
					t.Errorf("%s (%s): tls-san %v, want %v", m.Name, m.Spec.Role, cfg["tls-san"], wantSAN)
				}
				if m.Spec.Role == v1alpha1.RoleAgent {
					for k := range cfg {
						if !agentFlags[k] {
							t.Errorf("agent %s: key %s, which k3s agent does not define", m.Name, k)
						}
					}
				}
			}
			if inits != 1 {
				t.Errorf("%d machines set cluster-init, want exactly one", inits)
			}
		})
	}
}
