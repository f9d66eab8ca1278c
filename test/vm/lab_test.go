package vm

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/clientcmd"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/lab"
	"liken.dev/liken/test/apiserver"
	"liken.dev/liken/test/report"
)

// TestLabUpAndDown runs `liken lab` as a user does, from the built binary: up brings a server
// and an agent to Ready and says how to reach them; kubectl through its kubeconfig shows both
// Nodes and Machines; a second up in the same directory, and one on a port in use, are
// refused with a clear message and start nothing; publish, upgrade and approve-reboot take the
// fleet to a second release (the server's reboot taking the API down); down leaves no
// process and no file.
func TestLabUpAndDown(t *testing.T) {
	vmTest(t)
	bin := filepath.Join(t.TempDir(), "liken")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/liken").CombinedOutput(); err != nil {
		t.Fatalf("building liken: %v\n%s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "lab")
	port := apiserver.FreePort()
	run := func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = "../.." // the source tree the lab builds its release from
		// Interrupted, `lab up` stops what it started (SIGKILL would leave its machines).
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = time.Minute
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	liken := func(args ...string) (string, error) { return run(t.Context(), args...) }
	// After a failure, down stops the lab; then none of its processes may be left. Not
	// t.Context(): it is cancelled before cleanups run, and down would never start (how a
	// failed run once left this test's machines slowing the rest of the tier).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, statErr := os.Stat(dir)
		if left, _ := lab.Leftovers(dir); len(left) > 0 || statErr == nil {
			if out, err := run(ctx, "lab", "down", "--dir", dir); err != nil {
				t.Errorf("liken lab down after the test: %v\n%s", err, out)
			}
		}
		noLeftovers(t, dir)
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
	t.Cleanup(func() { noLeftovers(t, other) })
	busy := l.Addr().(*net.TCPAddr).Port
	if out, err := liken("lab", "up", "--dir", other, "--api-port", fmt.Sprint(busy)); err == nil || !strings.Contains(out, fmt.Sprintf("the API port %d is in use", busy)) {
		t.Errorf("lab up on a port in use: %v\n%s", err, out)
	}
	if _, err := os.Stat(other); err == nil {
		t.Errorf("a refused lab up left %s behind", other)
	}

	// The fleet upgrade, as an operator tries it in the lab: publish a second release, ask for
	// it, approve the reboots as they come. The server's own reboot takes the API down; the
	// agent carries on after it.
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 10 * time.Second
	lc, _ := kube.NewClient(cfg)
	const v2 = "2026.12.01-002"
	if out, err := liken("lab", "publish", "--dir", dir, "--version", v2); err != nil {
		t.Fatalf("liken lab publish: %v\n%s", err, out)
	}
	upgradeStart := time.Now()
	if out, err := liken("upgrade", v2, "--kubeconfig", kc); err != nil {
		t.Fatalf("liken upgrade %s: %v\n%s", v2, err, out)
	}
	fleetOn := func(version string, slot v1alpha1.Slot, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			// Approve whatever waits (nothing, or the API down while the server reboots, is
			// not an error here).
			liken("approve-reboot", "--all", "--kubeconfig", kc)
			ms, err := lc.Machines(t.Context())
			on := 0
			for _, m := range ms {
				if m.Status.Release != nil && m.Status.Release.Version == version && m.Status.Release.Slot == slot &&
					m.Status.Upgrade.State == v1alpha1.UpgradeIdle && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady) {
					on++
				}
			}
			if err == nil && on == 2 {
				return
			}
			if time.Now().After(deadline) {
				st, _ := liken("status", "--kubeconfig", kc)
				t.Fatalf("the fleet is not on %s (slot %s) after %s:\n%s", version, slot, timeout, st)
			}
			time.Sleep(3 * time.Second)
		}
	}
	fleetOn(v2, v1alpha1.SlotB, 20*time.Minute)
	upgradeTook := time.Since(upgradeStart)
	// A rollback is this same fleet path with a slot that still holds the release, so
	// nothing to download: TestUpgradeCommitAndRollback rolls back with `liken rollback` and
	// checks no download.
	chlog, _ := os.ReadFile(filepath.Join(dir, "channel.log"))
	if n := strings.Count(string(chlog), "/"+v2+"/slot.img"); n != 2 {
		t.Errorf("the channel served %s's slot image %d times; want 2 (once per machine)\n%s", v2, n, chlog)
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
	// By the command line too, not only by the lab's own tag.
	if b, _ := exec.Command("pgrep", "-f", dir).Output(); len(bytes.TrimSpace(b)) > 0 {
		t.Errorf("processes of the lab still run after down: %s", b)
	}
	if left, err := lab.Leftovers(dir); err != nil || len(left) > 0 {
		t.Errorf("processes of the lab still run after down: %v %v", left, err)
	}
	report.Line("liken lab up (TCG, a server and an agent, 1 vCPU each): every machine Ready %s after the command started, release build included; fleet upgrade with approvals %s",
		took.Round(time.Second), upgradeTook.Round(time.Second))
}

// noLeftovers fails the test if a process the lab in dir started still runs, and stops it:
// one left would slow every VM test after it.
func noLeftovers(t *testing.T, dir string) {
	t.Helper()
	left, err := lab.Leftovers(dir)
	if err != nil {
		t.Errorf("looking for the lab's processes: %v", err)
	}
	if len(left) == 0 {
		return
	}
	t.Errorf("processes of the lab in %s outlived the test: %v", dir, left)
	if _, err := lab.Kill(dir, 10*time.Second); err != nil {
		t.Errorf("stopping them: %v", err)
	}
}
