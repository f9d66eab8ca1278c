package standin

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/kubeconfig"
	"liken.dev/liken/test/apiserver"
)

// newControlPlane lays out a data directory as liken's layer and init leave it for k3s (the
// cluster's CAs and service key in server/tls, a manifest in server/manifests) and returns a
// control plane on free loopback ports.
func newControlPlane(t *testing.T, id *identity.Identity, idDir string) *ControlPlane {
	t.Helper()
	if err := apiserver.EnsureTools(t.Context()); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	tlsDir := filepath.Join(data, "server", "tls")
	for name, ca := range id.CAs {
		key, err := ca.KeyPEM()
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(tlsDir, name+".crt"), ca.CertPEM())
		writeFile(t, filepath.Join(tlsDir, name+".key"), key)
	}
	writeFile(t, filepath.Join(tlsDir, "service.key"), id.ServiceKey)
	writeFile(t, filepath.Join(data, "server", "manifests", "hello.yaml"),
		[]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: hello, namespace: default}\ndata: {from: manifests}\n"))
	return &ControlPlane{
		DataDir: data, Bin: apiserver.ToolsDir(), NodeName: "cp-1", AdvertiseIP: "127.0.0.1",
		BindAddress: "127.0.0.1", Port: apiserver.FreePort(), KubeconfigOut: filepath.Join(data, "k3s.yaml"),
		Token: id.ServerToken(), AgentToken: id.AgentToken(), Log: &testLog{t},
		EtcdPort: apiserver.FreePort(), EtcdPeerPort: apiserver.FreePort(), ControllerPort: apiserver.FreePort(), SchedulerPort: apiserver.FreePort(),
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

type testLog struct{ t *testing.T }

func (l *testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// started runs cp until the test ends (through startControlPlane, as the stand-in's server
// runs it) and returns its admin config once it is ready.
func started(t *testing.T, cp *ControlPlane) (*rest.Config, context.CancelFunc, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	admin, done, finished, err := startControlPlane(ctx, cp)
	t.Cleanup(func() { cancel(); <-finished })
	if err != nil || admin == nil {
		t.Fatalf("the control plane stopped before it was ready: %v", err)
	}
	return admin, cancel, done
}

// TestControlPlaneLikeK3s: from the CAs liken's layer provides, the stand-in's control plane
// mints k3s's certificates, runs etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler, writes k3s.yaml and the tokens, applies server/manifests, lets a machine's
// node credential register its Node, and starts again on the same data keeping its
// certificates and objects. The scheduler killed is started again alone; the API server
// killed ends the run, naming it.
func TestControlPlaneLikeK3s(t *testing.T) {
	idDir := t.TempDir()
	id, err := identity.LoadOrCreateIdentity(idDir)
	if err != nil {
		t.Fatal(err)
	}
	cp := newControlPlane(t, id, idDir)
	cp.CoreDNSImage = "docker.io/liken/stand-in-coredns:1.15.0"
	t0 := time.Now()
	admin, cancel, done := started(t, cp)
	t.Logf("control plane ready in %s", time.Since(t0).Round(time.Millisecond))
	ctx := t.Context()

	// k3s.yaml is an admin kubeconfig that verifies the server against the cluster's CA.
	fromFile, err := clientcmd.BuildConfigFromFlags("", cp.KubeconfigOut)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(cp.KubeconfigOut); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("k3s.yaml: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	kube := kubernetes.NewForConfigOrDie(fromFile)
	if _, err := kube.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err != nil {
		t.Fatalf("the admin kubeconfig: %v", err)
	}
	for f, want := range map[string]string{"token": id.ServerToken(), "agent-token": id.AgentToken(), "node-token": id.ServerToken()} {
		b, err := os.ReadFile(filepath.Join(cp.DataDir, "server", f))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("server/%s = %q, %v; want the token", f, b, err)
		}
	}

	// The serving certificate is the cluster's: a client trusting only server-ca accepts it
	// under the node's name.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(id.CAs["server-ca"].CertPEM())
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", cp.Port), &tls.Config{RootCAs: pool, ServerName: "cp-1"})
	if err != nil {
		t.Fatalf("the API's serving certificate, checked against the layer's server CA: %v", err)
	}
	serial := conn.ConnectionState().PeerCertificates[0].SerialNumber
	conn.Close()

	// A machine's node credential from the layer registers its Node (Node authorizer and
	// NodeRestriction, as k3s runs them), and the controller manager gives it a pod CIDR.
	node, err := id.StandInNodeCredential("agent-1")
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubeconfig.Render(cp.LocalURL(), id.CAs["server-ca"].CertPEM(), node.CertPEM, node.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	nodeCfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	nodeClient := kubernetes.NewForConfigOrDie(nodeCfg)
	if _, err := nodeClient.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "agent-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("registering a Node with the layer's node credential: %v", err)
	}
	if _, err := nodeClient.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "someone-else"}}, metav1.CreateOptions{}); err == nil {
		t.Error("a node credential registered another machine's Node: NodeRestriction is not on")
	}
	servingCertificates(t, nodeClient, kube, id.CAs["server-ca"].CertPEM())
	// Cluster DNS as k3s deploys it: coredns.yaml applied, and the coredns ConfigMap's
	// NodeHosts listing the Node's address.
	waitFor(t, time.Minute, "CoreDNS's NodeHosts to list agent-1", func() (bool, error) {
		cm, err := kube.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		return err == nil && strings.Contains(cm.Data["NodeHosts"], "192.168.76.20 agent-1\n"), nil
	})
	if _, err := kube.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{}); err != nil {
		t.Errorf("the kube-dns Service: %v", err)
	}
	waitFor(t, 2*time.Minute, "the controller manager to give agent-1 a pod CIDR", func() (bool, error) {
		n, err := kube.CoreV1().Nodes().Get(ctx, "agent-1", metav1.GetOptions{})
		return err == nil && n.Spec.PodCIDR != "", err
	})
	// The scheduler and the controller manager answer their health checks.
	for name, port := range map[string]int{"kube-scheduler": cp.SchedulerPort, "kube-controller-manager": cp.ControllerPort} {
		if body, err := componentHealthz(port); err != nil || body != "ok" {
			t.Errorf("%s /healthz = %q, %v", name, body, err)
		}
	}
	// server/manifests were applied.
	waitFor(t, time.Minute, "server/manifests to be applied", func() (bool, error) {
		cm, err := kube.CoreV1().ConfigMaps("default").Get(ctx, "hello", metav1.GetOptions{})
		return err == nil && cm.Data["from"] == "manifests", nil
	})
	// The role the stand-in stages for its nodes' flannel: it may watch Nodes and patch their
	// status, and no more of Nodes.
	for _, tc := range []struct {
		verb, sub string
		want      bool
	}{{"list", "", true}, {"watch", "", true}, {"patch", "status", true}, {"delete", "", false}, {"patch", "", false}} {
		waitFor(t, time.Minute, fmt.Sprintf("system:k3s-controller's %s nodes/%s to be %v", tc.verb, tc.sub, tc.want), func() (bool, error) {
			r, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: "system:k3s-controller", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: tc.verb, Resource: "nodes", Subresource: tc.sub}}}, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed == tc.want, err
		})
	}
	_ = admin // the same identity as k3s.yaml: both read server/cred/admin.kubeconfig

	// Stopped, it leaves no component running; started again on the same data, it keeps its
	// certificates and the cluster's objects.
	pids := componentPIDs(t, cp)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("a stopped control plane returned %v", err)
	}
	for name, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("%s (pid %d) still runs after the control plane stopped", name, pid)
		}
	}
	cp.Log = &testLog{t}
	_, _, done2 := started(t, cp)
	conn, err = tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", cp.Port), &tls.Config{RootCAs: pool, ServerName: "cp-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := conn.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(serial) != 0 {
		t.Errorf("the serving certificate was minted again at the second start (serial %v, was %v)", got, serial)
	}
	conn.Close()
	if _, err := kube.CoreV1().Nodes().Get(ctx, "agent-1", metav1.GetOptions{}); err != nil {
		t.Errorf("after a restart, agent-1's Node: %v", err)
	}

	// The scheduler (as the controller manager) killed is started again alone, the run going
	// on; the API server killed ends the run, and the error names it.
	old := componentPIDs(t, cp)["kube-scheduler"]
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		if pid := runningComponents(cp)["kube-scheduler"]; pid != 0 && pid != old {
			break
		}
		select {
		case err := <-done2:
			t.Fatalf("after kube-scheduler was killed the run ended: %v; want it started again alone", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("kube-scheduler was not started again within a minute of being killed")
		}
	}
	if err := syscall.Kill(componentPIDs(t, cp)["kube-apiserver"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done2:
		if err == nil || !strings.Contains(err.Error(), "kube-apiserver exited") {
			t.Errorf("after kube-apiserver was killed, Run returned %v; want an error naming it", err)
		}
	case <-time.After(time.Minute):
		t.Error("the control plane ran on for a minute after kube-apiserver died")
	}
}

