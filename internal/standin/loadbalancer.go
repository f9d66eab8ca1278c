package standin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/balancer"
)

// An agent's client load balancer, as k3s's (pkg/agent/loadbalancer; docs/k3s.md, "An agent's
// connection to the servers"): a TCP proxy on 127.0.0.1:6444 (lb-server-port) that the
// agent's kubelet, kube-proxy and flannel reach the API through, seeded with the server URL
// the agent joined with and learning every server's address from the kubernetes Service's
// Endpoints, which each API server keeps its own address in. It connects to the server it
// used last while that one is healthy, else the next healthy one; the server it joined
// through stays a last resort when the Endpoints do not name it; a server found down has
// its connections closed (internal/balancer). Its state is k3s's file,
// agent/etc/k3s-agent-load-balancer.json ({"ServerURL", "ServerAddresses"}).
//
// Where it differs from k3s: k3s judges a server by its websocket tunnel to that server's
// supervisor, which the stand-in does not have; the stand-in dials each server's API port
// every second instead (a TCP connection, closed at once).
type loadBalancer struct {
	*balancer.Balancer
	serverURL string
	stateFile string
}

// lbServiceName and lbServerPort are k3s's (SupervisorServiceName; --lb-server-port's
// default, pkg/cli/cmds/agent.go).
const (
	lbServiceName = "k3s-agent-load-balancer"
	lbServerPort  = 6444
)

// newLoadBalancer is an agent's load balancer for serverURL, its state under dataDir/agent/etc.
func newLoadBalancer(dataDir, serverURL string, port int, log io.Writer) (*loadBalancer, error) {
	u, err := url.Parse(serverURL)
	if err != nil || u.Hostname() == "" {
		return nil, fmt.Errorf("the load balancer's server %q is not a URL with a host", serverURL)
	}
	p := u.Port()
	if p == "" {
		p = "443"
	}
	def := net.JoinHostPort(u.Hostname(), p)
	lb := &loadBalancer{serverURL: u.Scheme + "://" + def, stateFile: filepath.Join(dataDir, "agent", "etc", lbServiceName+".json")}
	lb.Balancer = &balancer.Balancer{Listen: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Default: def,
		Name: "k3s-standin: agent load balancer", Log: log, Changed: lb.writeState}
	return lb, nil
}

// URL is where the agent's components reach the API through the load balancer.
func (lb *loadBalancer) URL() string { return "https://" + lb.Listen }

// serve listens and proxies until ctx ends; it returns once listening (or failing to).
func (lb *loadBalancer) serve(ctx context.Context) error {
	if err := lb.Serve(ctx); err != nil {
		return err
	}
	lb.writeState(nil)
	fmt.Fprintf(lb.Log, "k3s-standin: agent load balancer on %s, servers from the kubernetes Endpoints, %s as the last resort\n", lb.Listen, lb.Default)
	return nil
}

// writeState writes k3s's state file: the server URL and the servers learned.
func (lb *loadBalancer) writeState(servers []string) {
	state := struct {
		ServerURL       string   `json:"ServerURL"`
		ServerAddresses []string `json:"ServerAddresses"`
	}{lb.serverURL, servers}
	if state.ServerAddresses == nil {
		state.ServerAddresses = []string{}
	}
	b, _ := json.MarshalIndent(state, "", "  ")
	if err := atomicfile.Write(lb.stateFile, b, 0o600); err != nil {
		fmt.Fprintf(lb.Log, "k3s-standin: agent load balancer: writing %s: %v\n", lb.stateFile, err)
	}
}

// apiServers is the API servers' addresses in the kubernetes Service's Endpoints (the port
// named https), as k3s's agent reads them (util.GetAddresses).
func apiServers(e *corev1.Endpoints) []string {
	var out []string
	for _, s := range e.Subsets {
		port := 0
		for _, p := range s.Ports {
			if p.Name == "https" || len(s.Ports) == 1 {
				port = int(p.Port)
			}
		}
		if port == 0 {
			continue
		}
		for _, a := range s.Addresses {
			out = append(out, net.JoinHostPort(a.IP, strconv.Itoa(port)))
		}
	}
	slices.Sort(out)
	return out
}

// watchServers keeps lb's servers those of the kubernetes Endpoints, through client (which
// reaches the API through lb itself, as k3s's agent does), until ctx ends.
func (lb *loadBalancer) watchServers(ctx context.Context, client kubernetes.Interface) {
	sel := fields.OneTermEqualSelector("metadata.name", "kubernetes").String()
	for ctx.Err() == nil {
		list, err := client.CoreV1().Endpoints("default").List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil && len(list.Items) == 1 {
			lb.SetServers(apiServers(&list.Items[0]))
		}
		if err == nil {
			w, werr := client.CoreV1().Endpoints("default").Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
			if werr == nil {
				for ev := range w.ResultChan() {
					if e, ok := ev.Object.(*corev1.Endpoints); ok {
						lb.SetServers(apiServers(e))
					}
				}
				w.Stop()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second): // k3s's debounce
		}
	}
}
