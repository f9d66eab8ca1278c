// Package standin is liken's k3s stand-in: a program with k3s's command shape that runs
// k3s's upstream parts laid out as k3s lays them out, used wherever k3s would run in liken's
// tests, because k3s itself cannot be built or downloaded on liken's build machines. It is
// never what a user gets: its name, its output and the release document say it is a stand-in.
//
// What it does of k3s: `server|agent --config FILE` (also -c and K3S_CONFIG_FILE), unpacks a
// data directory laid out as k3s's and performs the host checks k3s performs at start,
// refusing to start at the first that fails (preflight.go), reads the config file and the
// registries file as k3s does, refuses a server-only key as an agent ("flag provided but not
// defined", as k3s agent does). As a server, it runs a real control plane laid out as k3s's
// (controlplane.go: upstream etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler) and applies server/manifests as k3s's deploy controller does (deploy.go).
//
// Its node is one of two kinds, and says which on its log:
//   - a real node (LIKEN_STANDIN_NODE names the programs; noderun.go): upstream containerd
//     with runc and the CNI plugins, the kubelet, kube-proxy and flannel's vxlan network, with
//     k3s's files, paths and arguments (node.go); pods really run;
//   - a simulated node, for tests whose API server is not the stand-in's own: it registers
//     its Node with a kubelet's capacity, keeps it Ready with a Lease heartbeat, answers the
//     kubelet's readiness check, and plays the kubelet's part in a pod's life that drains need (pods bound to it are
//     reported Running and Ready though no container runs; a pod being deleted goes once its
//     grace period has passed).
//
// What it does not do of k3s: the supervisor (agents join with the credentials liken's
// layer carries, servers through each other's etcd: etcd.go), traefik, servicelb, local-path, metrics-server, the
// network policy controller, the embedded registry.
//
// Settings only the stand-in has come from the environment:
//
//	LIKEN_STANDIN_KUBECONFIG  kubeconfig it registers its Node with (a node identity); a real
//	                          node's other credentials are beside it (api/release StandIn*)
//	LIKEN_STANDIN_NODE        directory of the node's programs: run a real node (noderun.go)
//	LIKEN_STANDIN_HEALTHZ     a simulated node's readiness address (default 127.0.0.1:10248,
//	                          the kubelet's, which a real node's kubelet serves)
//	LIKEN_STANDIN_FAULT       faults, separated by commas: never-ready | crash-after=DURATION |
//	                          slow-start=DURATION | late-boot-id=DURATION (the Node keeps the
//	                          boot before's system info, Ready, that long: a kubelet that has
//	                          not reported yet) | pods-not-ready (a simulated node's pods are
//	                          Running but not Ready: a release that breaks the workloads and
//	                          not k3s, the Node staying Ready)
//	LIKEN_STANDIN_CONTROL_PLANE  directory of the control plane `server` runs (controlplane.go);
//	                          unset, a server registers with an API server run by a test
//	LIKEN_STANDIN_PREFLIGHT   off: skip the host checks k3s performs (preflight.go), where
//	                          the host is no liken machine (host tests)
//	LIKEN_STANDIN_BOOT_ID_FILE  where the boot ID it reports is read (default the kernel's);
//	                          host tests that play several boots of one machine set it
package standin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/host/hardware"
)

// Banner starts every run's output, so no log can mistake the stand-in for k3s.
const Banner = "k3s-standin: liken's stand-in for k3s (not k3s)"

// Keys k3s defines for both `server` and `agent` (pkg/cli/cmds/agent.go), of those a
// config file may carry.
var agentKeys = set("server", "token", "token-file", "node-name", "node-ip", "node-external-ip",
	"node-label", "node-taint", "data-dir", "kubelet-arg", "kube-proxy-arg", "private-registry",
	"disable-default-registry-endpoint", "protect-kernel-defaults", "selinux", "lb-server-port",
	"resolv-conf", "flannel-iface", "with-node-id", "debug", "v", "log", "alsologtostderr")