// componentPIDs finds the running components by their command lines under cp's data dir.
func componentPIDs(t *testing.T, cp *ControlPlane) map[string]int {
	t.Helper()
	out := runningComponents(cp)
	if len(out) != len(Components) {
		t.Fatalf("found components %v; want %v", out, Components)
	}
	return out
}

// runningComponents are cp's components running now, by name.
func runningComponents(cp *ControlPlane) map[string]int {
	out := map[string]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), cp.DataDir) {
			continue
		}
		argv0, _, _ := strings.Cut(string(b), "\x00")
		out[filepath.Base(argv0)] = pid
	}
	return out
}

func componentHealthz(port int) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get(fmt.Sprintf("https://127.0.0.1:%d/healthz", port))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		done, err := ok()
		if done {
			return
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("waiting for %s: not after %s (last error %v)", what, d, last)
}

// TestServerRunsItsControlPlane: `k3s-standin server` with a k3s config file runs its control
// plane (port, data dir, tokens and kubeconfig from k3s's keys), registers its own Node with
// its roles, and a `k3s-standin agent` with the layer's node credential joins it: both Nodes
// Ready, seen through k3s.yaml.
func TestServerRunsItsControlPlane(t *testing.T) {
	if err := apiserver.EnsureTools(t.Context()); err != nil {
		t.Fatal(err)
	}
	id, err := identity.LoadOrCreateIdentity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "k3s")
	for name, ca := range id.CAs {
		key, _ := ca.KeyPEM()
		writeFile(t, filepath.Join(data, "server", "tls", name+".crt"), ca.CertPEM())
		writeFile(t, filepath.Join(data, "server", "tls", name+".key"), key)
	}
	writeFile(t, filepath.Join(data, "server", "tls", "service.key"), id.ServiceKey)
	writeFile(t, filepath.Join(dir, "token"), []byte(id.ServerToken()+"\n"))
	writeFile(t, filepath.Join(dir, "agent-token"), []byte(id.AgentToken()+"\n"))
	port := apiserver.FreePort()
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	k3sYAML := filepath.Join(dir, "k3s.yaml")
	writeFile(t, filepath.Join(dir, "server.yaml"), fmt.Appendf(nil, `node-name: srv-1
data-dir: %s
https-listen-port: %d
bind-address: 127.0.0.1
advertise-address: 127.0.0.1
write-kubeconfig: %s
token-file: %s
agent-token-file: %s
cluster-init: true
kube-controller-manager-arg: ["node-monitor-grace-period=20s"]
`, data, port, k3sYAML, filepath.Join(dir, "token"), filepath.Join(dir, "agent-token")))
	writeFile(t, filepath.Join(dir, "agent.yaml"), fmt.Appendf(nil, "node-name: agent-1\nserver: %s\ntoken-file: %s\n", url, filepath.Join(dir, "agent-token")))
	nodeKubeconfig := func(name string) string {
		p, err := id.StandInNodeCredential(name)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := kubeconfig.Render(url, id.CAs["server-ca"].CertPEM(), p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name+".kubeconfig")
		writeFile(t, path, kc)
		return path
	}
	run := func(role, name string, env map[string]string) {
		ctx, cancel := context.WithCancel(context.Background())
		finished := make(chan struct{})
		env["LIKEN_STANDIN_KUBECONFIG"] = nodeKubeconfig(name)
		env["LIKEN_STANDIN_HEALTHZ"] = fmt.Sprintf("127.0.0.1:%d", apiserver.FreePort())
		env["LIKEN_STANDIN_PREFLIGHT"] = "off"
		cfg, err := Parse([]string{role, "--config", filepath.Join(dir, role+".yaml")}, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(finished)
			if err := Run(ctx, cfg, func(k string) string { return env[k] }, &testLog{t}); err != nil {
				t.Errorf("k3s-standin %s: %v", role, err)
			}
		}()
		t.Cleanup(func() { cancel(); <-finished })
	}
	run("server", "srv-1", map[string]string{"LIKEN_STANDIN_CONTROL_PLANE": apiserver.ToolsDir()})
	run("agent", "agent-1", map[string]string{})

	waitFor(t, 4*time.Minute, "k3s.yaml", func() (bool, error) {
		_, err := os.Stat(k3sYAML)
		return err == nil, err
	})
	cfg, err := clientcmd.BuildConfigFromFlags("", k3sYAML)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	ready := func(n *corev1.Node) bool {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	}
	waitFor(t, 2*time.Minute, "both Nodes Ready", func() (bool, error) {
		nodes, err := kube.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
		if err != nil || len(nodes.Items) != 2 {
			return false, err
		}
		return ready(&nodes.Items[0]) && ready(&nodes.Items[1]), nil
	})
	srv, err := kube.CoreV1().Nodes().Get(t.Context(), "srv-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if srv.Labels["node-role.kubernetes.io/control-plane"] != "true" {
		t.Errorf("the server's Node labels = %v; want its control-plane role", srv.Labels)
	}
	if b, err := os.ReadFile(filepath.Join(data, "server", "agent-token")); err != nil || strings.TrimSpace(string(b)) != id.AgentToken() {
		t.Errorf("server/agent-token = %q, %v", b, err)
	}

	// An agent whose token is another cluster's is refused before it sends anything.
	otherID, err := identity.LoadOrCreateIdentity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "other-token"), []byte(otherID.AgentToken()+"\n"))
	writeFile(t, filepath.Join(dir, "stray.yaml"), fmt.Appendf(nil, "node-name: stray\nserver: %s\ntoken-file: %s\n", url, filepath.Join(dir, "other-token")))
	cfg2, err := Parse([]string{"agent", "--config", filepath.Join(dir, "stray.yaml")}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"LIKEN_STANDIN_KUBECONFIG": nodeKubeconfig("stray"), "LIKEN_STANDIN_HEALTHZ": fmt.Sprintf("127.0.0.1:%d", apiserver.FreePort()), "LIKEN_STANDIN_PREFLIGHT": "off"}
	if err := Run(t.Context(), cfg2, func(k string) string { return env[k] }, &testLog{t}); err == nil || !strings.Contains(err.Error(), "token CA hash does not match") {
		t.Errorf("an agent with another cluster's token: %v", err)
	}
}

