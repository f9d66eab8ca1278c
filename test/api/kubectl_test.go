package api

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubectlColumnsAndExplain runs the built kubectl against the server: `get machines` and
// `get cluster` show the documented columns and values, `explain` shows field descriptions.
func TestKubectlColumnsAndExplain(t *testing.T) {
	c := dyn(t)
	m := createFresh(t, c, examples(t)["server-3"], "kubectl-test")
	set(t, m, machineStatus(), "status")
	if _, err := c.Resource(machinesGVR).UpdateStatus(ctx(t), m, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := env.Kubectl(ctx(t), "get", "machines", "kubectl-test")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get machines printed %d lines, want header and one row:\n%s", len(lines), out)
	}
	if got, want := strings.Fields(lines[0]), []string{"NAME", "ROLE", "WANTED", "RUNNING", "SLOT", "UPGRADE", "PENDING", "REBOOT", "READY", "AGE"}; !equal(got, want) {
		t.Errorf("kubectl get machines columns = %v, want %v", got, want)
	}
	if got := strings.Fields(lines[1]); len(got) < 9 || !equal(got[:9], []string{"kubectl-test", "server", "2026.08.01-001", "2026.07.20-001", "A", "Staged", "1", "WaitingForApproval", "True"}) {
		t.Errorf("kubectl get machines row = %v", got)
	}

	cl := createFresh(t, c, examples(t)["cluster"], "")
	set(t, cl, map[string]any{"machines": int64(5), "upToDateMachines": int64(3)}, "status")
	if _, err := c.Resource(clustersGVR).UpdateStatus(ctx(t), cl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err = env.Kubectl(ctx(t), "get", "cluster")
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get cluster printed %d lines:\n%s", len(lines), out)
	}
	if got, want := strings.Fields(lines[0]), []string{"NAME", "WANTED", "UP-TO-DATE", "MACHINES", "AGE"}; !equal(got, want) {
		t.Errorf("kubectl get cluster columns = %v, want %v", got, want)
	}
	if got := strings.Fields(lines[1]); len(got) < 4 || !equal(got[:4], []string{"liken", "2026.07.20-001", "3", "5"}) {
		t.Errorf("kubectl get cluster row = %v", got)
	}

	explain := []struct{ args, want []string }{
		{[]string{"explain", "machine.spec"}, []string{"MachineSpec is what operators declare", "role", "Role is server (control plane and workloads) or agent", "nodeTaints"}},
		{[]string{"explain", "machine.status.pending"}, []string{"Pending lists the changes staged", "class", "since"}},
		{[]string{"explain", "cluster.spec.disruptionBudget.maxUnavailable"}, []string{"count (at least 1) or a percentage"}},
	}
	for _, e := range explain {
		out, err := env.Kubectl(ctx(t), e.args...)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		for _, w := range e.want {
			if !strings.Contains(strings.Join(strings.Fields(out), " "), w) {
				t.Errorf("kubectl %s does not show %q:\n%s", strings.Join(e.args, " "), w, out)
			}
		}
	}

	// Short names that clash with no other API's (Cluster API has "clusters"/"cl").
	for short, want := range map[string]string{"lm": "machine.liken.dev/kubectl-test", "lc": "cluster.liken.dev/liken"} {
		out, err := env.Kubectl(ctx(t), "get", short, "-o", "name")
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("kubectl get %s: %v\n%s", short, err, out)
		}
	}

	// Both kinds are in the liken category.
	out, err = env.Kubectl(ctx(t), "get", "liken", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"cluster.liken.dev/liken", "machine.liken.dev/kubectl-test"} {
		if !strings.Contains(out, w) {
			t.Errorf("kubectl get liken does not list %s:\n%s", w, out)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
