package vm

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/test/apiserver"
	"liken.dev/liken/test/report"
)

// TestLabUpAndDown runs `liken lab` as a user does, from the built binary: up brings a server
// and an agent to Ready and says how to reach them; kubectl through its kubeconfig shows both
// Nodes and Machines; a second up in the same directory, and one on a port in use, are
// refused with a clear message and start nothing; down leaves no process and no file.
func TestLabUpAndDown(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "liken")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/liken").CombinedOutput(); err != nil {
		t.Fatalf("building liken: %v\n%s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "lab")
	port := apiserver.FreePort()
	liken := func(args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Dir = "../.." // the source tree the lab builds its release from
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	t.Cleanup(func() {
		if _, err := os.Stat(dir); err == nil {
			liken("lab", "down", "--dir", dir)
		}
	})
	start := time.Now()
	out, err := liken("lab", "up", "--dir", dir, "--api-port", fmt.Sprint(port), "--agents", "1")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("liken lab up: %v\n%s", err, out)
	}
	t.Logf("liken lab up:\n%s", out)
	for _, want := range []string{"lab-server-1: k3s started", "lab-agent-1: Node Ready", "lab-server-1: Machine Ready", "every machine Ready",
		"export KUBECONFIG=" + dir, "liken lab down --dir " + dir} {
		if !strings.Contains(out, want) {
			t.Errorf("lab up did not say %q", want)
		}
	}
	if !regexp.MustCompile(`lab-agent-1 +agent +\S+ +\S+ +A +Idle +0 +None +True`).MatchString(out) {
		t.Errorf("lab up's status does not show lab-agent-1 Ready on slot A")
	}
	kc := filepath.Join(dir, "layers", "admin.kubeconfig")
	kubectl := func(args ...string) string {
		b, err := exec.Command(filepath.Join(apiserver.ToolsDir(), "kubectl"), append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	nodes, machines := kubectl("get", "nodes"), kubectl("get", "machines")
	for _, n := range []string{"lab-server-1", "lab-agent-1"} {
		if !regexp.MustCompile(n+` +Ready`).MatchString(nodes) || !strings.Contains(machines, n) {
			t.Errorf("kubectl does not show %s Ready:\n%s\n%s", n, nodes, machines)
		}
	}

	// A second up in the same directory is refused and changes nothing.
	before, _ := os.ReadFile(filepath.Join(dir, "lab.json"))
	if out, err := liken("lab", "up", "--dir", dir, "--api-port", fmt.Sprint(apiserver.FreePort())); err == nil || !strings.Contains(out, "a lab is already up in "+dir) {
		t.Errorf("a second lab up in the same directory: %v\n%s", err, out)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "lab.json")); !bytes.Equal(before, after) {
		t.Errorf("a refused lab up changed lab.json")
	}
	// One on a port in use is refused before it builds or starts anything.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	other := filepath.Join(t.TempDir(), "other")
	busy := l.Addr().(*net.TCPAddr).Port
	if out, err := liken("lab", "up", "--dir", other, "--api-port", fmt.Sprint(busy)); err == nil || !strings.Contains(out, fmt.Sprintf("the API port %d is in use", busy)) {
		t.Errorf("lab up on a port in use: %v\n%s", err, out)
	}
	if _, err := os.Stat(other); err == nil {
		t.Errorf("a refused lab up left %s behind", other)
	}

	status, err := liken("lab", "status", "--dir", dir)
	if err != nil || !strings.Contains(status, "lab-server-1") || !strings.Contains(status, "running, pid") {
		t.Errorf("liken lab status: %v\n%s", err, status)
	}
	out, err = liken("lab", "down", "--dir", dir)
	if err != nil {
		t.Fatalf("liken lab down: %v\n%s", err, out)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("lab down left %s (%v)", dir, err)
	}
	if b, _ := exec.Command("pgrep", "-f", dir).Output(); len(bytes.TrimSpace(b)) > 0 {
		t.Errorf("processes of the lab still run after down: %s", b)
	}
	report.Line("liken lab up (TCG, a server and an agent, 1 vCPU each): every machine Ready %s after the command started, release build included", took.Round(time.Second))
}
