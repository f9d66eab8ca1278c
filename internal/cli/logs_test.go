package cli

import (
	"context"
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
	go func() { done <- nl.follow(ctx, "k3s", int64(len("k3s: this boot\n")), 50*time.Millisecond, &out) }()
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
