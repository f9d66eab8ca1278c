package standin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/host/hardware"
	"liken.dev/liken/internal/kubeconfig"
	"liken.dev/liken/internal/pki"
)

// ControlPlane runs a real Kubernetes control plane the way k3s lays one out, for the stand-in's
// `server` mode: upstream etcd, kube-apiserver, kube-controller-manager and kube-scheduler (the
// static builds of test/tools) as child processes, from k3s's data directory. k3s runs the same
// components as goroutines of one process; the files are where k3s keeps them:
//
//	server/tls/*-ca.{crt,key}, service.key   the cluster's CAs (liken's layer puts them there)
//	server/tls/serving-kube-apiserver.*      minted from server-ca, as k3s mints it
//	server/tls/client-{admin,controller,scheduler,kube-apiserver,auth-proxy}.*
//	server/cred/{admin,controller,scheduler}.kubeconfig
//	server/token, server/agent-token         the join tokens, as k3s writes them
//	server/tls/etcd/*                        etcd's CAs (the layer's) and leaves, as k3s's
//	server/db/etcd                           etcd's data; its member's name in db/etcd/name
//	server/manifests                         applied as k3s's deploy controller applies them
//	/etc/rancher/k3s/k3s.yaml                the admin kubeconfig (write-kubeconfig)
//
// Where it differs from k3s, on purpose and said here: a server joins another through that
// server's etcd, not k3s's supervisor (etcd.go); kube-apiserver listens on 6443 itself (k3s puts its supervisor there,
// which also serves /cacerts and node certificates; the stand-in's machines take their node
// credentials from liken's layer); component logs go to server/logs, not k3s's own output.
type ControlPlane struct {
	DataDir  string
	Bin      string // holds etcd, kube-apiserver, kube-controller-manager, kube-scheduler
	NodeName string
	// AdvertiseIP is the address the API server gives in the kubernetes Service; empty
	// means the first non-loopback address of the host, else 127.0.0.1.
	AdvertiseIP string
	SANs        []string // further names and addresses for the serving certificate (tls-san)
	BindAddress string   // default 0.0.0.0
	Port        int      // default 6443 (https-listen-port)
	// KubeconfigOut is write-kubeconfig (default /etc/rancher/k3s/k3s.yaml).
	KubeconfigOut string
	ServiceCIDR   string // default 10.43.0.0/16
	ClusterCIDR   string // default 10.42.0.0/16
	ClusterDNS    string // default 10.43.0.10
	ClusterDomain string // default cluster.local
	// CoreDNSImage, when set, is the cluster DNS image the nodes have (the release's): the
	// server deploys CoreDNS as k3s does (coredns.go). Empty, no cluster DNS.
	CoreDNSImage string
	// Token and AgentToken are written to server/token and server/agent-token, as k3s writes
	// the tokens it was given (server/node-token is a link to server/token).
	Token, AgentToken string
	// Args are further component flags, by component (kube-apiserver-arg, ...).
	Args map[string][]string
	Log  io.Writer
	// Join is the server URL (k3s's --server) of a server whose cluster this one joins;
	// empty, this server starts a cluster of its own (k3s's --cluster-init) unless its etcd
	// is a member already. JoinEtcdPort is that server's etcd client port (2379, k3s's).
	Join         string
	JoinEtcdPort int
	// Ports of the other components: k3s's defaults unless set (tests run several at once).
	EtcdPort, EtcdPeerPort, ControllerPort, SchedulerPort int

	etcd *etcdMember
}

// Components are the programs ControlPlane runs, in start order.
var Components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// leafLifetime and renewWithin are k3s's: leaf certificates last a year and are renewed at
// start when they expire within 120 days.
const (
	leafLifetime = 365 * 24 * time.Hour
	renewWithin  = 120 * 24 * time.Hour
)

func (cp *ControlPlane) defaults() {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&cp.Port, 6443)
	def(&cp.EtcdPort, etcdPort)
	def(&cp.EtcdPeerPort, etcdPeerPort)
	def(&cp.JoinEtcdPort, etcdPort)
	def(&cp.ControllerPort, 10257)
	def(&cp.SchedulerPort, 10259)
	if cp.BindAddress == "" {
		cp.BindAddress = "0.0.0.0"
	}
	if cp.KubeconfigOut == "" {
		cp.KubeconfigOut = "/etc/rancher/k3s/k3s.yaml"
	}
	if cp.ServiceCIDR == "" {
		cp.ServiceCIDR = "10.43.0.0/16"
	}
	if cp.ClusterCIDR == "" {
		cp.ClusterCIDR = "10.42.0.0/16"
	}
	if cp.ClusterDNS == "" {
		cp.ClusterDNS = "10.43.0.10"
	}
	if cp.ClusterDomain == "" {
		cp.ClusterDomain = "cluster.local"
	}
	if cp.AdvertiseIP == "" {
		cp.AdvertiseIP = firstHostIP()
	}
	if cp.Log == nil {
		cp.Log = io.Discard
	}
}