// servingCertificates: a node's request for its own serving certificate (as a kubelet with
// serverTLSBootstrap makes it, naming its host name and the address its Node reports) is
// approved by the stand-in's server and signed with the server CA, for server auth; one
// naming another host is denied.
func servingCertificates(t *testing.T, node, admin kubernetes.Interface, serverCA []byte) {
	t.Helper()
	ctx := t.Context()
	n, err := node.CoreV1().Nodes().Get(ctx, "agent-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.76.20"}, {Type: corev1.NodeHostName, Address: "agent-1"}}
	if _, err := node.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	request := func(name string, dns []string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: "system:node:agent-1", Organization: []string{"system:nodes"}}, DNSNames: dns,
			IPAddresses: []net.IP{net.ParseIP("192.168.76.20")}}, key)
		if err != nil {
			t.Fatal(err)
		}
		csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), SignerName: certificatesv1.KubeletServingSignerName,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}}}
		if _, err := node.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
			t.Fatalf("a node asking for its serving certificate: %v", err)
		}
	}
	request("serving-agent-1", []string{"agent-1"})
	request("serving-elsewhere", []string{"agent-1", "api.example"})
	var signed []byte
	waitFor(t, time.Minute, "node agent-1's serving certificate to be approved and signed", func() (bool, error) {
		c, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, "serving-agent-1", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		signed = c.Status.Certificate
		return len(signed) > 0, nil
	})
	block, _ := pem.Decode(signed)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(serverCA)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "agent-1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the signed serving certificate, checked as the API server checks a kubelet's: %v", err)
	}
	waitFor(t, time.Minute, "the request naming another host to be denied", func() (bool, error) {
		c, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, "serving-elsewhere", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range c.Status.Conditions {
			if cond.Type == certificatesv1.CertificateApproved {
				return false, fmt.Errorf("approved a request naming api.example")
			}
			if cond.Type == certificatesv1.CertificateDenied {
				return true, nil
			}
		}
		return false, nil
	})
}