// Keys only `k3s server` defines (pkg/cli/cmds/server.go).
var serverKeys = set("cluster-init", "cluster-reset", "cluster-reset-restore-path", "cluster-cidr", "service-cidr", "cluster-dns",
	"cluster-domain", "flannel-backend", "disable", "disable-network-policy", "embedded-registry",
	"secrets-encryption", "write-kubeconfig", "write-kubeconfig-mode", "agent-token", "agent-token-file",
	"kube-apiserver-arg", "kube-controller-manager-arg", "kube-scheduler-arg", "tls-san",
	"disable-cloud-controller", "disable-helm-controller", "egress-selector-mode", "system-default-registry",
	"etcd-snapshot-schedule-cron", "etcd-snapshot-retention", "datastore-endpoint", "https-listen-port",
	"bind-address", "advertise-address", "etcd-arg")

func set(keys ...string) map[string]bool {
	m := map[string]bool{}
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// Config is what the stand-in read.
type Config struct {
	Role       string
	Values     map[string]any
	Registries map[string]any
	// reset and restorePath are --cluster-reset and --cluster-reset-restore-path, from the
	// command line or the config file.
	reset       bool
	restorePath string
}

// Main runs the stand-in with k3s's arguments and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, Banner)
	if len(args) > 0 && args[0] == "etcd-snapshot" {
		return snapshotMain(ctx, args[1:], os.Getenv, stdout, stderr)
	}
	cfg, err := Parse(args, os.Getenv)
	if err != nil {
		fmt.Fprintf(stderr, "k3s-standin: %v\n", err)
		return 1
	}
	if cfg.reset {
		if err := cfg.clusterReset(ctx, os.Getenv, stderr); err != nil {
			fmt.Fprintf(stderr, "k3s-standin: %v\n", err)
			return 1
		}
		return 0
	}
	if err := cfg.stageAndRun(args, os.Getenv, stderr); err != nil {
		fmt.Fprintf(stderr, "k3s-standin: %v\n", err)
		return 1
	}
	if err := Run(ctx, cfg, os.Getenv, stderr); err != nil {
		fmt.Fprintf(stderr, "k3s-standin: %v\n", err)
		return 1
	}
	return 0
}