func (cp *ControlPlane) server(parts ...string) string {
	return filepath.Join(append([]string{cp.DataDir, "server"}, parts...)...)
}

// LocalURL is where the components on this machine reach the API server.
func (cp *ControlPlane) LocalURL() string {
	return "https://127.0.0.1:" + strconv.Itoa(cp.Port)
}

// Run starts the control plane, calls ready with an admin client config once the API server
// answers /readyz (and k3s.yaml is written), and returns when ctx ends (stopping every
// component) or when a component exits: k3s exits too when one of its components dies, and
// its supervisor starts it again.
func (cp *ControlPlane) Run(ctx context.Context, ready func(admin *rest.Config)) error {
	cp.defaults()
	for _, c := range Components {
		if _, err := os.Stat(filepath.Join(cp.Bin, c)); err != nil {
			return fmt.Errorf("the stand-in's control plane needs %s in %s: %w", c, cp.Bin, err)
		}
	}
	if err := cp.writeCerts(); err != nil {
		return fmt.Errorf("preparing server/tls: %w", err)
	}
	admin, err := cp.writeKubeconfigs()
	if err != nil {
		return fmt.Errorf("writing the control plane's kubeconfigs: %w", err)
	}
	if err := cp.writeTokens(); err != nil {
		return fmt.Errorf("writing the join tokens: %w", err)
	}
	if err := os.MkdirAll(cp.server("logs"), 0o700); err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited := make(chan error, len(Components))
	var stopped []<-chan struct{}
	defer func() {
		cancel()
		for _, s := range stopped {
			<-s
		}
	}()
	start := func(name string, args ...string) error {
		s, err := cp.spawn(ctx, name, args, exited)
		if err == nil {
			stopped = append(stopped, s)
		}
		return err
	}
	wait := func(what string, check func(context.Context) error) error {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			err := check(ctx)
			if err == nil {
				return nil
			}
			select {
			case err := <-exited:
				return err
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s not ready after 5 minutes: %w", what, err)
			}
		}
	}

	t0 := time.Now()
	// A normal start after a cluster reset ends it: another reset may follow (reset.go).
	if err := os.Remove(cp.server("db", ResetFlagFile)); err == nil {
		fmt.Fprintln(cp.Log, "k3s-standin: started normally after a cluster reset; server/db/reset-flag removed")
	}
	cp.etcd = cp.etcdMember()
	if cp.etcd.client, err = etcdClient(cp.etcd.tls); err != nil {
		return err
	}
	if cp.Join != "" {
		if cp.etcd.join, err = joinEtcdURL(cp.Join, cp.JoinEtcdPort); err != nil {
			return err
		}
	}
	etcdArgs, err := cp.etcd.start(ctx)
	if err != nil {
		return fmt.Errorf("starting etcd: %w", err)
	}
	if err := start("etcd", append(etcdArgs, cp.Args["etcd"]...)...); err != nil {
		return err
	}
	if err := wait("etcd", cp.etcdHealthy); err != nil {
		return err
	}
	go cp.etcd.manageLearners(ctx, etcdStatusEvery)
	// A learner that is not promoted within a minute says why it may be, every minute:
	// what it reports and the end of its etcd's log.
	lastSaid := time.Now()
	if err := wait("etcd's promotion to a voting member", func(ctx context.Context) error {
		err := cp.etcd.voter(ctx)
		if err != nil && time.Since(lastSaid) > time.Minute {
			lastSaid = time.Now()
			b, _ := os.ReadFile(cp.server("logs", "etcd.log"))
			fmt.Fprintf(cp.Log, "k3s-standin: %v; its log ends:\n%s\n", err, lastLines(string(b), 5))
		}
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintf(cp.Log, "k3s-standin: etcd ready after %s\n", time.Since(t0).Round(time.Millisecond))
	if err := start("kube-apiserver", cp.apiserverArgs()...); err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	if err := wait("kube-apiserver", func(ctx context.Context) error {
		return client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
	}); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	fmt.Fprintf(cp.Log, "k3s-standin: kube-apiserver ready on %s after %s\n", cp.LocalURL(), time.Since(t0).Round(time.Millisecond))
	// The controller manager and the scheduler exit when they lose their leader election
	// (they renew it every 2 s within 10 s, which a machine under software emulation misses
	// at times). k3s, which runs them in its own process, exits with them and is started
	// again whole; the stand-in starts the one that exited again, alone, its API server and
	// node left running: said on its log, and in docs/k3s.md.
	for _, c := range []struct {
		name string
		args []string
	}{{"kube-controller-manager", cp.controllerManagerArgs()}, {"kube-scheduler", cp.schedulerArgs()}} {
		s, err := cp.keep(ctx, c.name, c.args)
		if err != nil {
			return err
		}
		stopped = append(stopped, s)
	}
	go (&servingApprover{client: client, log: cp.Log}).run(ctx, 2*time.Second)
	if err := cp.writeAdminKubeconfig(); err != nil {
		return err
	}
	// k3s stages its own manifests there at start; the stand-in the one its nodes need.
	if err := os.MkdirAll(cp.server("manifests"), 0o700); err != nil {
		return err
	}
	if err := atomicfile.Write(cp.server("manifests", "rolebindings.yaml"), []byte(rolebindings), 0o600); err != nil {
		return err
	}
	if cp.CoreDNSImage != "" {
		m, err := coreDNSManifest(cp.ClusterDNS, cp.ClusterDomain, cp.CoreDNSImage)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(cp.server("manifests", "coredns.yaml"), m, 0o600); err != nil {
			return err
		}
		go nodeHostsLoop(ctx, client, cp.Log, 5*time.Second)
	}
	if d, err := newDeployer(admin, cp.server("manifests"), cp.Log); err != nil {
		return fmt.Errorf("starting the manifests deployer: %w", err)
	} else {
		go d.run(ctx, DeployInterval)
	}
	if ready != nil {
		ready(rest.CopyConfig(admin))
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-exited:
		return err
	}
}

// rolebindings is the part of k3s's manifests/rolebindings.yaml a stand-in node needs: the
// system:k3s-controller user's role, which flannel runs as (its kube subnet manager watches
// Nodes and patches their status; docs/research/k3s-node.md, section 4).
const rolebindings = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:k3s-controller
rules:
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [endpoints, pods]
  verbs: [list, get, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:k3s-controller
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:k3s-controller
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: system:k3s-controller
`

// keep runs a component until ctx ends, starting it again 5 s after it exits; the returned
// channel closes once it has stopped for good.
func (cp *ControlPlane) keep(ctx context.Context, name string, args []string) (<-chan struct{}, error) {
	exited := make(chan error, 1)
	s, err := cp.spawn(ctx, name, args, exited)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				<-s
				return
			case err := <-exited:
				<-s
				fmt.Fprintf(cp.Log, "k3s-standin: %v\nk3s-standin: starting %s again in 5 s, alone (k3s would exit and be started again whole)\n", err, name)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
			if s, err = cp.spawn(ctx, name, args, exited); err != nil {
				fmt.Fprintf(cp.Log, "k3s-standin: %v\n", err)
				return
			}
		}
	}()
	return done, nil
}

// spawn starts one component, its output in server/logs/NAME.log.
func (cp *ControlPlane) spawn(ctx context.Context, name string, args []string, exited chan<- error) (<-chan struct{}, error) {
	return spawnPart(ctx, name, filepath.Join(cp.Bin, name), args, []string{"PATH=/usr/bin:/sbin:/bin"}, cp.server("logs", name+".log"), cp.Log, exited)
}

// spawnPart starts one of k3s's parts, its output in logPath (truncated at each start, so the
// logs stay the size of one run). A part that exits reports on exited with the end of its
// log, unless ctx ended first; the returned channel closes once it has exited.
func spawnPart(ctx context.Context, name, path string, args, env []string, logPath string, log io.Writer, exited chan<- error) (<-chan struct{}, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env
	// Stopping: SIGTERM, then SIGKILL after a grace period; and a part never outlives the
	// stand-in (k3s's are goroutines, or children it starts with the same setting).
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	fmt.Fprintf(log, "k3s-standin: started %s (pid %d, log %s)\n", name, cmd.Process.Pid, logPath)
	parts.started(name, cmd.Process.Pid)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		err := cmd.Wait()
		parts.exited(name, cmd.ProcessState)
		logf.Close()
		if ctx.Err() != nil {
			return
		}
		exited <- fmt.Errorf("%s exited (%v); the end of its log:\n%s", name, err, tail(logPath, 15))
	}()
	return stopped, nil
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var out bytes.Buffer
	for _, l := range lines {
		out.WriteString("  " + l + "\n")
	}
	return out.String()
}

// etcdMember is this server's etcd member (etcd.go), without its client or join yet.
func (cp *ControlPlane) etcdMember() *etcdMember {
	return &etcdMember{dir: cp.server("db", "etcd"), tls: cp.server("tls", "etcd"), node: cp.NodeName, ip: cp.AdvertiseIP,
		port: cp.EtcdPort, peerPort: cp.EtcdPeerPort, log: cp.Log}
}

// etcdHealthy asks the local member's /health, as a client of etcd.
func (cp *ControlPlane) etcdHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.etcd.localURL()+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := cp.etcd.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"health":"true"`)) {
		return fmt.Errorf("etcd /health: %d %s", resp.StatusCode, b)
	}
	return nil
}

