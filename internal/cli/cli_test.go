package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/coordinator"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/syncbuf"
	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) { os.Exit(apiserver.Main(m, "cli", apiserver.Options{}, &env)) }

var examples = filepath.Join("..", "..", "docs", "examples")

func run(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	return runIn(t, "", args...)
}

// runIn runs liken with stdin as its standard input.
func runIn(t testing.TB, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRoot(&out, &errb)
	root.SetIn(strings.NewReader(stdin))
	code := execute(t.Context(), root, args, &errb)
	return code, out.String(), errb.String()
}

// commands walks the tree: every command a user can call, planned ones included.
func commands(c *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, sub := range c.Commands() {
		if !sub.IsAvailableCommand() {
			continue
		}
		out = append(out, sub)
		out = append(out, commands(sub)...)
	}
	return out
}

func isPlanned(c *cobra.Command) bool { return strings.Contains(c.Short, "[not yet available") }

func TestHelpForEveryCommand(t *testing.T) {
	var o, e bytes.Buffer
	for _, c := range commands(newRoot(&o, &e)) {
		path := strings.Fields(c.CommandPath())[1:]
		t.Run(strings.Join(path, " "), func(t *testing.T) {
			code, out, errOut := run(t, append(path, "--help")...)
			if code != exitOK || !strings.Contains(out, "Usage:") || errOut != "" {
				t.Fatalf("--help: exit %d, stderr %q\n%s", code, errOut, out)
			}
			if strings.Contains(out, "Global Flags") {
				t.Errorf("help shows flags that are not the command's own:\n%s", out)
			}
			code, out2, _ := run(t, append([]string{"help"}, path...)...)
			if code != exitOK || out2 != out {
				t.Errorf("liken help %s differs from --help (exit %d)", strings.Join(path, " "), code)
			}
			if !isPlanned(c) && !c.HasSubCommands() && c.Parent().Name() != "completion" && c.Example == "" {
				t.Errorf("no example")
			}
		})
	}
	code, out, _ := run(t, "--help")
	if code != exitOK {
		t.Fatalf("--help exited %d", code)
	}
	for _, want := range []string{"validate", "layer", "release", "install", "version", "completion", "approve-reboot", "request-reboot", "upgrade", "rollback", "lab", "Exit codes: 0 ok, 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	os.MkdirAll(full, 0o755)
	os.WriteFile(filepath.Join(full, "x"), []byte("x"), 0o644)
	pin := "sha256:" + strings.Repeat("a", 64)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"no command", nil, exitUsage, []string{"give a command"}},
		{"unknown command", []string{"frobnicate"}, exitUsage, []string{`unknown command "frobnicate"`, "validate"}},
		{"unknown subcommand", []string{"release", "foo"}, exitUsage, []string{`unknown command "foo"`, "build, keys, pin, publish, timestamp, verify"}},
		{"group alone", []string{"release"}, exitUsage, []string{"give one of its commands: build, keys, pin, publish, timestamp, verify"}},
		{"unknown flag", []string{"validate", "--frob", "x"}, exitUsage, []string{"unknown flag: --frob"}},
		{"lab with two servers", []string{"lab", "up", "--servers", "2"}, exitUsage, []string{"give 1, 3 or 5"}},
		{"lab up with an argument", []string{"lab", "up", "now"}, exitUsage, []string{"unknown command \"now\""}},
		{"upgrade without a version", []string{"upgrade"}, exitUsage, []string{"the release version"}},
		{"approve nothing", []string{"approve-reboot"}, exitUsage, []string{"name the machines to approve, or give --all"}},
		{"approve names and all", []string{"approve-reboot", "m1", "--all"}, exitUsage, []string{"or give --all"}},
		{"approve with a negative wait", []string{"approve-reboot", "m1", "--wait", "-1s"}, exitUsage, []string{"--wait -1s: give a duration of 0 or more"}},
		{"approve with a wait that is no duration", []string{"approve-reboot", "m1", "--wait", "5"}, exitUsage, []string{`invalid argument "5" for "--wait"`}},
		{"request without a machine", []string{"request-reboot"}, exitUsage, []string{"give the Machine to reboot"}},
		{"validate without paths", []string{"validate"}, exitUsage, []string{"give at least one file or directory"}},
		{"bad output format", []string{"validate", examples, "-o", "xml"}, exitUsage, []string{`--output "xml": give json or yaml`}},
		{"layer extra argument", []string{"layer", "--cluster", "c.yaml", "--machines", "m", "extra"}, exitUsage, []string{`unexpected argument "extra"`}},
		{"layer without machines", []string{"layer", "--cluster", "c.yaml"}, exitUsage, []string{"--cluster and --machines are required"}},
		{"layer into a missing identity", []string{"layer", "--cluster", filepath.Join(examples, "cluster.yaml"), "--machines", examples, "--out", filepath.Join(dir, "l"), "--identity", filepath.Join(dir, "typo")},
			exitUsage, []string{"does not exist", "would create a new cluster identity", "--new-identity"}},
		{"install onto a directory", []string{"install", "--channel", "file:///x", "--pin", pin, "--layer", "l", "--disk", dir}, exitUsage, []string{"is a directory"}},
		{"install with a malformed pin", []string{"install", "--channel", "file:///x", "--pin", "abc", "--layer", "l", "--disk", "d.img"}, exitUsage, []string{`--pin "abc" is not a digest`}},
		{"install extra argument", []string{"install", "oops", "--channel", "file:///x"}, exitUsage, []string{`unexpected argument "oops"`}},
		{"verify with a malformed pin", []string{"release", "verify", "--channel", "file:///x", "--version", "2026.08.01-001", "--pin", "deadbeef"}, exitUsage, []string{`--pin "deadbeef" is not a digest`}},
		{"verify with pin and cluster", []string{"release", "verify", "--channel", "file:///x", "--version", "2026.08.01-001", "--pin", pin, "--cluster", "c.yaml"}, exitUsage, []string{"not both"}},
		{"pin without version", []string{"release", "pin", "--channel", "file:///x"}, exitUsage, []string{"--version is required"}},
		{"pin with a bad version", []string{"release", "pin", "--channel", "file:///x", "--version", "latest"}, exitUsage, []string{`--version "latest" is not a release version`}},
		{"set-version without cluster", []string{"release", "pin", "--channel", "file:///x", "--version", "2026.08.01-001", "--set-version"}, exitUsage, []string{"--set-version needs --cluster"}},
		{"publish without a directory", []string{"release", "publish", "--channel", dir}, exitUsage, []string{"give one release directory"}},
		{"publish two directories", []string{"release", "publish", "--channel", dir, "a", "b"}, exitUsage, []string{`unexpected argument "b"`}},
		{"build without out", []string{"release", "build", "--version", "2026.08.01-001", "--k3s-stand-in"}, exitUsage, []string{"--out is required"}},
		{"build without k3s", []string{"release", "build", "--version", "2026.08.01-001", "--out", filepath.Join(dir, "new")}, exitUsage, []string{"--k3s-stand-in"}},
		{"build into a full directory", []string{"release", "build", "--version", "2026.08.01-001", "--out", full, "--k3s-stand-in"}, exitUsage, []string{"is not empty", "--force"}},
		{"completion for an unknown shell", []string{"completion", "tcsh"}, exitUsage, []string{"tcsh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := run(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr: %s", code, tc.code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			if tc.code == exitUsage && tc.name != "no command" && out != "" {
				t.Errorf("a usage error printed to stdout: %s", out)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "typo")); err == nil {
		t.Error("layer created an identity in a mistyped --identity")
	}
}

func TestValidate(t *testing.T) {
	code, out, errOut := run(t, "validate", examples)
	if code != exitOK || !strings.Contains(out, "6 objects valid") {
		t.Fatalf("validate examples: exit %d\n%s%s", code, out, errOut)
	}

	// Flags anywhere on the line, -o json parsed back, a file named twice counted once.
	code, out, errOut = run(t, "validate", examples, "--output", "json", filepath.Join(examples, "cluster.yaml"))
	var res validated
	if code != exitOK || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("validate -o json after a path: exit %d %s\n%s", code, errOut, out)
	}
	if len(res.Objects) != 6 || !res.Valid {
		t.Errorf("-o json: %d objects, valid %v; want the 6 examples once each", len(res.Objects), res.Valid)
	}
	code, out, _ = run(t, "validate", "-o", "yaml", examples)
	if code != exitOK || yaml.Unmarshal([]byte(out), &res) != nil || len(res.Objects) != 6 {
		t.Errorf("-o yaml: exit %d\n%s", code, out)
	}

	// A broken file does not hide the others; an invalid Machine is named.
	dir := t.TempDir()
	b, _ := os.ReadFile(filepath.Join(examples, "server-1.yaml"))
	os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte(strings.Replace(string(b), "role: server", "role: worker", 1)), 0o644)
	os.WriteFile(filepath.Join(dir, "broken.yaml"), []byte("kind: Machine\n  bad: [indent\n"), 0o644)
	ag, _ := os.ReadFile(filepath.Join(examples, "agent-1.yaml"))
	os.WriteFile(filepath.Join(dir, "good.yaml"), ag, 0o644)
	code, out, _ = run(t, "validate", filepath.Join(examples, "cluster.yaml"), dir)
	for _, w := range []string{`Unsupported value: "worker"`, "UNREADABLE  ", "broken.yaml", "ok       Machine agent-1"} {
		if !strings.Contains(out, w) {
			t.Errorf("validate of a directory with a broken file lacks %q:\n%s", w, out)
		}
	}
	if code != exitFailed {
		t.Errorf("exit %d; want %d", code, exitFailed)
	}

	// One Machine from standard input, checked against a Cluster given by --cluster.
	code, out, errOut = runIn(t, string(ag), "validate", "--cluster", filepath.Join(examples, "cluster.yaml"), "-")
	if code != exitOK || !strings.Contains(out, "ok       Machine agent-1 ((stdin))") || !strings.Contains(out, "ok       Cluster") {
		t.Errorf("validate - with --cluster: exit %d %s\n%s", code, errOut, out)
	}
}