// Parse reads the command line, config file and registries file as k3s does.
func Parse(args []string, getenv func(string) string) (*Config, error) {
	if len(args) == 0 || (args[0] != "server" && args[0] != "agent") {
		return nil, errors.New("usage: k3s-standin server|agent [--config FILE]")
	}
	c := &Config{Role: args[0]}
	path := "/etc/rancher/k3s/config.yaml"
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--config" || a == "-c":
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag needs an argument: %s", a)
			}
			path = args[i+1]
			i++
		case strings.HasPrefix(a, "--config="):
			path = strings.TrimPrefix(a, "--config=")
		case a == "--cluster-reset" && args[0] == "server":
			// A one-shot run, as k3s's docs give it on the command line (ClusterReset).
			c.reset = true
		case strings.HasPrefix(a, "--cluster-reset-restore-path=") && args[0] == "server":
			c.restorePath = strings.TrimPrefix(a, "--cluster-reset-restore-path=")
		default:
			return nil, fmt.Errorf("flag provided but not defined: %s (the stand-in reads everything from its config file)", a)
		}
	}
	if env := getenv("K3S_CONFIG_FILE"); env != "" {
		path = env // k3s: the environment wins
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config file: %w", err)
	}
	c.Values = map[string]any{}
	if err := yaml.Unmarshal(b, &c.Values); err != nil {
		return nil, fmt.Errorf("parsing config file %s: %w", path, err)
	}
	var unknown []string
	for k := range c.Values {
		k = strings.TrimSuffix(k, "+")
		switch {
		case agentKeys[k]:
		case serverKeys[k] && c.Role == "server":
		case serverKeys[k]:
			// k3s agent: urfave/cli refuses a flag the agent command does not define.
			return nil, fmt.Errorf("flag provided but not defined: -%s", k)
		default:
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 && c.Role == "agent" {
		return nil, fmt.Errorf("flag provided but not defined: -%s", unknown[0])
	}
	if b, _ := c.Values["cluster-reset"].(bool); b {
		c.reset = true
	}
	if p := c.str("cluster-reset-restore-path"); p != "" && c.restorePath == "" {
		c.restorePath = p // a flag on the command line wins, as with k3s
	}
	if c.restorePath != "" && !c.reset {
		return nil, errors.New("invalid flag use; --cluster-reset required with --cluster-reset-restore-path")
	}
	reg := "/etc/rancher/k3s/registries.yaml"
	if v, ok := c.Values["private-registry"].(string); ok {
		reg = v
	}
	if b, err := os.ReadFile(reg); err == nil {
		c.Registries = map[string]any{}
		if err := yaml.Unmarshal(b, &c.Registries); err != nil {
			return nil, fmt.Errorf("parsing registries file %s: %w", reg, err)
		}
		for k := range c.Registries {
			if k != "mirrors" && k != "configs" && k != "auths" {
				return nil, fmt.Errorf("parsing registries file %s: unknown key %q", reg, k)
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading registries file: %w", err)
	}
	return c, nil
}

// NodeName is node-name, else the hostname, as k3s picks it.
func (c *Config) NodeName() string {
	if n, ok := c.Values["node-name"].(string); ok && n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

func (c *Config) list(key string) []string {
	switch v := c.Values[key].(type) {
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, fmt.Sprint(e))
		}
		return out
	case string:
		return []string{v}
	}
	return nil
}

// Run registers the Node and keeps it Ready until ctx ends.
func Run(ctx context.Context, c *Config, getenv func(string) string, log io.Writer) error {
	if err := c.preflight(getenv, log); err != nil {
		return err
	}
	go logCPU(ctx, cpuEvery, log)
	f, err := parseFaults(getenv("LIKEN_STANDIN_FAULT"))
	if err != nil {
		return fmt.Errorf("LIKEN_STANDIN_FAULT: %w", err)
	}
	if f.slowStart > 0 {
		fmt.Fprintf(log, "k3s-standin: fault slow-start: waiting %s\n", f.slowStart)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.slowStart):
		}
	}
	var crash <-chan time.Time
	if f.crashAfter > 0 {
		crash = time.After(f.crashAfter)
	}
	neverReady := f.neverReady
	var lateBootID time.Time
	if f.lateBootID > 0 {
		lateBootID = time.Now().Add(f.lateBootID)
		fmt.Fprintf(log, "k3s-standin: fault late-boot-id: the Node keeps the last boot's system info for %s\n", f.lateBootID)
	}
	if f.podsNotReady {
		fmt.Fprintln(log, "k3s-standin: fault pods-not-ready: this node's pods are reported Running but not Ready (a release that breaks the workloads, not k3s)")
	}

	kc := getenv("LIKEN_STANDIN_KUBECONFIG")
	if kc == "" {
		return errors.New("LIKEN_STANDIN_KUBECONFIG is not set: the stand-in needs a node identity to register with")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		return fmt.Errorf("reading %s: %w", kc, err)
	}
	if err := c.checkTokenCA(rc.TLSClientConfig.CAData); err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	name := c.NodeName()
	if parts := getenv("LIKEN_STANDIN_NODE"); parts != "" {
		if !lateBootID.IsZero() {
			return errors.New("LIKEN_STANDIN_FAULT late-boot-id plays a kubelet that has not reported yet: a real node's kubelet reports for itself")
		}
		if f.podsNotReady {
			return errors.New("LIKEN_STANDIN_FAULT pods-not-ready plays a simulated node's pods: a real node's kubelet reports its own")
		}
		return c.runNode(ctx, parts, kc, neverReady, crash, getenv, log)
	}
	var ready atomic.Bool
	addr := getenv("LIKEN_STANDIN_HEALTHZ")
	if addr == "" {
		addr = "127.0.0.1:10248"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("readiness endpoint: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ready.Load() {
			io.WriteString(w, "ok")
			return
		}
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	defer srv.Close()

	cpDone, stopCP, err := c.startServer(ctx, client, name, getenv, log, true)
	if err != nil || stopCP == nil {
		return err
	}
	defer stopCP()
	fmt.Fprintf(log, "k3s-standin: %s %s registered: a simulated node (no containerd, kubelet or kube-proxy; LIKEN_STANDIN_NODE unset): pods bound to it are reported Running, but no container runs\n", c.Role, name)
	bootIDFile := getenv("LIKEN_STANDIN_BOOT_ID_FILE")
	if bootIDFile == "" {
		bootIDFile = "/proc/sys/kernel/random/boot_id"
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		host := c.nodeStatus(bootIDFile)
		if !lateBootID.IsZero() {
			if time.Now().Before(lateBootID) {
				host.NodeInfo.BootID = "" // heartbeat keeps the Node's
			} else {
				lateBootID = time.Time{}
				fmt.Fprintf(log, "k3s-standin: fault late-boot-id over: reporting this boot's ID %s\n", host.NodeInfo.BootID)
			}
		}
		if err := heartbeat(ctx, client, name, !neverReady, host); err != nil {
			fmt.Fprintf(log, "k3s-standin: heartbeat: %v\n", err)
		} else {
			ready.Store(!neverReady)
		}
		if err := tendPods(ctx, client, name, !f.podsNotReady, log); err != nil {
			fmt.Fprintf(log, "k3s-standin: pods: %v\n", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-crash:
			return errors.New("fault crash-after: exiting as k3s does when containerd or the kubelet dies")
		case err := <-cpDone:
			return fmt.Errorf("the control plane stopped, so k3s-standin exits as k3s does: %w", err)
		case <-tick.C:
		}
	}
}

// startServer starts a server's control plane when LIKEN_STANDIN_CONTROL_PLANE names
// its programs, and then registers the Node (simulated: register) or waits for the kubelet
// to (a real node) and labels its roles. It returns the control plane's end (nil when it
// runs none) and a function that stops it; a nil function with a nil error means ctx ended
// first.
func (c *Config) startServer(ctx context.Context, client kubernetes.Interface, name string, getenv func(string) string, log io.Writer, simulated bool) (<-chan error, func(), error) {
	dir := getenv("LIKEN_STANDIN_CONTROL_PLANE")
	if dir == "" || c.Role != "server" {
		if simulated {
			if err := registerWhenUp(ctx, client, c, name, log); err != nil || ctx.Err() != nil {
				return nil, nil, err
			}
		}
		return nil, func() {}, nil
	}
	cp, err := c.controlPlane(dir, log)
	if err != nil {
		return nil, nil, err
	}
	cpCtx, stop := context.WithCancel(ctx)
	admin, done, finished, err := startControlPlane(cpCtx, cp)
	if err != nil || admin == nil {
		stop()
		<-finished
		return nil, nil, err // nil: stopped before it was ready
	}
	stopAll := func() { stop(); <-finished }
	if simulated {
		if err := registerWhenUp(ctx, client, c, name, log); err != nil || ctx.Err() != nil {
			stopAll()
			return nil, nil, err
		}
		// k3s's server, not its kubelet, labels a server's Node with its roles: NodeRestriction
		// forbids a node to set them on itself.
		if err := labelRoles(ctx, admin, name); err != nil {
			stopAll()
			return nil, nil, err
		}
	} else {
		go labelRolesOnceRegistered(ctx, admin, name, log)
	}
	// The etcd leader's report of its members on their Nodes, as k3s's.
	if ac, err := kubernetes.NewForConfig(admin); err == nil {
		go reportEtcd(cpCtx, ac, cp.NodeName, cp.etcd.name, cp.AdvertiseIP, cp.etcd.leaderCheck, log)
	}
	return done, stopAll, nil
}

// labelRolesOnceRegistered labels a server's Node with its roles once its kubelet has
// registered it, as k3s's server does.
func labelRolesOnceRegistered(ctx context.Context, admin *rest.Config, name string, log io.Writer) {
	for {
		err := labelRoles(ctx, admin, name)
		if err == nil {
			fmt.Fprintf(log, "k3s-standin: labelled node %s with its roles\n", name)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

// runNode runs the stand-in with a real node: upstream containerd, kubelet, kube-proxy and
// flannel (noderun.go) beside a server's control plane. The kubelet registers the Node,
// keeps it Ready, serves the readiness check on 127.0.0.1:10248 and runs the pods.
func (c *Config) runNode(ctx context.Context, parts, kubeconfig string, neverReady bool, crash <-chan time.Time, getenv func(string) string, log io.Writer) error {
	n, err := c.node()
	if err != nil {
		return err
	}
	cpDone, stopCP, err := c.startServer(ctx, nil, n.NodeName, getenv, log, false)
	if err != nil || stopCP == nil {
		return err
	}
	defer stopCP()
	nodeDone := make(chan error, 1)
	nodeCtx, stopNode := context.WithCancel(ctx)
	defer stopNode()
	started := !neverReady
	if neverReady {
		fmt.Fprintln(log, "k3s-standin: fault never-ready: the node's containerd, kubelet, kube-proxy and flannel are not started")
	} else {
		hash := filepath.Base(getenv("K3S_DATA_DIR"))
		if hash == "." || hash == "" {
			hash = dataHash
		}
		in := NodeInput{Parts: parts, Kubeconfig: kubeconfig, Hash: hash, Log: log}
		// An agent reaches the servers through its load balancer, as k3s's agent does; a
		// server its own API server.
		if server := c.str("server"); c.Role == "agent" && server != "" {
			lb, err := c.loadBalancer(server, log)
			if err != nil {
				return err
			}
			if err := lb.serve(nodeCtx); err != nil {
				return err
			}
			in.APIServer = lb.URL()
			go func() {
				// The servers' addresses, watched through the load balancer with the
				// k3s-controller's credential, as k3s's agent watches them.
				cfg, err := clientcmd.BuildConfigFromFlags("", n.agent("k3scontroller.kubeconfig"))
				for err != nil && nodeCtx.Err() == nil { // written by RunNode shortly
					time.Sleep(time.Second)
					cfg, err = clientcmd.BuildConfigFromFlags("", n.agent("k3scontroller.kubeconfig"))
				}
				if err == nil {
					lb.watchServers(nodeCtx, kubernetes.NewForConfigOrDie(cfg))
				}
			}()
		}
		go func() {
			nodeDone <- n.RunNode(nodeCtx, in)
		}()
	}
	fmt.Fprintf(log, "k3s-standin: %s %s: a real node (containerd, kubelet, kube-proxy, flannel from %s)\n", c.Role, n.NodeName, parts)
	select {
	case <-ctx.Done():
		stopNode()
		if started {
			<-nodeDone
		}
		return nil
	case <-crash:
		return errors.New("fault crash-after: exiting as k3s does when containerd or the kubelet dies")
	case err := <-cpDone:
		return fmt.Errorf("the control plane stopped, so k3s-standin exits as k3s does: %w", err)
	case err := <-nodeDone:
		return fmt.Errorf("the node stopped, so k3s-standin exits as k3s does: %w", err)
	}
}

// loadBalancer is the agent's load balancer for server, on lb-server-port (k3s's key;
// default 6444).
func (c *Config) loadBalancer(server string, log io.Writer) (*loadBalancer, error) {
	port := lbServerPort
	if p := c.str("lb-server-port"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("lb-server-port %q is not a port", p)
		}
		port = n
	}
	return newLoadBalancer(c.dataDir(), server, port, log)
}

// node is the Node a config file describes, with k3s's keys.
func (c *Config) node() (*Node, error) {
	n := &Node{DataDir: c.dataDir(), NodeName: c.NodeName(), NodeIP: c.str("node-ip"), ClusterCIDR: c.str("cluster-cidr"),
		ClusterDNS: c.str("cluster-dns"), ClusterDomain: c.str("cluster-domain"), PauseImage: c.str("pause-image"),
		Labels: c.list("node-label"), Taints: c.list("node-taint"), ResolvConf: c.str("resolv-conf"),
		Registries: c.Registries, ImageDirs: []string{apirelease.StandInImagesDir}, Args: map[string][]string{}}
	for _, comp := range []string{"kubelet", "kube-proxy"} {
		for _, a := range c.list(comp + "-arg") {
			n.Args[comp] = append(n.Args[comp], "--"+strings.TrimPrefix(a, "--"))
		}
	}
	if _, err := n.KubeletConfig(); err != nil {
		return nil, err
	}
	if _, _, err := RegistryHosts(n.Registries); err != nil {
		return nil, err
	}
	return n, nil
}

// checkTokenCA checks a joining machine's token against the cluster CA it trusts, as k3s
// checks a secure token's CA hash (K10<sha256 of the CA bundle>::user:password) before it
// sends its credentials. k3s compares it with the server's /cacerts; the stand-in's server has
// no supervisor to serve that, so the CA is the one the machine's kubeconfig trusts (from its
// layer), and the password is not presented to anyone.
func (c *Config) checkTokenCA(ca []byte) error {
	if _, joining := c.Values["server"]; !joining {
		return nil
	}
	// A token the stand-in cannot read is left to the server to judge (k3s itself would
	// stop here; the stand-in's tests of other things run without one).
	tok, _ := c.secret("token")
	hash, ok := strings.CutPrefix(tok, "K10")
	hash, _, secure := strings.Cut(hash, "::")
	if !ok || !secure || len(hash) != 64 {
		return nil // a short token: k3s too joins without a CA check
	}
	sum := sha256.Sum256(ca)
	if hex.EncodeToString(sum[:]) != hash {
		return errors.New("token CA hash does not match the Cluster CA certificate hash: the token is for another cluster")
	}
	return nil
}

// registerWhenUp registers the Node, waiting for the API server as k3s's agent waits for its
// server ("Waiting to retrieve agent configuration; server is not ready").
func registerWhenUp(ctx context.Context, client kubernetes.Interface, c *Config, name string, log io.Writer) error {
	for said := false; ; {
		err := register(ctx, client, c, name)
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !said {
			fmt.Fprintf(log, "k3s-standin: waiting for the API server: %v\n", err)
			said = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

// register creates the Node with the labels and taints of the config file (k3s applies
// node-label and node-taint only when the Node registers).
func register(ctx context.Context, client kubernetes.Interface, c *Config, name string) error {
	labels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.liken.dev/k3s": "stand-in"}
	// k3s's server, not its kubelet, adds the node-role labels: NodeRestriction forbids a
	// node to set them on itself.
	for _, l := range c.list("node-label") {
		if k, v, ok := strings.Cut(l, "="); ok {
			labels[k] = v
		}
	}
	var taints []corev1.Taint
	for _, t := range c.list("node-taint") {
		kv, effect, _ := strings.Cut(t, ":")
		k, v, _ := strings.Cut(kv, "=")
		taints = append(taints, corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffect(effect)})
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
	_, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("registering Node %s: %w", name, err)
	}
	return nil
}

// nodeStatus is what a kubelet reports about its host: its addresses and system info, the
// boot ID from the kernel (so a reboot shows in the Node, as with a kubelet), read from
// bootIDFile.
func (c *Config) nodeStatus(bootIDFile string) corev1.NodeStatus {
	read := func(path string) string {
		b, _ := os.ReadFile(path)
		return strings.TrimSpace(string(b))
	}
	osImage := "unknown"
	for _, l := range strings.Split(read("/etc/os-release"), "\n") {
		if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
			osImage = strings.Trim(v, `"`)
		}
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	ip, _ := c.Values["node-ip"].(string)
	if ip == "" {
		ip = firstHostIP()
	}
	// What a kubelet reports it can hold, so that the scheduler places pods here (with none,
	// it reports "Too many pods"): the kubelet's default of 110 pods (--max-pods, which k3s
	// keeps), the machine's CPUs and memory, nothing reserved.
	capacity := corev1.ResourceList{
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(hardware.Default.Memory(), resource.BinarySI),
	}
	return corev1.NodeStatus{
		Capacity: capacity, Allocatable: capacity.DeepCopy(),
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: c.NodeName()}},
		NodeInfo: corev1.NodeSystemInfo{
			BootID: read(bootIDFile), MachineID: read("/etc/machine-id"),
			KernelVersion: unix.ByteSliceToString(uts.Release[:]), OSImage: osImage, OperatingSystem: "linux", Architecture: runtime.GOARCH,
			ContainerRuntimeVersion: "stand-in://none", KubeletVersion: "v1.37.2-standin", KubeProxyVersion: "",
		},
	}
}

func heartbeat(ctx context.Context, client kubernetes.Interface, name string, ready bool, host corev1.NodeStatus) error {
	now := metav1.NowMicro()
	leases := client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		d := int32(40)
		lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &d, RenewTime: &now}}
		if _, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating node lease: %w", err)
		}
	case err != nil:
		return err
	default:
		lease.Spec.RenewTime = &now
		if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("renewing node lease: %w", err)
		}
	}
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	status, reason, msg := corev1.ConditionTrue, "KubeletReady", "k3s stand-in is ready"
	if !ready {
		status, reason, msg = corev1.ConditionFalse, "KubeletNotReady", "k3s stand-in fault never-ready"
	}
	cond := corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, Message: msg,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == status {
			cond.LastTransitionTime = c.LastTransitionTime
		}
	}
	if host.NodeInfo.BootID == "" {
		host.NodeInfo = node.Status.NodeInfo // a kubelet that has not reported yet (fault late-boot-id)
	}
	// Only the heartbeat time changes between beats; skip the write unless the status does.
	var kept []corev1.NodeCondition
	same := node.Status.NodeInfo == host.NodeInfo && equality.Semantic.DeepEqual(node.Status.Addresses, host.Addresses) &&
		equality.Semantic.DeepEqual(node.Status.Capacity, host.Capacity) && equality.Semantic.DeepEqual(node.Status.Allocatable, host.Allocatable)
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady {
			kept = append(kept, c)
		} else if c.Status == status && c.Reason == reason && same {
			return nil
		}
	}
	node.Status.Conditions = append(kept, cond)
	node.Status.NodeInfo, node.Status.Addresses = host.NodeInfo, host.Addresses
	node.Status.Capacity, node.Status.Allocatable = host.Capacity, host.Allocatable
	_, err = client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