// apiserverArgs are k3s's kube-apiserver flags (pkg/daemons/control/server.go), with the
// stand-in's differences: no egress selector (no supervisor tunnel), no kine.
func (cp *ControlPlane) apiserverArgs() []string {
	tls := func(f string) string { return cp.server("tls", f) }
	args := []string{
		"--advertise-address=" + cp.AdvertiseIP,
		"--bind-address=" + cp.BindAddress,
		"--secure-port=" + strconv.Itoa(cp.Port),
		// Its own member only, as k3s's (pkg/etcd/etcd.go getEndpoints), with k3s's client
		// certificate.
		fmt.Sprintf("--etcd-servers=https://127.0.0.1:%d", cp.EtcdPort),
		"--etcd-cafile=" + tls("etcd/server-ca.crt"),
		"--etcd-certfile=" + tls("etcd/client.crt"),
		"--etcd-keyfile=" + tls("etcd/client.key"),
		"--storage-backend=etcd3",
		"--cert-dir=" + tls("temporary-certs"),
		"--tls-cert-file=" + tls("serving-kube-apiserver.crt"),
		"--tls-private-key-file=" + tls("serving-kube-apiserver.key"),
		"--client-ca-file=" + tls("client-ca.crt"),
		"--requestheader-client-ca-file=" + tls("request-header-ca.crt"),
		"--requestheader-allowed-names=system:auth-proxy",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + tls("client-auth-proxy.crt"),
		"--proxy-client-key-file=" + tls("client-auth-proxy.key"),
		"--kubelet-client-certificate=" + tls("client-kube-apiserver.crt"),
		"--kubelet-client-key=" + tls("client-kube-apiserver.key"),
		"--kubelet-certificate-authority=" + tls("server-ca.crt"),
		// k3s's (without flannel-external-ip): the API server reaches a kubelet, for logs,
		// exec and the node proxy, at its Node's InternalIP, not at a hostname nothing
		// resolves; k3s's egress tunnel aside, which the stand-in has not.
		"--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--anonymous-auth=false",
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--api-audiences=https://kubernetes.default.svc.cluster.local,k3s",
		"--service-account-key-file=" + tls("service.key"),
		"--service-account-signing-key-file=" + tls("service.key"),
		"--service-cluster-ip-range=" + cp.ServiceCIDR,
		"--service-node-port-range=30000-32767",
		"--profiling=false",
	}
	if ip := net.ParseIP(cp.AdvertiseIP); ip != nil && ip.IsLoopback() {
		// The API server refuses a loopback address as the kubernetes Service's endpoint.
		args = append(args, "--endpoint-reconciler-type=none")
	}
	return append(args, cp.Args["kube-apiserver"]...)
}