func TestCRDsPrintsBoth(t *testing.T) {
	code, out, _ := run(t, "crds")
	if code != exitOK || !strings.Contains(out, "name: clusters.liken.dev") || !strings.Contains(out, "name: machines.liken.dev") {
		t.Errorf("crds: exit %d, output lacks a CRD", code)
	}
}

func TestLayer(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, errOut := run(t, "layer", "--cluster", filepath.Join(examples, "cluster.yaml"), "--machines", examples, "--out", out, "-o", "json")
	if code != exitOK {
		t.Fatalf("layer: %d %s", code, errOut)
	}
	var res builtLayers
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res.Layers) != 2 || res.Layers[0].Role != "server" || !strings.HasPrefix(res.Layers[1].Digest, "sha256:") {
		t.Errorf("layer -o json: %v\n%s", err, stdout)
	}
	for _, f := range []string{"server.layer", "agent.layer", "admin.kubeconfig", "identity/server-ca.key"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	// An explicit new identity is made when asked for.
	id := filepath.Join(t.TempDir(), "id")
	code, _, errOut = run(t, "layer", "--cluster", filepath.Join(examples, "cluster.yaml"), "--machines", examples, "--out", t.TempDir(), "--identity", id, "--new-identity")
	if _, err := os.Stat(filepath.Join(id, "server-ca.key")); code != exitOK || err != nil {
		t.Errorf("layer --new-identity: exit %d %s %v", code, errOut, err)
	}
}

func TestInstallRemovesItsImageOnFailure(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := run(t, "layer", "--cluster", filepath.Join(examples, "cluster.yaml"), "--machines", examples, "--out", dir)
	if code != exitOK {
		t.Fatal(errOut)
	}
	img := filepath.Join(dir, "disk.img")
	// The pin names no release in this (empty) channel: the install fails after it created
	// the image.
	code, _, errOut = run(t, "install", "--channel", "file://"+t.TempDir(), "--pin", "sha256:"+strings.Repeat("b", 64),
		"--layer", filepath.Join(dir, "server.layer"), "--disk", img, "--size", "3200M", "--machine", "server-1")
	if code != exitFailed || !strings.Contains(errOut, "removed the unfinished image") {
		t.Errorf("install with an unknown pin: exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(img); err == nil {
		t.Errorf("a failed install left %s behind", img)
	}
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		code, out, errOut := run(t, "completion", shell)
		if code != exitOK || !strings.Contains(out, "liken") || len(out) < 1000 {
			t.Errorf("completion %s: exit %d, %d bytes, %s", shell, code, len(out), errOut)
		}
	}
}