// A simulated node's pods carry this reason and message in their status: they are reported
// Running, and no container runs.
const (
	SimulatedPodReason  = "Simulated"
	SimulatedPodMessage = "the k3s stand-in simulates this pod's node (liken.test.node=simulated): no container runs"
)

// tendPods plays the kubelet's part in a pod's life that drains depend on, for the pods
// bound to this Node: a pod not yet running is reported Running and, unless ready is false,
// Ready (no container runs: the stand-in runs none, and the pod's status says so); a pod's
// readiness follows ready (fault pods-not-ready: a release that breaks the workloads); and a
// pod being deleted is removed once its grace period has passed, as a kubelet does when its
// containers have stopped. Pods live in the API server, so a restarted stand-in finds and
// reports the same pods.
func tendPods(ctx context.Context, client kubernetes.Interface, name string, ready bool, log io.Writer) error {
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	if err != nil {
		return fmt.Errorf("listing the pods bound to %s: %w", name, err)
	}
	readyStatus := corev1.ConditionTrue
	if !ready {
		readyStatus = corev1.ConditionFalse
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		switch {
		case p.DeletionTimestamp != nil:
			if time.Now().Before(p.DeletionTimestamp.Time) {
				continue // its grace period runs
			}
			zero := int64(0)
			err := client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
				Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("removing pod %s/%s: %w", p.Namespace, p.Name, err)
			}
			fmt.Fprintf(log, "k3s-standin: pod %s/%s terminated (no container ran)\n", p.Namespace, p.Name)
		case p.Status.Phase == corev1.PodPending || p.Status.Phase == "":
			now := metav1.Now()
			p.Status.Phase, p.Status.StartTime = corev1.PodRunning, &now
			// Running for the API's sake (drains and budgets count it), but said to be
			// simulated where a user looks: kubectl get pods shows the reason as its status.
			p.Status.Reason, p.Status.Message = SimulatedPodReason, SimulatedPodMessage
			p.Status.Conditions = []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: readyStatus, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: readyStatus, LastTransitionTime: now},
			}
			if _, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("reporting pod %s/%s running: %w", p.Namespace, p.Name, err)
			}
			fmt.Fprintf(log, "k3s-standin: pod %s/%s reported Running, ready %v (stand-in: no container runs)\n", p.Namespace, p.Name, ready)
		case p.Status.Phase == corev1.PodRunning && podReady(p) != ready:
			now := metav1.Now()
			for j, c := range p.Status.Conditions {
				if c.Type == corev1.ContainersReady || c.Type == corev1.PodReady {
					p.Status.Conditions[j].Status, p.Status.Conditions[j].LastTransitionTime = readyStatus, now
				}
			}
			if _, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("reporting pod %s/%s ready %v: %w", p.Namespace, p.Name, ready, err)
			}
			fmt.Fprintf(log, "k3s-standin: pod %s/%s reported ready %v (stand-in: no container runs)\n", p.Namespace, p.Name, ready)
		}
	}
	return nil
}