// controllerManagerArgs are k3s's (pkg/daemons/control/server.go), token cleaner included. The
// cloud controllers k3s turns off are not in upstream's controller manager any more.
func (cp *ControlPlane) controllerManagerArgs() []string {
	tls := func(f string) string { return cp.server("tls", f) }
	kc := cp.server("cred", "controller.kubeconfig")
	return append([]string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.ControllerPort),
		"--profiling=false",
		// On: k3s turns it off only for a datastore that cannot elect (kine,
		// pkg/cluster: NoLeaderElect); with etcd every server runs one and one leads.
		"--leader-elect=true",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + tls("service.key"),
		"--root-ca-file=" + tls("server-ca.crt"),
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + cp.ClusterCIDR,
		"--service-cluster-ip-range=" + cp.ServiceCIDR,
		"--cluster-signing-kube-apiserver-client-cert-file=" + tls("client-ca.crt"),
		"--cluster-signing-kube-apiserver-client-key-file=" + tls("client-ca.key"),
		"--cluster-signing-kubelet-client-cert-file=" + tls("client-ca.crt"),
		"--cluster-signing-kubelet-client-key-file=" + tls("client-ca.key"),
		"--cluster-signing-kubelet-serving-cert-file=" + tls("server-ca.crt"),
		"--cluster-signing-kubelet-serving-key-file=" + tls("server-ca.key"),
		"--cluster-signing-legacy-unknown-cert-file=" + tls("server-ca.crt"),
		"--cluster-signing-legacy-unknown-key-file=" + tls("server-ca.key"),
		"--controllers=*,token-cleaner-controller",
		"--cert-dir=" + tls("temporary-certs"),
	}, cp.Args["kube-controller-manager"]...)
}

