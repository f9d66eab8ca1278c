package k3s

import (
	"fmt"
	"net"
	"sort"
	"strings"

	"liken.dev/liken/api/v1alpha1"
)

// APIPort is the port machines join k3s's servers on: k3s's https-listen-port, whose
// default (6443, k3s pkg/cli/cmds/server.go) liken does not change, and the port of k3s's
// own join instructions (docs.k3s.io/datastore/ha-embedded).
const APIPort = "6443"

// AgentLBPort is where an agent's k3s serves its client load balancer on 127.0.0.1, which
// its components reach the servers through: k3s's lb-server-port default
// (pkg/cli/cmds/agent.go), which liken does not change.
const AgentLBPort = "6444"

// JoinPlan is how the machines of one cluster come together: the one server that
// initialises the cluster (k3s cluster-init) and the URL every other machine joins through
// (k3s server, with the token). k3s's HA guide (docs.k3s.io/datastore/ha-embedded) starts
// one server with --cluster-init ("Initialize a new cluster", pkg/cli/cmds/server.go) and
// every other one with --server https://<address>:6443: a second server initialising would
// start a cluster of its own.
type JoinPlan struct {
	// Initialiser names the server that initialises the cluster: the first server, by name,
	// with a static address, or the first server by name when none has one. It does not
	// depend on RegistrationAddress, so setting that later does not move it.
	Initialiser string
	// URL is https://<registrationAddress>:6443 when the Cluster has one, else the
	// Initialiser's first static address on that port; empty when there is neither.
	URL string
	// why says why URL is empty, for the error of a machine that must join.
	why string
}

// PlanJoin reads the plan from the Cluster and every Machine of the cluster, in any order.
func PlanJoin(cluster v1alpha1.ClusterSpec, machines []*v1alpha1.Machine) JoinPlan {
	var servers []*v1alpha1.Machine
	for _, m := range machines {
		if m.Spec.Role == v1alpha1.RoleServer {
			servers = append(servers, m)
		}
	}
	// Init reads the layer's Machines and liken layer the manifests, each in its own order:
	// both must reach the same plan.
	sort.Slice(servers, func(i, j int) bool { return servers[i].Name < servers[j].Name })
	var p JoinPlan
	for _, s := range servers {
		if staticAddress(s) != "" {
			p.Initialiser = s.Name
			p.URL = serverURL(staticAddress(s))
			break
		}
	}
	if p.Initialiser == "" && len(servers) > 0 {
		p.Initialiser = servers[0].Name
		p.why = fmt.Sprintf("the first server, %s, has no static address", p.Initialiser)
	}
	if p.Initialiser == "" {
		p.why = "the cluster has no server"
	}
	if a := cluster.RegistrationAddress; a != "" {
		p.URL, p.why = serverURL(a), ""
	}
	return p
}

// For returns the URL machine name joins through, or "" when it is the initialiser.
func (p JoinPlan) For(name string) (string, error) {
	if name == p.Initialiser {
		return "", nil
	}
	if p.URL == "" {
		return "", fmt.Errorf("machine %s has no server to join: %s, and the Cluster has no spec.registrationAddress (a DNS name or fixed address reaching the servers on port %s)", name, p.why, APIPort)
	}
	return p.URL, nil
}

// Check returns For's error for the first of machines that has no way to join: liken layer
// refuses such a cluster rather than build layers that cannot form it.
func (p JoinPlan) Check(machines []*v1alpha1.Machine) error {
	for _, m := range machines {
		if _, err := p.For(m.Name); err != nil {
			return err
		}
	}
	return nil
}

// FirstServerURL is the API URL of the first server (in name order) with a static address:
// by default the server that initialises the cluster, which the others join.
func FirstServerURL(machines []*v1alpha1.Machine) string {
	return PlanJoin(v1alpha1.ClusterSpec{}, machines).URL
}

// staticAddress is a machine's first static address, without its prefix length.
func staticAddress(m *v1alpha1.Machine) string {
	if m.Spec.Network == nil {
		return ""
	}
	for _, i := range m.Spec.Network.Interfaces {
		for _, a := range i.Addresses {
			host, _, _ := strings.Cut(a, "/")
			return host
		}
	}
	return ""
}

// serverURL is k3s's server URL for a host name or address.
func serverURL(host string) string {
	return "https://" + net.JoinHostPort(host, APIPort)
}