// ensureCluster creates the test API server's Cluster once.
func ensureCluster(t testing.TB, lc *kube.Client) {
	t.Helper()
	if _, err := lc.Cluster(t.Context()); err == nil {
		return
	}
	if _, err := lc.CreateCluster(t.Context(), &v1alpha1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterName},
		Spec: v1alpha1.ClusterSpec{Channel: "file:///srv/channel", Version: "2026.07.20-001",
			Releases: map[string]v1alpha1.Digest{"2026.07.20-001": v1alpha1.Digest("sha256:" + strings.Repeat("0", 64))}},
	}); err != nil {
		t.Fatal(err)
	}
}

// clusterRestoredAfter reads the Cluster, which the package's tests share, and has its spec
// put back when the test ends.
func clusterRestoredAfter(t *testing.T, lc *kube.Client) *v1alpha1.Cluster {
	t.Helper()
	cl, err := lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	saved := cl.Spec
	t.Cleanup(func() {
		if c, err := lc.Cluster(context.Background()); err == nil {
			c.Spec = saved
			lc.UpdateCluster(context.Background(), c)
		}
	})
	return cl
}

func TestVersion(t *testing.T) {
	code, out, errOut := run(t, "version", "-o", "json")
	var v versionInfo
	if code != exitOK || json.Unmarshal([]byte(out), &v) != nil || v.Liken == "" || !strings.HasPrefix(v.Go, "go1.") || v.Cluster != nil {
		t.Fatalf("version -o json: exit %d %s\n%s", code, errOut, out)
	}

	// Against a real API server, through a kubeconfig file.
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ensureCluster(t, lc)
	if _, err := lc.CreateMachine(t.Context(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleServer}}); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "version", "--kubeconfig", kc, "-o", "json")
	v = versionInfo{}
	if code != exitOK || json.Unmarshal([]byte(out), &v) != nil || v.Cluster == nil {
		t.Fatalf("version --kubeconfig: exit %d %s\n%s", code, errOut, out)
	}
	// The test's kube-apiserver is built from its module without version stamps.
	if v.Cluster.Kubernetes == "" || v.Cluster.Version != "2026.07.20-001" || v.Cluster.Running["unknown"] != 1 {
		t.Errorf("cluster versions %+v", v.Cluster)
	}
	t.Setenv("KUBECONFIG", kc)
	code, out, errOut = run(t, "version", "--context", "")
	if code != exitOK || !strings.Contains(out, "spec.version 2026.07.20-001") {
		t.Errorf("version with KUBECONFIG: exit %d %s\n%s", code, errOut, out)
	}
	code, _, errOut = run(t, "version", "--kubeconfig", filepath.Join(t.TempDir(), "none"))
	if code != exitFailed || !strings.Contains(errOut, "kubeconfig") {
		t.Errorf("version with a missing kubeconfig: exit %d %s", code, errOut)
	}
}