func (cp *ControlPlane) schedulerArgs() []string {
	kc := cp.server("cred", "scheduler.kubeconfig")
	return append([]string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.SchedulerPort),
		"--profiling=false",
		"--leader-elect=true", // as the controller manager's
		"--cert-dir=" + cp.server("tls", "temporary-certs"),
	}, cp.Args["kube-scheduler"]...)
}

// leaf is one certificate k3s mints at start: its file stem in server/tls, the CA that signs
// it, and its subject (user: a client certificate's, a serving one's common name) and, for a
// serving one, the server's names; peer ones serve and dial (etcd's members).
type leaf struct {
	stem, ca, user string
	groups         []string
	serving, peer  bool
}

var leaves = []leaf{
	{stem: "serving-kube-apiserver", ca: "server-ca", user: "kube-apiserver", serving: true},
	{stem: "client-admin", ca: "client-ca", user: "system:admin", groups: []string{"system:masters"}},
	{stem: "client-controller", ca: "client-ca", user: "system:kube-controller-manager"},
	{stem: "client-scheduler", ca: "client-ca", user: "system:kube-scheduler"},
	{stem: "client-kube-apiserver", ca: "client-ca", user: "system:apiserver", groups: []string{"system:masters"}},
	{stem: "client-auth-proxy", ca: "request-header-ca", user: "system:auth-proxy"},
	// etcd's, as k3s mints them (pkg/daemons/control/deps/deps.go genETCDCerts): the
	// client port's serving certificate and the peers' from their own CAs, with the server's
	// names; the client certificate kube-apiserver and k3s's own calls present.
	{stem: "etcd/server-client", ca: "etcd/server-ca", user: "etcd-server", serving: true, peer: true},
	{stem: "etcd/peer-server-client", ca: "etcd/peer-ca", user: "etcd-peer", serving: true, peer: true},
	{stem: "etcd/client", ca: "etcd/server-ca", user: "etcd-client"},
}

// servingNames are the serving certificate's names: k3s's fixed ones, the node name, the
// kubernetes Service's address, loopback, the advertised address and tls-san.
func (cp *ControlPlane) servingNames() ([]string, []net.IP) {
	dns := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", cp.NodeName}
	ips := []net.IP{net.ParseIP("127.0.0.1").To4(), net.IPv6loopback}
	if _, n, err := net.ParseCIDR(cp.ServiceCIDR); err == nil {
		first := slices.Clone(n.IP.To4())
		if first != nil {
			first[3]++
			ips = append(ips, first)
		}
	}
	// Every address of the host, as k3s's listener adds the address a client asked for: an
	// agent may join on any of them.
	for _, s := range append(append([]string{cp.AdvertiseIP}, hostIPs()...), cp.SANs...) {
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else if s != "" {
			dns = append(dns, s)
		}
	}
	return dns, ips
}

