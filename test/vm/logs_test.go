package vm

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/test/apiserver"
)

// machineLogs (issue 30): once each lab machine has rebooted, `liken logs` reads, through the
// API server and the machine's kubelet, this boot's agent, kernel and k3s logs and init's
// log of the boot before, which ends with that boot's shutdown; the kubelet's node log
// query finds the agent's file by name (liken's drop-in turned it on); a user the cluster
// does not let get nodes/proxy is refused. It returns a line for the report: how long a
// read took, and how many bytes each component wrote in lab-agent-1's boot before.
func machineLogs(t *testing.T, liken func(...string) (string, error), kc string) string {
	t.Helper()
	var slowest time.Duration
	logs := func(args ...string) string {
		t.Helper()
		start := time.Now()
		out, err := liken(append(append([]string{"logs"}, args...), "--kubeconfig", kc)...)
		slowest = max(slowest, time.Since(start))
		if err != nil {
			t.Errorf("liken logs %v: %v\n%s", args, err, tailOf(out, 20))
		}
		return out
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lab-agent-1"}, `"msg":"trial committed: this slot is now the default"`},
		{[]string{"lab-agent-1", "--component", "kernel"}, "Linux version"},
		{[]string{"lab-server-1", "--component", "k3s"}, "k3s-standin: "},
		{[]string{"lab-agent-1", "--component", "init"}, "liken-init: logs in /var/log; the boot before's in /var/log/liken/boots/"},
		{[]string{"lab-agent-1", "--component", "init", "--boot", "-1"}, "liken-init: shutting down: the agent, the containers, k3s"},
		{[]string{"lab-server-1", "--component", "init", "--boot", "-1"}, "liken-init: reboot: staged changes"},
	} {
		if out := logs(c.args...); !strings.Contains(out, c.want) {
			t.Errorf("liken logs %v does not show %q; it ends:\n%s", c.args, c.want, tailOf(out, 15))
		}
	}
	var sizes []string
	for _, c := range []string{"init", "kernel", "agent", "k3s"} {
		sizes = append(sizes, fmt.Sprintf("%s %d", c, len(logs("lab-agent-1", "--component", c, "--boot", "-1"))))
	}
	kubectl := func(args ...string) (string, error) {
		b, err := exec.Command(filepath.Join(apiserver.ToolsDir(), "kubectl"), append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
		return string(b), err
	}
	// The query form (NodeLogQuery, enableSystemLogQuery): without it the kubelet ignores
	// ?query and lists /var/log instead.
	if out, err := kubectl("get", "--raw", "/api/v1/nodes/lab-agent-1/proxy/logs/?query=liken-agent"); err != nil || !strings.Contains(out, `"msg":`) || strings.Contains(out, "<pre>") {
		t.Errorf("the node log query for liken-agent: %v\n%s", err, tailOf(out, 10))
	}
	if out, err := kubectl("--as", "liken-test-nobody", "get", "--raw", "/api/v1/nodes/lab-agent-1/proxy/logs/liken-agent.log"); err == nil || !strings.Contains(out, "Forbidden") {
		t.Errorf("a user without nodes/proxy read lab-agent-1's log: %v\n%s", err, tailOf(out, 10))
	}
	return fmt.Sprintf("liken logs through the API server and the kubelet, slowest read %s; bytes lab-agent-1's components wrote in its first boot (from lab up to its upgrade's reboot): %s",
		slowest.Round(10*time.Millisecond), strings.Join(sizes, ", "))
}

// supportBundle (issue 30): `liken support` against the lab writes one archive with each
// machine's logs and objects, and nowhere in it the passwords of the cluster's join tokens
// (the lab's identity; a Secret's values are proven kept out by internal/cli's
// TestSupportBundle). It returns a line for the report.
func supportBundle(t *testing.T, liken func(...string) (string, error), kc, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "support.tar.gz")
	start := time.Now()
	listing, err := liken("support", "-o", out, "--kubeconfig", kc)
	took := time.Since(start)
	if err != nil {
		t.Errorf("liken support: %v\n%s", err, listing)
		return "liken support failed"
	}
	for _, want := range []string{"cluster.yaml", "machines/lab-agent-1.yaml", "nodes/lab-server-1.yaml", "events.txt",
		"logs/lab-agent-1/liken-agent.log", "logs/lab-server-1/k3s.log", "logs/lab-server-1/before/liken-init.log"} {
		if !strings.Contains(listing, want) {
			t.Errorf("liken support's archive lists no %s:\n%s", want, listing)
		}
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(gz)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"token-password", "agent-token-password"} {
		secret, err := os.ReadFile(filepath.Join(dir, "identity", f))
		if err != nil || len(bytes.TrimSpace(secret)) < 8 {
			t.Errorf("reading the lab's %s: %v", f, err)
			continue
		}
		if bytes.Contains(all, bytes.TrimSpace(secret)) {
			t.Errorf("the support archive holds the cluster's %s", f)
		}
	}
	return fmt.Sprintf("liken support of the lab's 2 machines: %d bytes gzipped (%d unpacked) in %s", len(raw), len(all), took.Round(100*time.Millisecond))
}
