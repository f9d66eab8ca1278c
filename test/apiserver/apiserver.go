// Package apiserver runs a real Kubernetes control plane for liken's API-tier tests: etcd,
// kube-apiserver and optionally kube-controller-manager, built from the upstream Go modules
// (test/tools), on free loopback ports in a temporary directory. The API server is
// configured as k3s configures its own (Node,RBAC authorization, the NodeRestriction
// admission plugin, anonymous auth off), liken's CRDs are installed, and tests get an admin
// client plus certificates for any user and groups they want to act as.
package apiserver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"liken.dev/liken/config/crd"
	"liken.dev/liken/internal/kubeconfig"
	"liken.dev/liken/internal/pki"
	"liken.dev/liken/test/report"
)

// Options choose what runs besides etcd and kube-apiserver.
type Options struct {
	// ControllerManager also starts kube-controller-manager (PodDisruptionBudget status,
	// garbage collection, namespace deletion, ...).
	ControllerManager bool
	// Controllers, when set, is kube-controller-manager's --controllers list, e.g.
	// "*,-node-lifecycle-controller" where tests write Node conditions that no kubelet renews.
	Controllers string
	// ControllerManagerArgs are further kube-controller-manager flags, e.g.
	// --node-monitor-grace-period for Nodes that go NotReady sooner.
	ControllerManagerArgs []string
	// Scheduler also starts kube-scheduler, for pods a controller makes (a DaemonSet's,
	// a Deployment's) rather than a test binding them itself.
	Scheduler bool
	// ServerCA and ClientCA, when set, are used instead of fresh ones: the API server's
	// serving certificate is signed by ServerCA and client certificates by ClientCA (as
	// with a cluster identity made by liken layer).
	ServerCA, ClientCA *pki.CA
}

// Timings are how long start-up took, for the printed figures.
type Timings struct {
	// Tools is the time spent making sure the upstream binaries exist (building them when
	// missing: the cold case).
	Tools time.Duration
	// Ready is from starting etcd to kube-apiserver answering /readyz.
	Ready time.Duration
	// CRDs is the time to install liken's CRDs and see them established.
	CRDs time.Duration
	// Total is the whole Start.
	Total time.Duration
}

// Env is a running control plane.
type Env struct {
	// Dir holds certificates, kubeconfigs, data and logs.
	Dir string
	// Host is the API server's URL.
	Host string
	// Admin is a client config for a member of system:masters.
	Admin *rest.Config
	// AdminKubeconfig is the path of a kubeconfig file for Admin (for kubectl).
	AdminKubeconfig string
	// Bin is the directory holding kube-apiserver, etcd, kube-controller-manager and kubectl.
	Bin string
	// Timings of this start.
	Timings Timings

	serverCA, clientCA *pki.CA
	procs              []*process
	apiserverArgs      []string
	stopOnce           sync.Once
}

type process struct {
	name string
	args []string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// ToolsDir is where test/tools/build.sh puts the upstream binaries.
func ToolsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "tools", "bin")
}

// EnsureTools builds the upstream binaries if they are missing or stale.
func EnsureTools(ctx context.Context) error {
	script := filepath.Join(ToolsDir(), "..", "build.sh")
	cmd := exec.CommandContext(ctx, script)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building the upstream test binaries with %s: %w", script, err)
	}
	return nil
}

// Start brings up a control plane. Call Stop when done.
func Start(ctx context.Context, opts Options) (env *Env, err error) {
	t0 := time.Now()
	if err := EnsureTools(ctx); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "liken-apiserver-")
	if err != nil {
		return nil, fmt.Errorf("making the control plane's directory: %w", err)
	}
	e := &Env{Dir: dir, Bin: ToolsDir()}
	e.Timings.Tools = time.Since(t0)
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (logs in %s)", err, dir)
			e.stop(false)
		}
	}()
	e.serverCA, e.clientCA = opts.ServerCA, opts.ClientCA
	if err := e.writePKI(); err != nil {
		return nil, err
	}

	t1 := time.Now()
	// A port found free can still be taken by another test's server before ours binds it
	// (packages run in parallel); such a start is made again on other ports.
	for attempt := 1; ; attempt++ {
		err = e.startControlPlane(ctx)
		if err == nil {
			break
		}
		if attempt == 3 || !e.lostPortRace() {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "apiserver: a port was taken before the bind (%v); starting again on other ports\n", firstLine(err))
		e.killAll()
		e.procs = nil
		for _, d := range []string{"etcd", "logs"} {
			if err := os.RemoveAll(e.path(d)); err != nil {
				return nil, fmt.Errorf("clearing %s before starting again: %w", d, err)
			}
		}
	}
	e.Timings.Ready = time.Since(t1)

	t2 := time.Now()
	if err := e.installCRDs(ctx); err != nil {
		return nil, err
	}
	e.Timings.CRDs = time.Since(t2)

	if opts.ControllerManager {
		if err := e.startControllerManager(opts.Controllers, opts.ControllerManagerArgs); err != nil {
			return nil, err
		}
	}
	if opts.Scheduler {
		if err := e.startScheduler(); err != nil {
			return nil, err
		}
	}
	e.Timings.Total = time.Since(t0)
	return e, nil
}