func TestReferenceUpToDate(t *testing.T) {
	got, err := os.ReadFile(filepath.Join("..", "..", "docs", "reference", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, Reference()) {
		t.Fatal("docs/reference/cli.md is stale: run make generate")
	}
}

// TestApproveAndRequestReboot runs approve-reboot and request-reboot against a real API
// server.
func TestApproveAndRequestReboot(t *testing.T) {
	lc, kc := adminClient(t)
	hashes := map[string]string{"r1": "sha256:" + strings.Repeat("1", 64), "r2": "sha256:" + strings.Repeat("2", 64), "r3": ""}
	for name, hash := range hashes {
		m, err := lc.CreateMachine(t.Context(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}})
		if err != nil {
			t.Fatal(err)
		}
		m.Status.ObservedGeneration = m.Generation
		m.Status.Reboot.State = v1alpha1.RebootNone
		if hash != "" {
			m.Status.PendingHash, m.Status.PendingCount = hash, 1
			m.Status.Pending = []v1alpha1.PendingChange{{Field: "machine.spec.network", Class: v1alpha1.Reboot, To: "{}", Since: metav1.Now()}}
			m.Status.Reboot.State = v1alpha1.RebootWaitingForApproval
		}
		if _, err := lc.UpdateMachineStatus(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	approvalOf := func(name string) *v1alpha1.RebootApproval {
		m, err := lc.Machine(t.Context(), name)
		if err != nil || m.Spec.Reboot == nil {
			return nil
		}
		return m.Spec.Reboot.Approval
	}

	code, out, errOut := run(t, "approve-reboot", "r1", "--kubeconfig", kc, "--approved-by", "alice", "-o", "json")
	var got []approval
	if code != exitOK || json.Unmarshal([]byte(out), &got) != nil || len(got) != 1 || got[0].PendingHash != hashes["r1"] {
		t.Fatalf("approve-reboot r1: exit %d %s\n%s", code, errOut, out)
	}
	if a := approvalOf("r1"); a == nil || a.PendingHash != hashes["r1"] || a.ApprovedBy != "alice" || a.ApprovedAt == nil {
		t.Errorf("r1's approval: %+v", a)
	}

	t.Setenv("KUBECONFIG", kc)
	code, out, errOut = run(t, "approve-reboot", "--all")
	if code != exitOK || !strings.Contains(out, "approved r2: pending set "+hashes["r2"]+" (machine.spec.network)") || strings.Contains(out, "r3") {
		t.Errorf("approve-reboot --all: exit %d %s\n%s", code, errOut, out)
	}
	if a := approvalOf("r2"); a == nil || a.PendingHash != hashes["r2"] || a.ApprovedBy == "" {
		t.Errorf("r2's approval: %+v", a)
	}

	for _, tc := range []struct{ name, want string }{
		{"r3", "nothing is pending"},
		{"nosuch", `no Machine "nosuch"`},
	} {
		code, _, errOut = run(t, "approve-reboot", tc.name)
		if code != exitFailed || !strings.Contains(errOut, tc.want) {
			t.Errorf("approve-reboot %s: exit %d, %s", tc.name, code, errOut)
		}
	}
	// An edit the machine has not reported on yet: its pending set is not the one shown.
	m, _ := lc.Machine(t.Context(), "r2")
	m.Spec.NodeLabels = map[string]v1alpha1.LabelValue{"example.com/x": "y"}
	if _, err := lc.UpdateMachine(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = run(t, "approve-reboot", "r2")
	if code != exitFailed || !strings.Contains(errOut, "does not describe its latest spec") {
		t.Errorf("approve-reboot of a Machine with a stale status: exit %d, %s", code, errOut)
	}

	code, out, errOut = run(t, "request-reboot", "r3", "--reason", "driver bound the wrong device", "--requested-by", "bob")
	if code != exitOK || !strings.Contains(out, "liken approve-reboot r3") {
		t.Fatalf("request-reboot: exit %d %s\n%s", code, errOut, out)
	}
	m, _ = lc.Machine(t.Context(), "r3")
	if r := m.Spec.Reboot; r == nil || r.Request == nil || r.Request.Reason != "driver bound the wrong device" || r.Request.RequestedBy != "bob" || r.Request.RequestedAt.IsZero() {
		t.Errorf("r3's request: %+v", m.Spec.Reboot)
	}
	if code, _, errOut := run(t, "request-reboot", "nosuch"); code != exitFailed || !strings.Contains(errOut, `no Machine "nosuch"`) {
		t.Errorf("request-reboot of an unknown machine: exit %d, %s", code, errOut)
	}
}

// TestStatusSaysWhatFailed: a machine Ready and idle whose network trial failed, or whose
// disk was refused, says so in WHY.
func TestStatusSaysWhatFailed(t *testing.T) {
	cond := func(typ, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Message: msg}
	}
	for _, tc := range []struct {
		conds []metav1.Condition
		want  string
	}{
		{[]metav1.Condition{cond(v1alpha1.MachineReady, ""), cond(v1alpha1.MachineDegraded, "a trial failed: see the UpgradeFailed condition"),
			cond(v1alpha1.MachineUpgradeFailed, "the network settings of spec.network failed their trial")}, "the network settings of spec.network failed their trial"},
		{[]metav1.Condition{cond(v1alpha1.MachineReady, ""), cond(v1alpha1.MachineDegraded, "disks not ready, left untouched or failed (see status.disks): /dev/vdb Refused (HoldsData)")},
			"disks not ready, left untouched or failed (see status.disks): /dev/vdb Refused (HoldsData)"},
		{[]metav1.Condition{cond(v1alpha1.MachineReady, "")}, ""},
	} {
		m := &v1alpha1.Machine{Status: v1alpha1.MachineStatus{Conditions: tc.conds, Reboot: v1alpha1.RebootStatus{State: v1alpha1.RebootNone}, Upgrade: v1alpha1.UpgradeStatus{State: v1alpha1.UpgradeIdle}}}
		if got := row(m).Why; got != tc.want {
			t.Errorf("why %q, want %q", got, tc.want)
		}
	}
}

// TestStatusSaysTheQuorum: the control plane's line, from the Cluster's ControlPlaneQuorum,
// when the servers report their etcd membership; none when they do not.
func TestStatusSaysTheQuorum(t *testing.T) {
	for _, tc := range []struct {
		cond *metav1.Condition
		want string
	}{
		{&metav1.Condition{Type: v1alpha1.ClusterControlPlaneQuorum, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonTooFewVoters, Message: "1 etcd voter(s) (s1): the quorum is 1"},
			"control plane: TooFewVoters: 1 etcd voter(s) (s1): the quorum is 1\n"},
		{&metav1.Condition{Type: v1alpha1.ClusterControlPlaneQuorum, Status: metav1.ConditionUnknown, Reason: v1alpha1.ReasonNotReported, Message: "no server's Node reports"}, ""},
		{nil, ""},
	} {
		f := fleet{Coordinator: "s1"}
		if tc.cond != nil {
			f.Conditions = []metav1.Condition{*tc.cond}
		}
		var b strings.Builder
		summary(&b, f)
		got := ""
		for _, l := range strings.SplitAfter(b.String(), "\n") {
			if strings.HasPrefix(l, "control plane:") {
				got += l
			}
		}
		if got != tc.want {
			t.Errorf("%+v: %q; want %q", tc.cond, got, tc.want)
		}
	}
}

// TestStatusSaysTheSnapshots: a server's etcd snapshot for its last turn, or its failure,
// is a line of the summary; a machine with none has no line.
func TestStatusSaysTheSnapshots(t *testing.T) {
	turn := metav1.NewTime(time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC))
	taken := metav1.NewTime(turn.Add(3 * time.Second))
	f := fleet{Machines: []machineState{
		{Name: "s1", EtcdSnapshot: &v1alpha1.EtcdSnapshotStatus{Turn: turn, For: "release 2026.12.01-002", Name: "liken-s1-1796623203", SizeBytes: 4 << 20, TakenAt: &taken}},
		{Name: "s2", EtcdSnapshot: &v1alpha1.EtcdSnapshotStatus{Turn: turn, Error: "etcd database not found"}},
		{Name: "a1"},
	}}
	var b strings.Builder
	summary(&b, f)
	var got []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "etcd snapshot:") {
			got = append(got, l)
		}
	}
	want := []string{
		"etcd snapshot: s1: liken-s1-1796623203 (4194304 bytes) taken at 2026-12-07T06:00:03Z for the turn given at 2026-12-07T06:00:00Z, release 2026.12.01-002",
		"etcd snapshot: s2: FAILED for the turn given at 2026-12-07T06:00:00Z (tried again every minute; the drain waits): etcd database not found",
	}
	if !slices.Equal(got, want) {
		t.Errorf("the snapshot lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestStatusSaysASoftwareWatchdog: a machine whose only watchdog is softdog is named (a
// hung kernel will not reset it); one with a hardware watchdog, or none reported, is not.
func TestStatusSaysASoftwareWatchdog(t *testing.T) {
	hw := func(ids ...string) *v1alpha1.Hardware {
		h := &v1alpha1.Hardware{}
		for i, id := range ids {
			h.Watchdogs = append(h.Watchdogs, v1alpha1.WatchdogInfo{Name: fmt.Sprintf("watchdog%d", i), Identity: id})
		}
		return h
	}
	var f fleet
	for name, h := range map[string]*v1alpha1.Hardware{
		"soft": hw(v1alpha1.SoftwareWatchdog), "esb": hw("i6300ESB timer", v1alpha1.SoftwareWatchdog), "none": hw(), "unread": nil,
	} {
		f.Machines = append(f.Machines, row(&v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.MachineStatus{Hardware: h}}))
	}
	slices.SortFunc(f.Machines, func(a, b machineState) int { return strings.Compare(a.Name, b.Name) })
	var b strings.Builder
	summary(&b, f)
	var got []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "watchdog:") {
			got = append(got, l)
		}
	}
	want := []string{"watchdog: soft: softdog only, no hardware watchdog liken drives: a hang of the kernel itself will not reset it"}
	if !slices.Equal(got, want) {
		t.Errorf("the watchdog lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// And a server's last etcd restore, done or failed, and its last rejoin.
	at := metav1.NewTime(time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC))
	restores := fleet{Machines: []machineState{
		{Name: "s1", EtcdRestore: &v1alpha1.EtcdRestoreStatus{Snapshot: "liken-s1-1796600000", At: at}},
		{Name: "s2", EtcdRestore: &v1alpha1.EtcdRestoreStatus{Snapshot: "liken-s2-1", At: at, Error: "no snapshot liken-s2-1 on this server"}},
		{Name: "s3", EtcdRejoin: &v1alpha1.EtcdRejoinStatus{Request: "after-restore", At: at, MovedTo: "etcd-old-1796600000"}},
		{Name: "s4", EtcdRejoin: &v1alpha1.EtcdRejoinStatus{Request: "r", At: at, Error: "this server initialises the cluster"}},
		{Name: "s5", EtcdRejoin: &v1alpha1.EtcdRejoinStatus{Request: "r", At: at}},
	}}
	var rb strings.Builder
	summary(&rb, restores)
	for _, line := range []string{
		"etcd restore: s1: restored from liken-s1-1796600000 at 2026-12-07T06:00:00Z; what the cluster wrote after that snapshot is gone",
		"etcd restore: s2: from liken-s2-1 FAILED at 2026-12-07T06:00:00Z (k3s started on etcd's data as it was): no snapshot liken-s2-1 on this server",
		`etcd rejoin: s3: request "after-restore" at 2026-12-07T06:00:00Z: its etcd data set aside (server/db/etcd-old-1796600000), k3s to join as a new member`,
		`etcd rejoin: s4: request "r" REFUSED at 2026-12-07T06:00:00Z (k3s started on etcd's data as it was): this server initialises the cluster`,
		`etcd rejoin: s5: request "r" at 2026-12-07T06:00:00Z: it had no etcd data, k3s to join as a new member`,
	} {
		if !strings.Contains(rb.String(), line+"\n") {
			t.Errorf("status does not say %q:\n%s", line, rb.String())
		}
	}
	if f.Machines[0].Name != "esb" || f.Machines[0].Watchdog != "i6300ESB timer" {
		t.Errorf("esb's row says watchdog %q", f.Machines[0].Watchdog)
	}
}

