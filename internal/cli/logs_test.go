package cli

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/syncbuf"
	"liken.dev/liken/test/apiserver"
)

// hostIP is an address of this host the API server agrees to proxy to (not loopback, which
// it refuses for nodes), or "".
func hostIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// logNode registers Node name whose kubelet serves dir at /logs/ as the kubelet's file
// handler does (http.FileServer on /var/log), so `liken logs` goes through the real API
// server's node proxy and its authorization.
func logNode(t *testing.T, name, dir string) {
	t.Helper()
	ip := hostIP(t)
	if ip == "" {
		t.Skip("this host has no address but loopback, to which the API server does not proxy a node's requests: the lab's VM test reads logs through a real kubelet")
	}
	mux := http.NewServeMux()
	mux.Handle("/logs/", http.StripPrefix("/logs/", http.FileServer(http.Dir(dir))))
	kubelet := httptest.NewUnstartedServer(mux)
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	kubelet.Listener = l
	kubelet.StartTLS()
	t.Cleanup(kubelet.Close)
	u, _ := url.Parse(kubelet.URL)
	port, _ := strconv.Atoi(u.Port())
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	n, err := kc.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kc.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	if _, err := kc.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func writeLogs(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLogsThroughTheNodeProxy: liken logs reads a machine's files as init lays them out
// (this boot's NAME.log after its rotated NAME.log.1, earlier boots under liken/boots/SEQ),
// through the API server; --boot -1 is the newest archive, --tail the last lines; a boot
// not kept, a component with no file and a user without nodes/proxy are refused with what
// to do.
func TestLogsThroughTheNodeProxy(t *testing.T) {
	dir := t.TempDir()
	logNode(t, "logs-m1", dir)
	writeLogs(t, dir, map[string]string{
		"liken-agent.log.1":                  "agent: rotated 1\nagent: rotated 2\n",
		"liken-agent.log":                    "agent: now 1\nagent: now 2\nagent: now 3\n",
		"k3s.log":                            "k3s: this boot\n",
		"liken/boots/7/liken-init.log":       "init: boot 7\n",
		"liken/boots/12/liken-init.log":      "init: boot 12\n",
		"liken/boots/12/liken-agent.log":     "agent: boot 12\n",
		"pods/default_web/web/0.log":         "someone else's\n",
		"liken/boots/12/not-a-component.log": "x\n",
	})
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		code int
		out  string
		err  string
	}{
		{"this boot's agent log, rotated first", []string{"logs-m1"}, 0, "agent: rotated 1\nagent: rotated 2\nagent: now 1\nagent: now 2\nagent: now 3\n", ""},
		{"the last lines", []string{"logs-m1", "--tail", "2"}, 0, "agent: now 2\nagent: now 3\n", ""},
		{"k3s", []string{"logs-m1", "--component", "k3s"}, 0, "k3s: this boot\n", ""},
		{"the boot before: the newest archive", []string{"logs-m1", "--component", "init", "--boot", "-1"}, 0, "init: boot 12\n", ""},
		{"two boots before", []string{"logs-m1", "--component", "init", "--boot", "-2"}, 0, "init: boot 7\n", ""},
		{"a boot not kept", []string{"logs-m1", "--boot", "-3"}, 1, "", "keeps the logs of 2 boots before this one, not 3"},
		{"no such file", []string{"logs-m1", "--component", "kernel"}, 1, "", "has no kernel.log for this boot"},
		{"no such machine", []string{"logs-m9"}, 1, "", "is logs-m9 a machine of this cluster"},
		{"an unknown component", []string{"logs-m1", "--component", "etcd"}, 2, "", "give one of init, agent, k3s, kernel"},
		{"a boot after this one", []string{"logs-m1", "--boot", "1"}, 2, "", "give 0 (this boot) or a negative number"},
		{"-f of an earlier boot", []string{"logs-m1", "--boot", "-1", "-f"}, 2, "", "-f follows this boot's log"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := run(t, append(append([]string{"logs"}, tt.args...), "--kubeconfig", kc)...)
			if code != tt.code || out != tt.out || !strings.Contains(errOut, tt.err) {
				t.Errorf("liken logs %v: exit %d, out %q, err %q; want %d, %q, an error saying %q", tt.args, code, out, errOut, tt.code, tt.out, tt.err)
			}
		})
	}

	// --since, by each line's own time (init's stamped lines).
	old, recent := time.Now().Add(-2*time.Hour).UTC().Format(time.RFC3339Nano), time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	writeLogs(t, dir, map[string]string{"liken-init.log": old + " liken-init: two hours ago\n" + recent + " liken-init: a minute ago\n"})
	if code, out, errOut := run(t, "logs", "logs-m1", "--component", "init", "--since", "1h", "--kubeconfig", kc); code != 0 || out != recent+" liken-init: a minute ago\n" {
		t.Errorf("liken logs --since 1h: exit %d, %q, %q", code, out, errOut)
	}
	if code, _, errOut := run(t, "logs", "logs-m1", "--component", "kernel", "--since", "1h", "--kubeconfig", kc); code != 2 || !strings.Contains(errOut, "time since boot") {
		t.Errorf("liken logs --since of the kernel's: exit %d, %q", code, errOut)
	}

	// A user the cluster does not let read node logs, then one it does (RBAC's nodes/proxy).
	user, err := env.UserConfig("log-reader")
	if err != nil {
		t.Fatal(err)
	}
	ukc := filepath.Join(t.TempDir(), "user.kubeconfig")
	if err := apiserver.WriteKubeconfig(ukc, user); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "logs", "logs-m1", "--kubeconfig", ukc)
	if code != 1 || !strings.Contains(errOut, "the cluster does not let you (the verb get on nodes/proxy") {
		t.Errorf("a user without nodes/proxy: exit %d, %q", code, errOut)
	}
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "log-reader"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"get"}}}}
	if _, err := admin.RbacV1().ClusterRoles().Create(t.Context(), cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "log-reader"}, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "log-reader"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "log-reader"}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(t.Context(), crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second) // RBAC's cache
	for {
		code, out, errOut := run(t, "logs", "logs-m1", "--component", "k3s", "--kubeconfig", ukc)
		if code == 0 && out == "k3s: this boot\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a user granted nodes/proxy get: exit %d, %q, %q", code, out, errOut)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// -f: lines appended are printed as they come; a file that became shorter (rotated, or
	// a new boot's) is printed from its start.
	nl, err := newNodeLogs(env.Admin, "logs-m1")
	if err != nil {
		t.Fatal(err)
	}
	var out syncbuf.Buffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	var followErr syncbuf.Buffer
	go func() {
		done <- nl.follow(ctx, "k3s", int64(len("k3s: this boot\n")), 50*time.Millisecond, &out, &followErr)
	}()
	f, err := os.OpenFile(filepath.Join(dir, "k3s.log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("k3s: a new line\n")
	f.Close()
	waitFor := func(what, want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for out.String() != want {
			if time.Now().After(deadline) {
				t.Fatalf("-f: %s: printed %q; want %q", what, out.String(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("an appended line", "k3s: a new line\n")
	writeLogs(t, dir, map[string]string{"k3s.log": "k3s: next boot\n"})
	waitFor("a new, shorter file", "k3s: a new line\nk3s: next boot\n")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("-f ended with %v", err)
	}
	if followErr.String() != "" {
		t.Errorf("-f said errors where every read worked: %q", followErr.String())
	}
}

func TestLastLines(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc\n", 5, "a\nb\nc\n"},
		{"a\nb\nc", 1, "c"},
		{"a\nb\n", 0, ""},
		{"", 3, ""},
	} {
		if got := string(lastLines([]byte(tt.in), tt.n)); got != tt.want {
			t.Errorf("lastLines(%q, %d) = %q; want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

// TestSupportBundle: liken support writes the Cluster, the named Machines and their Nodes,
// liken's Events and each machine's logs into one archive, lists it, names what it could not
// collect (a machine with no Node) and writes the rest; no Secret's value, k3s token or
// password is anywhere in it, though the machine's log and the Cluster's annotations hold
// them.
func TestSupportBundle(t *testing.T) {
	const password, token = "hunter2-registry-password", "K10aaaabbbbccccddddeeeeffff00001111::server:0123456789abcdef"
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ensureCluster(t, lc)
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	admin.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SecretNamespace}}, metav1.CreateOptions{})
	if _, err := admin.CoreV1().Secrets(v1alpha1.SecretNamespace).Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "support-reg"},
		Data: map[string][]byte{"username": []byte("liken-puller"), "password": []byte(password)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cl, err := lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	before := cl.Spec.Registries
	cl.Spec.Registries = &v1alpha1.Registries{Configs: []v1alpha1.RegistryConfig{{Host: "registry.example.com", AuthSecret: &v1alpha1.SecretReference{Name: "support-reg"}}}}
	cl.Annotations = map[string]string{"example.com/note": "the password is " + password}
	if _, err := lc.UpdateCluster(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cl, err := lc.Cluster(context.Background()); err == nil {
			cl.Spec.Registries, cl.Annotations = before, nil
			lc.UpdateCluster(context.Background(), cl)
		}
	})
	for _, name := range []string{"support-s1", "support-s2"} {
		if _, err := lc.CreateMachine(t.Context(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleServer}}); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	logNode(t, "support-s1", dir)
	writeLogs(t, dir, map[string]string{
		"liken-init.log":               "liken-init: this boot\n",
		"liken-agent.log":              `{"msg":"pulling","auth":"` + password + `"}` + "\n",
		"k3s.log":                      "k3s: joining with token " + token + "\n",
		"kernel.log":                   "[    0.000000] Linux version\n",
		"liken/boots/3/liken-init.log": "liken-init: the boot before\n",
	})
	if _, err := admin.CoreV1().Events("default").Create(t.Context(), &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "support-s1.1"},
		InvolvedObject: corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Machine", Name: "support-s1"},
		Reason:         "Committed", Message: "the trial boot of slot B is healthy", Type: corev1.EventTypeNormal, LastTimestamp: metav1.Now()}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "support.tar.gz")
	code, stdout, errOut := run(t, "support", "support-s1", "support-s2", "-o", out, "--kubeconfig", kc)
	if code != 0 || !strings.Contains(stdout, "logs/support-s1/k3s.log") || !strings.Contains(stdout, "not collected (errors.txt)") {
		t.Fatalf("liken support: exit %d\n%s\n%s", code, stdout, errOut)
	}
	files := untar(t, out)
	for name, want := range map[string]string{
		"liken-support/cluster.yaml":                          "registry.example.com",
		"liken-support/machines/support-s1.yaml":              "name: support-s1",
		"liken-support/nodes/support-s1.yaml":                 "name: support-s1",
		"liken-support/events.txt":                            "Machine/support-s1\tCommitted",
		"liken-support/logs/support-s1/liken-init.log":        "liken-init: this boot",
		"liken-support/logs/support-s1/before/liken-init.log": "liken-init: the boot before",
		"liken-support/logs/support-s1/liken-agent.log":       "[redacted: Secret liken-system/support-reg password]",
		"liken-support/logs/support-s1/k3s.log":               "[redacted: k3s token]",
		"liken-support/errors.txt":                            "support-s2",
		"liken-support/README.txt":                            "Left out: every Secret",
	} {
		if !strings.Contains(files[name], want) {
			t.Errorf("%s does not hold %q:\n%s", name, want, files[name])
		}
	}
	for name, body := range files {
		if strings.Contains(body, password) || strings.Contains(body, "0123456789abcdef") || strings.Contains(body, "managedFields") {
			t.Errorf("%s holds a secret or managedFields:\n%s", name, body)
		}
	}
}

func untar(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = string(b)
	}
}

func TestRedact(t *testing.T) {
	b := &bundle{secrets: map[string]string{"s3cr3t-value": "[redacted: Secret x/y k]"}}
	for in, want := range map[string]string{
		"auth s3cr3t-value here":                      "auth [redacted: Secret x/y k] here",
		"token=abcdef123456 next":                     "token=[redacted] next",
		`{"password": "p4ssw0rd!"}`:                   `{"password": "[redacted]"}`,
		"Authorization: Bearer abc.def-ghi_jkl":       "Authorization: Bearer [redacted]",
		"jwt eyJhbGciOiJSUzI1.eyJzdWIiOiJzeXN0.sig-1": "jwt [redacted: JSON web token]",
		"the tokenFile is unrelated":                  "the tokenFile is unrelated",
	} {
		if got := string(b.redact([]byte(in))); got != want {
			t.Errorf("redact(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestLinesSince(t *testing.T) {
	from := time.Now().Add(-time.Hour)
	old, recent := from.Add(-time.Minute).UTC(), from.Add(time.Minute).UTC()
	klog := func(t time.Time) string { return t.Local().Format("I0102 15:04:05.000000") }
	for _, tt := range []struct {
		name, in, want string
	}{
		{"init's stamped lines", old.Format(time.RFC3339Nano) + " liken-init: a\n" + recent.Format(time.RFC3339Nano) + " liken-init: b\n",
			recent.Format(time.RFC3339Nano) + " liken-init: b\n"},
		{"the agent's JSON, a continuation with its line", `{"time":"` + old.Format(time.RFC3339Nano) + `","msg":"a"}` + "\n  more of a\n" + `{"time":"` + recent.Format(time.RFC3339Nano) + `","msg":"b"}` + "\n  more of b\n",
			`{"time":"` + recent.Format(time.RFC3339Nano) + `","msg":"b"}` + "\n  more of b\n"},
		{"k3s's logrus and klog lines", `time="` + old.Format(time.RFC3339) + `" level=info msg=a` + "\n" + klog(recent) + " 1 x.go:1] b\n",
			klog(recent) + " 1 x.go:1] b\n"},
		{"lines before the first time go with it", "k3s-standin: starting\n" + `time="` + recent.Format(time.RFC3339) + `" msg=b` + "\n",
			"k3s-standin: starting\n" + `time="` + recent.Format(time.RFC3339) + `" msg=b` + "\n"},
		{"no time at all: nothing is known to be recent", "a\nb\n", ""},
	} {
		if got := string(linesSince([]byte(tt.in), from)); got != tt.want {
			t.Errorf("%s: linesSince = %q; want %q", tt.name, got, tt.want)
		}
	}
}