// podReady is whether p's Ready condition is True.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// controlPlane is the control plane a server's config file describes, with k3s's keys.
func (c *Config) controlPlane(bin string, log io.Writer) (*ControlPlane, error) {
	cp := &ControlPlane{DataDir: c.str("data-dir"), Bin: bin, NodeName: c.NodeName(), AdvertiseIP: c.str("advertise-address"),
		SANs: c.list("tls-san"), BindAddress: c.str("bind-address"), KubeconfigOut: c.str("write-kubeconfig"),
		ServiceCIDR: c.str("service-cidr"), ClusterCIDR: c.str("cluster-cidr"), ClusterDNS: c.str("cluster-dns"), ClusterDomain: c.str("cluster-domain"),
		Join: c.str("server"), Log: log, Args: map[string][]string{}}
	// The release's CoreDNS image (an air-gap archive the nodes import), unless disabled as
	// k3s's --disable coredns does.
	if _, err := os.Stat(filepath.Join(apirelease.StandInImagesDir, apirelease.StandInCoreDNSArchive)); err == nil && !slices.Contains(c.list("disable"), "coredns") {
		cp.CoreDNSImage = apirelease.StandInCoreDNSImage
	}
	if cp.DataDir == "" {
		cp.DataDir = "/var/lib/rancher/k3s"
	}
	if cp.AdvertiseIP == "" {
		cp.AdvertiseIP = c.str("node-ip") // as k3s defaults it
	}
	if p := c.str("https-listen-port"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("https-listen-port %q is not a port", p)
		}
		cp.Port = n
	}
	var err error
	if cp.Token, err = c.secret("token"); err != nil {
		return nil, err
	}
	if cp.AgentToken, err = c.secret("agent-token"); err != nil {
		return nil, err
	}
	for _, comp := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		for _, a := range c.list(comp + "-arg") {
			cp.Args[comp] = append(cp.Args[comp], "--"+strings.TrimPrefix(a, "--"))
		}
	}
	return cp, nil
}