func TestStatus(t *testing.T) {
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ensureCluster(t, lc)
	m, err := lc.CreateMachine(t.Context(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "st1"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleServer}})
	if err != nil {
		t.Fatal(err)
	}
	m.Status.ObservedGeneration = m.Generation
	m.Status.Release = &v1alpha1.RunningRelease{Version: "2026.07.20-001", Slot: "A", LastGoodSlot: "A"}
	m.Status.Upgrade = v1alpha1.UpgradeStatus{State: v1alpha1.UpgradeStaged, WantedVersion: "2026.08.01-001", Message: "slot B holds release 2026.08.01-001"}
	m.Status.PendingCount = 1
	m.Status.Reboot = v1alpha1.RebootStatus{State: v1alpha1.RebootWaitingForApproval, Message: "cluster.spec.version need a reboot; approve pending set sha256:x"}
	m.Status.Conditions = []metav1.Condition{{Type: v1alpha1.MachineReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.Now()}}
	if _, err := lc.UpdateMachineStatus(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "status", "st1", "--kubeconfig", kc, "-o", "json")
	var f fleet
	if code != exitOK || json.Unmarshal([]byte(out), &f) != nil || len(f.Machines) != 1 {
		t.Fatalf("status -o json: exit %d %s\n%s", code, errOut, out)
	}
	want := machineState{Name: "st1", Role: "server", Wanted: "2026.08.01-001", Running: "2026.07.20-001", Slot: "A", Upgrade: "Staged",
		Pending: 1, Reboot: "WaitingForApproval", Ready: "True", Why: "cluster.spec.version need a reboot; approve pending set sha256:x"}
	if f.Machines[0] != want || f.Version != "2026.07.20-001" || f.Policy != "Manual" {
		t.Errorf("status: %+v\nwant machine %+v", f, want)
	}
	code, out, _ = run(t, "status", "--kubeconfig", kc)
	if code != exitOK || !strings.Contains(out, "cluster: wanted release 2026.07.20-001, rebootPolicy Manual") || !strings.Contains(out, "MACHINE") ||
		!strings.Contains(strings.Join(strings.Fields(out), " "), "st1 server 2026.08.01-001 2026.07.20-001 A Staged 1 WaitingForApproval True cluster.spec.version") {
		t.Errorf("status table:\n%s", out)
	}
	if code, _, errOut := run(t, "status", "nosuch", "--kubeconfig", kc); code != exitFailed || !strings.Contains(errOut, `no Machine "nosuch"`) {
		t.Errorf("status of an unknown machine: exit %d, %s", code, errOut)
	}

	// The output options kubectl users reach for first (st1 named: the package's other
	// tests make Machines of their own).
	if code, out, _ := run(t, "status", "st1", "--kubeconfig", kc, "-o", "name"); code != exitOK || out != "machine."+v1alpha1.GroupVersion.Group+"/st1\n" {
		t.Errorf("status -o name: exit %d %q", code, out)
	}
	if code, out, _ := run(t, "status", "st1", "--kubeconfig", kc, "--no-headers"); code != exitOK || strings.Contains(out, "cluster:") || strings.Contains(out, "MACHINE") ||
		!strings.HasPrefix(strings.Join(strings.Fields(out), " "), "st1 server 2026.08.01-001") {
		t.Errorf("status --no-headers: exit %d\n%s", code, out)
	}
	m, err = lc.Machine(t.Context(), "st1")
	if err != nil {
		t.Fatal(err)
	}
	booted := metav1.NewTime(time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC))
	m.Status.Release.Digest, m.Status.Release.BootTime = "sha256:"+strings.Repeat("ab", 32), &booted
	m.Status.Hardware = &v1alpha1.Hardware{System: v1alpha1.SystemInfo{Vendor: "QEMU", Product: "Standard PC"}}
	m.Status.Network = &v1alpha1.NetworkStatus{Links: []v1alpha1.LinkInfo{{Name: "eth0", Kind: "port", Addresses: []string{"10.0.2.15/24"}}}}
	if _, err := lc.UpdateMachineStatus(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	code, out, _ = run(t, "status", "st1", "--kubeconfig", kc, "-o", "wide")
	if fields := strings.Join(strings.Fields(out), " "); code != exitOK || !strings.Contains(fields, "READY ADDRESS DIGEST BOOTED HARDWARE WHY") ||
		!strings.Contains(fields, "True 10.0.2.15 sha256:abababababab 2026-12-06T08:00:00Z QEMU Standard PC cluster.spec.version") {
		t.Errorf("status -o wide: exit %d\n%s", code, out)
	}
	if code, _, errOut := run(t, "status", "--kubeconfig", kc, "-o", "tree"); code != exitUsage || !strings.Contains(errOut, "give json, yaml, wide or name") {
		t.Errorf("status -o tree: exit %d %s", code, errOut)
	}

	// -w: the view, then the view again when a Machine changes, until interrupted.
	ctx, cancel := context.WithCancel(t.Context())
	var wout, werr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- execute(ctx, newRoot(&wout, &werr), []string{"status", "st1", "-w", "--kubeconfig", kc}, &werr)
	}()
	waitFor := func(what string, ok func(string) bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return ok(wout.String()), nil }); err != nil {
			t.Fatalf("status -w: %s did not come: %q %q", what, wout.String(), werr.String())
		}
	}
	waitFor("the first view", func(s string) bool { return strings.Contains(s, "WaitingForApproval") })
	m, _ = lc.Machine(t.Context(), "st1")
	m.Status.Reboot = v1alpha1.RebootStatus{State: v1alpha1.RebootDraining, Message: "draining: 1 pod to go"}
	if _, err := lc.UpdateMachineStatus(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	waitFor("the view after the change", func(s string) bool {
		return strings.Count(s, "cluster: wanted release") == 2 && strings.Contains(s, "draining: 1 pod to go")
	})
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("status -w ended with exit %d: %s", code, werr.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("status -w did not end after its interrupt")
	}
}