// writeCerts mints the leaf certificates from the CAs in server/tls, as k3s does at every
// start: a certificate is kept unless it is missing, expires within 120 days, is not signed
// by its CA, or (the serving one) lacks a name it must carry.
func (cp *ControlPlane) writeCerts() error {
	dir := cp.server("tls")
	cas := map[string]*pki.CA{}
	for _, name := range []string{"server-ca", "client-ca", "request-header-ca", "etcd/server-ca", "etcd/peer-ca"} {
		ca, err := pki.LoadCA(dir, name)
		if err != nil {
			return fmt.Errorf("the stand-in takes the cluster's CAs from %s (liken's layer puts them there; k3s would make its own): %w", dir, err)
		}
		cas[name] = ca
	}
	if _, err := os.Stat(filepath.Join(dir, "service.key")); err != nil {
		return fmt.Errorf("the service-account key: %w", err)
	}
	dns, ips := cp.servingNames()
	for _, l := range leaves {
		certPath, keyPath := filepath.Join(dir, l.stem+".crt"), filepath.Join(dir, l.stem+".key")
		if keep(certPath, cas[l.ca], l, dns, ips) {
			continue
		}
		var p pki.Pair
		var err error
		switch {
		case l.peer:
			p, err = cas[l.ca].PeerCert(l.user, dns, ips, leafLifetime)
		case l.serving:
			p, err = cas[l.ca].ServingCert(l.user, dns, ips, leafLifetime)
		default:
			p, err = cas[l.ca].ClientCert(l.user, l.groups, leafLifetime)
		}
		if err != nil {
			return fmt.Errorf("minting %s: %w", l.stem, err)
		}
		if err := atomicfile.Write(keyPath, p.KeyPEM, 0o600); err != nil {
			return err
		}
		if err := atomicfile.Write(certPath, p.CertPEM, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(cp.Log, "k3s-standin: minted server/tls/%s.crt from %s\n", l.stem, l.ca)
	}
	return nil
}

func keep(certPath string, ca *pki.CA, l leaf, dns []string, ips []net.IP) bool {
	b, err := os.ReadFile(certPath)
	if err != nil {
		return false
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return false
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || time.Until(c.NotAfter) < renewWithin || c.CheckSignatureFrom(ca.Cert) != nil {
		return false
	}
	if !l.serving {
		return c.Subject.CommonName == l.user
	}
	for _, d := range dns {
		if !slices.Contains(c.DNSNames, d) {
			return false
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// writeKubeconfigs writes server/cred's kubeconfigs and returns the admin's client config.
func (cp *ControlPlane) writeKubeconfigs() (*rest.Config, error) {
	ca, err := os.ReadFile(cp.server("tls", "server-ca.crt"))
	if err != nil {
		return nil, err
	}
	for name, stem := range map[string]string{"admin": "client-admin", "controller": "client-controller", "scheduler": "client-scheduler"} {
		cert, err1 := os.ReadFile(cp.server("tls", stem+".crt"))
		key, err2 := os.ReadFile(cp.server("tls", stem+".key"))
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		kc, err := kubeconfig.Render(cp.LocalURL(), ca, cert, key)
		if err != nil {
			return nil, err
		}
		if err := atomicfile.Write(cp.server("cred", name+".kubeconfig"), kc, 0o600); err != nil {
			return nil, err
		}
	}
	return clientcmd.BuildConfigFromFlags("", cp.server("cred", "admin.kubeconfig"))
}

func (cp *ControlPlane) writeTokens() error {
	for name, tok := range map[string]string{"token": cp.Token, "agent-token": cp.AgentToken} {
		if tok == "" {
			continue
		}
		if err := atomicfile.Write(cp.server(name), []byte(tok+"\n"), 0o600); err != nil {
			return err
		}
	}
	if cp.Token == "" {
		return nil
	}
	link := cp.server("node-token")
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink("token", link)
}

// writeAdminKubeconfig writes k3s.yaml (mode 0600, as liken asks k3s with
// write-kubeconfig-mode) once the API answers, as k3s does.
func (cp *ControlPlane) writeAdminKubeconfig() error {
	b, err := os.ReadFile(cp.server("cred", "admin.kubeconfig"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(cp.KubeconfigOut), 0o755); err != nil {
		return err
	}
	if err := atomicfile.Write(cp.KubeconfigOut, b, 0o600); err != nil {
		return err
	}
	fmt.Fprintf(cp.Log, "k3s-standin: wrote kubeconfig %s\n", cp.KubeconfigOut)
	return nil
}

// firstHostIP is the first global unicast IPv4 address of the host, as k3s picks its node IP.
func firstHostIP() string {
	for _, ip := range hostIPs() {
		if net.ParseIP(ip).To4() != nil {
			return ip
		}
	}
	return "127.0.0.1"
}

// hostIPs are the host's global unicast addresses.
func hostIPs() []string {
	var out []string
	for _, ip := range hardware.Addresses() {
		out = append(out, ip.String())
	}
	return out
}