// str is a config key's value as a string ("" when unset).
func (c *Config) str(k string) string {
	if v, ok := c.Values[k]; ok && v != nil {
		return fmt.Sprint(v)
	}
	return ""
}

// secret is KEY, else the content of KEY-file, as k3s reads its tokens.
func (c *Config) secret(key string) (string, error) {
	if v, ok := c.Values[key].(string); ok && v != "" {
		return v, nil
	}
	f, ok := c.Values[key+"-file"].(string)
	if !ok || f == "" {
		return "", nil
	}
	b, err := os.ReadFile(f)
	if err != nil {
		return "", fmt.Errorf("reading %s-file: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// startControlPlane runs cp in the background and returns its admin config once the API
// answers (nil if ctx ended first), a channel that gives Run's result, and one closed once Run
// has returned.
func startControlPlane(ctx context.Context, cp *ControlPlane) (*rest.Config, <-chan error, <-chan struct{}, error) {
	ready := make(chan *rest.Config, 1)
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		done <- cp.Run(ctx, func(c *rest.Config) { ready <- c })
	}()
	select {
	case admin := <-ready:
		return admin, done, finished, nil
	case err := <-done:
		if err == nil {
			return nil, nil, finished, nil
		}
		return nil, nil, finished, fmt.Errorf("the control plane: %w", err)
	}
}

func labelRoles(ctx context.Context, admin *rest.Config, name string) error {
	client, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	patch := []byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":"true","node-role.kubernetes.io/master":"true"}}}`)
	if _, err := client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling Node %s with its roles: %w", name, err)
	}
	return nil
}