// TestReleaseTurn gives back the turn of a machine that does not come back, against a real
// API server, and status shows the turn and who gave it back.
func TestReleaseTurn(t *testing.T) {
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ensureCluster(t, lc)
	cl, err := lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	since := metav1.NewTime(time.Now().UTC().Add(-time.Hour).Truncate(time.Second))
	cl.Status.Turns = []v1alpha1.Turn{{Machine: "gone-1", Since: since, PendingHash: "sha256:x", Phase: v1alpha1.TurnDrained}}
	cl.Status.Coordinator = "srv-1"
	until := metav1.NewTime(since.Add(2 * time.Hour))
	cl.Status.Rollout = &v1alpha1.RolloutStatus{TargetVersion: "v1", TurnsEnded: 1, SoakUntil: &until,
		LastTurnEnded: &v1alpha1.EndedTurn{Machine: "canary-1", At: since, Canary: true}}
	if _, err := lc.UpdateClusterStatus(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "release-turn", "gone-1", "--kubeconfig", kc, "--released-by", "carol")
	if code != exitOK || !strings.Contains(out, "gave back gone-1's turn") || !strings.Contains(out, "uncordons the Node") {
		t.Fatalf("release-turn: exit %d %s\n%s", code, errOut, out)
	}
	cl, _ = lc.Cluster(t.Context())
	if len(cl.Status.Turns) != 1 || cl.Status.Turns[0].ReleasedBy != "carol" {
		t.Errorf("the turn after release-turn: %+v", cl.Status.Turns)
	}
	code, out, _ = run(t, "status", "--kubeconfig", kc)
	if code != exitOK || !strings.Contains(out, "coordinator: srv-1") || !strings.Contains(out, "turn: gone-1 since "+since.Format(time.RFC3339)+" (Drained), given back by carol") {
		t.Errorf("status with a turn:\n%s", out)
	}
	if want := "soaking: no new turn before " + until.UTC().Format(time.RFC3339) + " (spec.rollout.soak), after canary-1's turn ended well at " + since.Format(time.RFC3339); !strings.Contains(out, want) {
		t.Errorf("status while soaking lacks %q:\n%s", want, out)
	}
	if code, _, errOut := run(t, "release-turn", "nosuch", "--kubeconfig", kc); code != exitFailed || !strings.Contains(errOut, "nosuch holds no disruption-budget turn") {
		t.Errorf("release-turn of a machine without a turn: exit %d, %s", code, errOut)
	}
	if code, _, errOut := run(t, "release-turn", "--kubeconfig", kc); code != exitUsage {
		t.Errorf("release-turn without a machine: exit %d, %s", code, errOut)
	}
	cl, _ = lc.Cluster(t.Context())
	cl.Status = v1alpha1.ClusterStatus{}
	if _, err := lc.UpdateClusterStatus(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
}

// TestLayerStrictKinds: liken layer takes from the Cluster file exactly one liken.dev
// Cluster, and from the Machines directory only liken.dev Machines, with the words install
// and init use for a layer that does not.
func TestLayerStrictKinds(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(examples, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cluster, agent := read("cluster.yaml"), read("agent-1.yaml")
	for _, tc := range []struct {
		name, cluster string
		extra         map[string]string // more files in the Machines directory
		want          string
	}{
		{"a Machine after the Cluster", cluster + "\n---\n" + agent, nil, "cluster.yaml holds 2 documents; it must hold exactly one Cluster"},
		{"a Machine as the Cluster", agent, nil, `cluster.yaml is a liken.dev/v1alpha1 "Machine", not a liken.dev/v1alpha1 "Cluster"`},
		{"an empty Cluster file", "", nil, "cluster.yaml holds 0 documents; it must hold exactly one Cluster"},
		{"a Cluster among the Machines", cluster, map[string]string{"stray.yaml": cluster}, "a second Cluster"},
		{"another group's Machine", cluster, map[string]string{"other.yaml": "apiVersion: example.com/v1\nkind: Machine\nmetadata:\n  name: x1\nspec:\n  role: agent\n"},
			"a layer holds only liken.dev/v1alpha1 Cluster and Machine objects, not example.com/v1 Machine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			machines := filepath.Join(dir, "machines")
			if err := os.MkdirAll(machines, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{"agent-1.yaml", "server-1.yaml"} {
				if err := os.WriteFile(filepath.Join(machines, n), []byte(read(n)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for n, body := range tc.extra {
				if err := os.WriteFile(filepath.Join(machines, n), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cf := filepath.Join(dir, "cluster.yaml")
			if err := os.WriteFile(cf, []byte(tc.cluster), 0o644); err != nil {
				t.Fatal(err)
			}
			code, _, errOut := run(t, "layer", "--cluster", cf, "--machines", machines, "--out", filepath.Join(dir, "out"))
			if code != exitFailed || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d: %s; want it to say %q", code, errOut, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "out", "server.layer")); err == nil {
				t.Error("a layer was written anyway")
			}
		})
	}
}

// TestUpgradeAndRollback runs upgrade and rollback against a real API server and a file://
// channel: a release is pinned only with the digest its channel really has, a version on
// the wrong side is refused naming the other command, --machine changes those Machines
// alone, and nothing is written when a check fails.
func TestUpgradeAndRollback(t *testing.T) {
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ensureCluster(t, lc)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	channel := t.TempDir()
	const old, next = "2026.07.20-001", "2026.08.03-001"
	code, out, errOut := run(t, "release", "publish", "--channel", channel, makeRelease(t, next, "the next release"), "-o", "json")
	var pub releaseResult
	if code != exitOK || json.Unmarshal([]byte(out), &pub) != nil {
		t.Fatalf("publish: %d %s %s", code, out, errOut)
	}
	cl := clusterRestoredAfter(t, lc)
	cl.Spec.Channel, cl.Spec.Version, cl.Spec.InsecureUnsignedChannel = "file://"+channel, old, true
	if _, err := lc.UpdateCluster(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	if _, err := lc.CreateMachine(t.Context(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "canary-1"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.DeleteMachine(context.Background(), "canary-1") })
	state := func() (string, string, string) {
		c, err := lc.Cluster(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		m, err := lc.Machine(t.Context(), "canary-1")
		if err != nil {
			t.Fatal(err)
		}
		return string(c.Spec.Version), string(c.Spec.Releases[next]), string(m.Spec.Version)
	}
	k := []string{"--kubeconfig", kc}
	for _, tc := range []struct {
		name string
		args []string
		code int
		says []string
		// after: the Cluster's version, next's pin, canary-1's version.
		after [3]string
	}{
		{"not a version", []string{"upgrade", "latest"}, exitUsage, []string{"not a release version"}, [3]string{old, "", ""}},
		{"not pinned", []string{"upgrade", next}, exitFailed, []string{next + " is not pinned", "--pin DIGEST", "liken release pin --channel file://"}, [3]string{old, "", ""}},
		{"a pin the channel does not have", []string{"upgrade", next, "--pin", "sha256:" + strings.Repeat("e", 64)}, exitFailed, []string{"has digest " + pub.Digest, "not pinned"}, [3]string{old, "", ""}},
		{"backwards", []string{"upgrade", "2026.01.01-001", "--pin", pub.Digest}, exitFailed, []string{"newer than 2026.01.01-001", "liken rollback"}, [3]string{old, "", ""}},
		{"pinned and set", []string{"upgrade", next, "--pin", pub.Digest}, exitOK, []string{"pinned " + next, "Cluster spec.version: " + old + " -> " + next, "liken approve-reboot"}, [3]string{next, pub.Digest, ""}},
		{"again", []string{"upgrade", next}, exitOK, []string{"runs " + next + " already"}, [3]string{next, pub.Digest, ""}},
		{"a pin never changes", []string{"upgrade", next, "--pin", "sha256:" + strings.Repeat("e", 64)}, exitFailed, []string{"pinned to " + pub.Digest + " already"}, [3]string{next, pub.Digest, ""}},
		{"upgrade to an older one", []string{"upgrade", old}, exitFailed, []string{"newer than " + old, "liken rollback " + old}, [3]string{next, pub.Digest, ""}},
		{"rollback to a newer one", []string{"rollback", next, "--machine", "canary-1"}, exitOK, []string{"runs " + next + " already"}, [3]string{next, pub.Digest, ""}},
		{"rollback to one never pinned", []string{"rollback", "2026.07.01-001"}, exitFailed, []string{"not pinned", "a rollback goes back to a release pinned before"}, [3]string{next, pub.Digest, ""}},
		{"rollback of an unknown machine", []string{"rollback", old, "--machine", "canary-1", "--machine", "nosuch"}, exitFailed, []string{`no Machine "nosuch"`}, [3]string{next, pub.Digest, ""}},
		{"rollback of one machine", []string{"rollback", old, "--machine", "canary-1"}, exitOK, []string{"Machine canary-1 spec.version: " + next + " (the Cluster's) -> " + old}, [3]string{next, pub.Digest, old}},
		{"upgrade of that machine past the Cluster's", []string{"upgrade", "2026.09.01-001", "--machine", "canary-1"}, exitFailed, []string{"not pinned"}, [3]string{next, pub.Digest, old}},
		{"rollback of the fleet", []string{"rollback", old}, exitOK, []string{"Cluster spec.version: " + next + " -> " + old}, [3]string{old, pub.Digest, old}},
		{"rollback past a machine's own", []string{"rollback", "2026.07.20-001", "--machine", "canary-1", "-o", "json"}, exitOK, []string{`"to": "2026.07.20-001"`}, [3]string{old, pub.Digest, old}},
	} {
		code, out, errOut := run(t, append(tc.args, k...)...)
		if code != tc.code {
			t.Errorf("%s: liken %v exited %d, want %d\n%s%s", tc.name, tc.args, code, tc.code, out, errOut)
		}
		for _, s := range tc.says {
			if !strings.Contains(out+errOut, s) {
				t.Errorf("%s: liken %v does not say %q:\n%s%s", tc.name, tc.args, s, out, errOut)
			}
		}
		if v, p, m := state(); [3]string{v, p, m} != tc.after {
			t.Errorf("%s: after liken %v the Cluster's version, %s's pin and canary-1's version are %q; want %q", tc.name, tc.args, next, [3]string{v, p, m}, tc.after)
		}
	}
}

// TestRolloutPauseResume: rollout pause writes the Cluster's spec.rollout with who, when and
// why, and says what it means; status shows the pause once the coordinator's condition says
// so; resume clears it, and resuming a rollout not paused changes nothing.
func TestRolloutPauseResume(t *testing.T) {
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ensureCluster(t, lc)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	three := int32(3)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl, err := lc.Cluster(t.Context())
		if err != nil {
			return err
		}
		cl.Spec.Rollout = &v1alpha1.Rollout{MaxFailures: &three}
		_, err = lc.UpdateCluster(t.Context(), cl)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UTC().Truncate(time.Second)
	code, out, errOut := run(t, "rollout", "pause", "--kubeconfig", kc, "--reason", "the canary's workloads", "--paused-by", "dana")
	if code != exitOK || !strings.Contains(out, "the rollout is paused (spec.rollout.paused, by dana at ") || !strings.Contains(out, "the canary's workloads") {
		t.Fatalf("rollout pause: exit %d %s\n%s", code, errOut, out)
	}
	cl, err := lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r := cl.Spec.Rollout
	if !r.IsPaused() || r.PausedBy != "dana" || r.Reason != "the canary's workloads" || r.PausedAt == nil || r.PausedAt.Time.Before(before) || r.FailureLimit() != 3 {
		t.Errorf("spec.rollout after pause: %+v; want paused by dana, maxFailures kept", r)
	}
	// The coordinator's condition, as it writes it (MakePlan), which status shows.
	meta.SetStatusCondition(&cl.Status.Conditions, metav1.Condition{Type: v1alpha1.ClusterRolloutPaused, Status: metav1.ConditionTrue,
		Reason: v1alpha1.ReasonPaused, Message: coordinator.PausedMessage(r)})
	if _, err := lc.UpdateClusterStatus(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := run(t, "status", "--kubeconfig", kc); code != exitOK || !strings.Contains(out, "RolloutPaused=True: the rollout is paused (spec.rollout.paused, by dana") {
		t.Errorf("status while paused:\n%s", out)
	}
	code, out, errOut = run(t, "rollout", "resume", "--kubeconfig", kc)
	if code != exitOK || !strings.Contains(out, "resumed (it was: the rollout is paused (spec.rollout.paused, by dana") {
		t.Errorf("rollout resume: exit %d %s\n%s", code, errOut, out)
	}
	if cl, _ = lc.Cluster(t.Context()); cl.Spec.Rollout.IsPaused() || cl.Spec.Rollout.PausedBy != "" || cl.Spec.Rollout.FailureLimit() != 3 ||
		cl.Spec.Rollout.ResumedAt == nil || cl.Spec.Rollout.ResumedAt.Time.Before(before) {
		t.Errorf("spec.rollout after resume: %+v; want not paused, resumedAt now, maxFailures kept", cl.Spec.Rollout)
	}
	resumed := *cl.Spec.Rollout.ResumedAt
	if code, out, _ := run(t, "rollout", "resume", "--kubeconfig", kc); code != exitOK || !strings.Contains(out, "neither paused nor halted: nothing changed") {
		t.Errorf("resume when not paused: exit %d\n%s", code, out)
	}
	// Halted by the coordinator (as MakePlan writes it): status shows the failures, and a
	// resume accepts them by moving resumedAt on, though spec.rollout.paused is false.
	failedAt := metav1.NewTime(resumed.Add(time.Second))
	fail := v1alpha1.TrialFailure{Machine: "w1", What: "release v2 (sha256:22)", Key: "sha256:22", Reason: v1alpha1.ReasonHealthDeadline, Message: "k3s never healthy", At: failedAt}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl, err := lc.Cluster(t.Context())
		if err != nil {
			return err
		}
		cl.Status.Rollout = &v1alpha1.RolloutStatus{TargetVersion: "v2", Failures: []v1alpha1.TrialFailure{fail},
			Halted: &v1alpha1.RolloutHalt{What: fail.What, Key: fail.Key, Machines: []string{"w1"}, MaxFailures: 1}}
		_, err = lc.UpdateClusterStatus(t.Context(), cl)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := run(t, "status", "--kubeconfig", kc); code != exitOK ||
		!strings.Contains(out, "trial failed: w1, release v2 (sha256:22) at "+failedAt.UTC().Format(time.RFC3339)+": HealthDeadline: k3s never healthy\n") {
		t.Errorf("status while halted:\n%s", out)
	}
	time.Sleep(time.Until(failedAt.Add(time.Second))) // resumedAt is to the second
	code, out, errOut = run(t, "rollout", "resume", "--kubeconfig", kc)
	if code != exitOK || !strings.Contains(out, "resumed after the halt (release v2 (sha256:22)); the failed trials up to ") {
		t.Errorf("rollout resume after a halt: exit %d %s\n%s", code, errOut, out)
	}
	if cl, _ = lc.Cluster(t.Context()); cl.Spec.Rollout.ResumedAt == nil || cl.Spec.Rollout.ResumedAt.Before(&failedAt) {
		t.Errorf("spec.rollout after resuming a halt: %+v; want resumedAt at or after the failure (%s)", cl.Spec.Rollout, failedAt)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl, err := lc.Cluster(t.Context())
		if err != nil {
			return err
		}
		cl.Spec.Rollout = nil
		_, err = lc.UpdateCluster(t.Context(), cl)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "rollout", "pause", "now", "--kubeconfig", kc); code != exitUsage {
		t.Errorf("rollout pause with an argument: exit %d, %s", code, errOut)
	}
	if cl, err = lc.Cluster(t.Context()); err != nil {
		t.Fatal(err)
	}
	cl.Status = v1alpha1.ClusterStatus{}
	if _, err := lc.UpdateClusterStatus(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
}