func (e *Env) startControlPlane(ctx context.Context) error {
	etcdURL, err := e.startEtcd()
	if err != nil {
		return err
	}
	if err := e.startAPIServer(etcdURL); err != nil {
		return err
	}
	return e.waitReady(ctx, 3*time.Minute)
}

// lostPortRace says whether a failed start failed because etcd or kube-apiserver found its
// port taken.
func (e *Env) lostPortRace() bool {
	for _, name := range []string{"etcd", "kube-apiserver"} {
		b, _ := os.ReadFile(e.path("logs", name+".log"))
		if strings.Contains(string(b), "address already in use") {
			return true
		}
	}
	return false
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

func (e *Env) path(parts ...string) string {
	return filepath.Join(append([]string{e.Dir}, parts...)...)
}

func (e *Env) writePKI() error {
	var err error
	if e.serverCA == nil {
		if e.serverCA, err = pki.NewCA("liken-test-server-ca", 24*time.Hour); err != nil {
			return err
		}
	}
	if e.clientCA == nil {
		if e.clientCA, err = pki.NewCA("liken-test-client-ca", 24*time.Hour); err != nil {
			return err
		}
	}
	serving, err := e.serverCA.ServingCert("kube-apiserver", []string{"localhost", "kubernetes", "kubernetes.default.svc"},
		// 10.0.2.2 is the host as QEMU's user network shows it to the VM tier's guests.
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.43.0.1"), net.ParseIP("10.0.2.2")}, 24*time.Hour)
	if err != nil {
		return err
	}
	saKey, saPub, err := pki.NewKey()
	if err != nil {
		return err
	}
	clientCAKey, err := e.clientCA.KeyPEM()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"server-ca.crt": e.serverCA.CertPEM(),
		"client-ca.crt": e.clientCA.CertPEM(),
		"client-ca.key": clientCAKey,
		"serving.crt":   serving.CertPEM,
		"serving.key":   serving.KeyPEM,
		"sa.key":        saKey,
		"sa.pub":        saPub,
	}
	if err := os.MkdirAll(e.path("pki"), 0o700); err != nil {
		return err
	}
	for name, b := range files {
		if err := os.WriteFile(e.path("pki", name), b, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

func (e *Env) startEtcd() (string, error) {
	client, peer := pickPort(), pickPort()
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	err := e.spawn("etcd",
		"--name=default",
		"--data-dir="+e.path("etcd"),
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		// A test's data need not survive a power cut; fsync would dominate start-up.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	return clientURL, err
}

func (e *Env) startAPIServer(etcdURL string) error {
	port := pickPort()
	e.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
	e.apiserverArgs = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--advertise-address=127.0.0.1",
		// The API server refuses a loopback advertise address for the kubernetes Service's
		// endpoints unless it does not reconcile them.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + e.path("apiserver-certs"),
		"--tls-cert-file=" + e.path("pki", "serving.crt"),
		"--tls-private-key-file=" + e.path("pki", "serving.key"),
		"--client-ca-file=" + e.path("pki", "client-ca.crt"),
		// As k3s configures its API server (pkg/daemons/control/server.go).
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--anonymous-auth=false",
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + e.path("pki", "sa.pub"),
		"--service-account-signing-key-file=" + e.path("pki", "sa.key"),
		"--service-cluster-ip-range=10.43.0.0/16",
		"--profiling=false",
	}
	err := e.spawn("kube-apiserver", e.apiserverArgs...)
	if err != nil {
		return err
	}
	admin, err := e.UserConfig("liken-test-admin", "system:masters")
	if err != nil {
		return err
	}
	e.Admin = admin
	e.AdminKubeconfig = e.path("admin.kubeconfig")
	return WriteKubeconfig(e.AdminKubeconfig, admin)
}

func (e *Env) startControllerManager(controllers string, more []string) error {
	args := []string{
		"--kubeconfig=" + e.AdminKubeconfig,
		"--authentication-kubeconfig=" + e.AdminKubeconfig,
		"--authorization-kubeconfig=" + e.AdminKubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", pickPort()),
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file=" + e.path("pki", "sa.key"),
		"--root-ca-file=" + e.path("pki", "server-ca.crt"),
		"--cluster-signing-cert-file=" + e.path("pki", "client-ca.crt"),
		"--cluster-signing-key-file=" + e.path("pki", "client-ca.key"),
		"--cert-dir=" + e.path("controller-manager-certs"),
	}
	if controllers != "" {
		args = append(args, "--controllers="+controllers)
	}
	return e.spawn("kube-controller-manager", append(args, more...)...)
}

func (e *Env) startScheduler() error {
	return e.spawn("kube-scheduler",
		"--kubeconfig="+e.AdminKubeconfig,
		"--authentication-kubeconfig="+e.AdminKubeconfig,
		"--authorization-kubeconfig="+e.AdminKubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", pickPort()),
		"--leader-elect=false",
		"--cert-dir="+e.path("scheduler-certs"))
}

// spawn starts one of the upstream binaries with its output in logs/<name>.log.
func (e *Env) spawn(name string, args ...string) error {
	if err := os.MkdirAll(e.path("logs"), 0o755); err != nil {
		return err
	}
	logPath := e.path("logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(e.Bin, name), args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group, and killed if the test binary dies, so nothing outlives a test run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, args: args, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	e.procs = append(e.procs, p)
	return nil
}

func (e *Env) waitReady(ctx context.Context, timeout time.Duration) error {
	client, err := rest.HTTPClientFor(e.Admin)
	if err != nil {
		return err
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, p := range e.procs {
			select {
			case <-p.done:
				return false, fmt.Errorf("%s exited while starting: %v\n%s", p.name, p.err, tail(p.log, 20))
			default:
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.Host+"/readyz", nil)
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver /readyz (last: %s): %w\n%s", last, err, tail(e.path("logs", "kube-apiserver.log"), 20))
	}
	return nil
}

func (e *Env) installCRDs(ctx context.Context) error {
	crds, err := crd.All()
	if err != nil {
		return err
	}
	cs, err := apiextensionsclient.NewForConfig(e.Admin)
	if err != nil {
		return err
	}
	for _, c := range crds {
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("installing CRD %s: %w", c.Name, err)
		}
	}
	for _, c := range crds {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, c.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.NonStructuralSchema && cond.Status == apiextensionsv1.ConditionTrue {
					return false, fmt.Errorf("CRD %s is not structural: %s", c.Name, cond.Message)
				}
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for CRD %s to be established: %w", c.Name, err)
		}
	}
	// Discovery lags a little behind Established; wait until the kinds are served.
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		rl, err := cs.Discovery().ServerResourcesForGroupVersion("liken.dev/v1alpha1")
		return err == nil && len(rl.APIResources) >= 2*len(crds), nil
	})
}

// UserConfig returns a client config that authenticates as user in groups with a client
// certificate signed by the API server's client CA.
func (e *Env) UserConfig(user string, groups ...string) (*rest.Config, error) {
	p, err := e.clientCA.ClientCert(user, groups, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host: e.Host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   e.serverCA.CertPEM(),
			CertData: p.CertPEM,
			KeyData:  p.KeyPEM,
		},
		QPS:   -1, // tests measure the agent, not client-side throttling
		Burst: -1,
	}, nil
}

// WriteKubeconfig writes cfg (host, CA, client certificate) as a kubeconfig file.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	b, err := kubeconfig.Render(cfg.Host, cfg.CAData, cfg.CertData, cfg.KeyData)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// Kubectl runs the built kubectl as admin and returns its standard output; a non-zero exit
// is an error carrying its standard error.
func (e *Env) Kubectl(ctx context.Context, args ...string) (string, error) {
	return e.KubectlWith(ctx, e.AdminKubeconfig, args...)
}

// KubectlWith runs the built kubectl with another kubeconfig.
func (e *Env) KubectlWith(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(e.Bin, "kubectl"), append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// StopAPIServer stops kube-apiserver (etcd keeps the data), so tests can see how clients
// cope with an API that is away.
func (e *Env) StopAPIServer() error {
	for i, p := range e.procs {
		if p.name != "kube-apiserver" {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		e.procs = append(e.procs[:i], e.procs[i+1:]...)
		return nil
	}
	return errors.New("kube-apiserver is not running")
}

// StartAPIServer starts kube-apiserver again, on the same port and data, and waits until
// it is ready.
func (e *Env) StartAPIServer(ctx context.Context) error {
	if err := e.spawn("kube-apiserver", e.apiserverArgs...); err != nil {
		return err
	}
	return e.waitReady(ctx, 3*time.Minute)
}

// Stop ends every process and removes the directory (kept when LIKEN_KEEP_TEST_DIRS is set).
func (e *Env) Stop() { e.stop(os.Getenv("LIKEN_KEEP_TEST_DIRS") == "") }

func (e *Env) stop(remove bool) {
	e.stopOnce.Do(func() {
		e.killAll()
		if remove {
			os.RemoveAll(e.Dir)
		}
	})
}

// killAll ends every process, the API server before etcd.
func (e *Env) killAll() {
	for i := len(e.procs) - 1; i >= 0; i-- {
		p := e.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
}

// pickPort is FreePort; a test replaces it to lose the race for a port on purpose.
var pickPort = FreePort

// FreePort returns a loopback port nothing listens on now. It is picked at random below
// Linux's ephemeral range (32768 and up by default), where the kernel gives no port to
// an outgoing connection or to a listener on port 0, so only another FreePort (in another
// test package) can take it before the server binds it; Start copes with that rare case.
func FreePort() int {
	for range 1000 {
		port := 10000 + rand.IntN(32768-10000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	panic("finding a free port: none of 1000 tried between 10000 and 32767 was free")
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Report records a figure for `make test` to print (see test/report).
func Report(format string, args ...any) { report.Line(format, args...) }
