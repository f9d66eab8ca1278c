package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/syncbuf"
	"liken.dev/liken/test/apiserver"
)

// started is a liken command running in the background.
type started struct {
	out, err syncbuf.Buffer
	code     chan int
}

func start(t *testing.T, args ...string) *started {
	t.Helper()
	s := &started{code: make(chan int, 1)}
	root := newRoot(&s.out, &s.err)
	go func() { s.code <- execute(t.Context(), root, args, &s.err) }()
	return s
}

// until waits for the command to say want on stderr; it fails if the command ends first.
func (s *started) until(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(s.err.String(), want) {
		select {
		case code := <-s.code:
			t.Fatalf("the command ended (exit %d) without saying %q:\n%s%s", code, want, s.out.String(), s.err.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command did not say %q in 30s:\n%s", want, s.err.String())
		}
	}
}

func (s *started) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-s.code:
		return code
	case <-time.After(time.Minute):
		t.Fatal("the command did not end in a minute")
		return 0
	}
}

// adminClient is a client of the test's API server as its admin, and a kubeconfig file for
// the commands.
func adminClient(t testing.TB) (*kube.Client, string) {
	t.Helper()
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	return lc, kc
}

// TestApproveRebootWaitsForTheAgent: `liken request-reboot X && liken approve-reboot X`
// approves the pending set that holds the request, once the agent has reported it, never
// the one before it; an agent that does not report in --wait fails the approval, saying
// what was waited for; and --wait waits for any other edit the agent has not seen. The
// test writes the status an agent would, while approve-reboot waits.
func TestApproveRebootWaitsForTheAgent(t *testing.T) {
	lc, kc := adminClient(t)
	network := v1alpha1.PendingChange{Field: "machine.spec.network", Class: v1alpha1.Reboot, To: "{}", Since: metav1.NewTime(time.Now().UTC().Truncate(time.Second))}
	// machine is a Machine whose agent reported on its spec with the network change pending.
	machine := func(t *testing.T, name string) {
		t.Helper()
		m, err := lc.CreateMachine(t.Context(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lc.DeleteMachine(context.Background(), name) })
		report(t, lc, m, network)
	}
	approvalOf := func(t *testing.T, name string) *v1alpha1.RebootApproval {
		m, err := lc.Machine(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if m.Spec.Reboot == nil {
			return nil
		}
		return m.Spec.Reboot.Approval
	}
	k := []string{"--kubeconfig", kc}

	t.Run("a request the agent has not seen yet", func(t *testing.T) {
		machine(t, "wait-1")
		if code, _, errOut := run(t, append([]string{"request-reboot", "wait-1", "--reason", "test"}, k...)...); code != exitOK {
			t.Fatalf("request-reboot: %s", errOut)
		}
		m, err := lc.Machine(t.Context(), "wait-1")
		if err != nil {
			t.Fatal(err)
		}
		at := m.Spec.Reboot.Request.RequestedAt
		cmd := start(t, append([]string{"approve-reboot", "wait-1", "-o", "json"}, k...)...)
		cmd.until(t, "for the agent on wait-1 to see its reboot request of "+at.UTC().Format(time.RFC3339)+" (its status describes generation 1 of 2)")
		if a := approvalOf(t, "wait-1"); a != nil {
			t.Fatalf("approved %s before the agent reported the request", a.PendingHash)
		}
		b, _ := json.Marshal(m.Spec.Reboot.Request)
		want := report(t, lc, m, network, v1alpha1.PendingChange{Field: requestField, Class: v1alpha1.Reboot, To: string(b), Since: at})
		if code := cmd.wait(t); code != exitOK {
			t.Fatalf("approve-reboot: exit %d\n%s%s", code, cmd.out.String(), cmd.err.String())
		}
		var got []approval
		if err := json.Unmarshal([]byte(cmd.out.String()), &got); err != nil || len(got) != 1 || got[0].PendingHash != want ||
			strings.Join(got[0].Fields, ",") != "machine.spec.network,"+requestField {
			t.Errorf("approve-reboot printed %s (%v); want the pending set %s with the request", cmd.out.String(), err, want)
		}
		if a := approvalOf(t, "wait-1"); a == nil || a.PendingHash != want {
			t.Errorf("wait-1's approval %+v; want the pending set with the request, %s", a, want)
		}
	})

	t.Run("the agent refreshing its status meanwhile", func(t *testing.T) {
		// The agent rewrites its status (the same pending set) while the approval is
		// written: a change of status alone must not refuse it (the lab's server machine
		// refreshed its status between approve-reboot's read and write once).
		machine(t, "wait-4")
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan int)
		go func() {
			n := 0
			defer func() { done <- n }()
			// Every 20 ms: far more often than an agent writes its status.
			for ctx.Err() == nil {
				time.Sleep(20 * time.Millisecond)
				cur, err := lc.Machine(ctx, "wait-4")
				if err != nil {
					continue
				}
				cur.Status.Reboot.Message = fmt.Sprintf("refreshed %d", n)
				cur.Status.ObservedGeneration = cur.Generation // it has seen each approval
				if _, err := lc.UpdateMachineStatus(ctx, cur); err == nil {
					n++
				}
			}
		}()
		for i := range 10 {
			// --wait: each approval is an edit the agent must see before the next.
			if code, out, errOut := run(t, append([]string{"approve-reboot", "wait-4", "--wait", "30s"}, k...)...); code != exitOK {
				stop()
				t.Fatalf("approval %d while the status changed: exit %d\n%s%s", i, code, out, errOut)
			}
		}
		stop()
		if n := <-done; n < 5 {
			t.Errorf("the status was refreshed only %d times meanwhile: the test proves little", n)
		}
	})

	t.Run("an edit of the spec meanwhile", func(t *testing.T) {
		// A change of spec between the read and the write refuses the approval: the pending
		// set it named may be gone. A change of status alone does not.
		machine(t, "wait-5")
		read, err := lc.Machine(t.Context(), "wait-5")
		if err != nil {
			t.Fatal(err)
		}
		fields := map[string]any{"pendingHash": read.Status.PendingHash, "approvedAt": metav1.Now()}
		cur := read.DeepCopy()
		cur.Status.Reboot.Message = "refreshed"
		if _, err := lc.UpdateMachineStatus(t.Context(), cur); err != nil {
			t.Fatal(err)
		}
		if err := writeApproval(t.Context(), lc, read, fields); err != nil {
			t.Fatalf("after a change of status alone: %v", err)
		}
		if a := approvalOf(t, "wait-5"); a == nil || a.PendingHash != read.Status.PendingHash {
			t.Fatalf("the approval written: %+v", a)
		}
		read, _ = lc.Machine(t.Context(), "wait-5")
		edited := read.DeepCopy()
		edited.Spec.KernelModules = []v1alpha1.KernelModule{{Name: "dummy"}}
		if _, err := lc.UpdateMachine(t.Context(), edited); err != nil {
			t.Fatal(err)
		}
		err = writeApproval(t.Context(), lc, read, map[string]any{"pendingHash": "sha256:" + strings.Repeat("a", 64), "approvedAt": metav1.Now()})
		if err == nil || !strings.Contains(err.Error(), "the Machine changed while it was being approved") {
			t.Errorf("after an edit of the spec: %v", err)
		}
		if a := approvalOf(t, "wait-5"); a == nil || a.PendingHash != read.Status.PendingHash {
			t.Errorf("the refused approval was written: %+v", a)
		}
	})

	t.Run("an agent that does not report", func(t *testing.T) {
		machine(t, "wait-2")
		if code, _, errOut := run(t, append([]string{"request-reboot", "wait-2"}, k...)...); code != exitOK {
			t.Fatalf("request-reboot: %s", errOut)
		}
		m, err := lc.Machine(t.Context(), "wait-2")
		if err != nil {
			t.Fatal(err)
		}
		what := "its reboot request of " + m.Spec.Reboot.Request.RequestedAt.UTC().Format(time.RFC3339)
		began := time.Now()
		code, _, errOut := run(t, append([]string{"approve-reboot", "wait-2", "--wait", "2s"}, k...)...)
		if code != exitFailed || !strings.Contains(errOut, "the agent on wait-2 did not see "+what+" within 2s: its status still describes generation 1 of 2, so nothing was approved") {
			t.Errorf("approve-reboot of a machine whose agent does not report: exit %d, %s", code, errOut)
		}
		if d := time.Since(began); d < 2*time.Second || d > 20*time.Second {
			t.Errorf("approve-reboot --wait 2s gave up after %s", d)
		}
		code, _, errOut = run(t, append([]string{"approve-reboot", "wait-2", "--wait", "0"}, k...)...)
		if code != exitFailed || !strings.Contains(errOut, "its agent has not seen "+what+" yet, and --wait 0 does not wait for it") {
			t.Errorf("approve-reboot --wait 0: exit %d, %s", code, errOut)
		}
		if a := approvalOf(t, "wait-2"); a != nil {
			t.Errorf("an approval was written: %+v", a)
		}
	})

	t.Run("--wait for another edit", func(t *testing.T) {
		machine(t, "wait-3")
		m, err := lc.Machine(t.Context(), "wait-3")
		if err != nil {
			t.Fatal(err)
		}
		m.Spec.NodeLabels = map[string]v1alpha1.LabelValue{"example.com/x": "y"}
		if m, err = lc.UpdateMachine(t.Context(), m); err != nil {
			t.Fatal(err)
		}
		// Without --wait, an edit that is not a reboot request is refused at once.
		code, _, errOut := run(t, append([]string{"approve-reboot", "wait-3"}, k...)...)
		if code != exitFailed || !strings.Contains(errOut, "does not describe its latest spec yet") || !strings.Contains(errOut, "--wait") {
			t.Errorf("approve-reboot of a stale status without --wait: exit %d, %s", code, errOut)
		}
		cmd := start(t, append([]string{"approve-reboot", "wait-3", "--wait", "30s"}, k...)...)
		cmd.until(t, "for the agent on wait-3 to see the last edit of its spec (its status describes generation 1 of 2)")
		labels := v1alpha1.PendingChange{Field: "machine.spec.nodeLabels", Class: v1alpha1.Reboot, To: `{"example.com/x":"y"}`, Since: network.Since}
		want := report(t, lc, m, network, labels)
		if code := cmd.wait(t); code != exitOK || !strings.Contains(cmd.out.String(), "approved wait-3: pending set "+want) {
			t.Fatalf("approve-reboot --wait: exit %d\n%s%s", code, cmd.out.String(), cmd.err.String())
		}
		if a := approvalOf(t, "wait-3"); a == nil || a.PendingHash != want {
			t.Errorf("wait-3's approval %+v; want %s", a, want)
		}
	})
}

// report writes the status the agent writes for m's generation: pending, its hash, and
// WaitingForApproval. It returns the pending hash.
func report(t *testing.T, lc *kube.Client, m *v1alpha1.Machine, pending ...v1alpha1.PendingChange) string {
	t.Helper()
	cur, err := lc.Machine(t.Context(), m.Name)
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.ObservedGeneration = cur.Generation
	cur.Status.Pending = pending
	cur.Status.PendingCount = int32(len(pending))
	cur.Status.PendingHash = change.PendingHash(pending)
	cur.Status.Reboot.State = v1alpha1.RebootWaitingForApproval
	if _, err := lc.UpdateMachineStatus(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	return cur.Status.PendingHash
}

// TestApproveRebootServersDown: --servers-down writes the servers an operator accepts as
// down into the server's approval, is refused for an agent, for a machine that is no
// server or does not exist, for the server itself and with --all, and a later approval
// without it takes it away (a merge patch would keep it).
func TestApproveRebootServersDown(t *testing.T) {
	lc, kc := adminClient(t)
	network := v1alpha1.PendingChange{Field: "machine.spec.network", Class: v1alpha1.Reboot, To: "{}", Since: metav1.NewTime(time.Now().UTC().Truncate(time.Second))}
	for _, m := range []struct {
		name string
		role v1alpha1.Role
	}{{"down-s1", v1alpha1.RoleServer}, {"down-s2", v1alpha1.RoleServer}, {"down-a1", v1alpha1.RoleAgent}} {
		made, err := lc.CreateMachine(t.Context(), &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: m.name}, Spec: v1alpha1.MachineSpec{Role: m.role}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lc.DeleteMachine(context.Background(), m.name) })
		report(t, lc, made, network)
	}
	k := []string{"--kubeconfig", kc}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"with --all", []string{"approve-reboot", "--all", "--servers-down", "down-s2"}, exitUsage, "--servers-down is for the servers named"},
		{"for an agent", []string{"approve-reboot", "down-a1", "--servers-down", "down-s2"}, exitFailed, "down-a1 is an agent"},
		{"naming an agent", []string{"approve-reboot", "down-s1", "--servers-down", "down-a1"}, exitFailed, "down-a1 is not a server"},
		{"naming no machine", []string{"approve-reboot", "down-s1", "--servers-down", "nosuch"}, exitFailed, `no Machine "nosuch"`},
		{"naming itself", []string{"approve-reboot", "down-s1", "--servers-down", "down-s1"}, exitFailed, "names down-s1 itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := run(t, append(tc.args, k...)...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, %q; want exit %d saying %q", code, errOut, tc.code, tc.want)
			}
			if m, _ := lc.Machine(t.Context(), "down-s1"); m.Spec.Reboot != nil && m.Spec.Reboot.Approval != nil {
				t.Errorf("a refused approval was written: %+v", m.Spec.Reboot.Approval)
			}
		})
	}
	approvalOf := func() *v1alpha1.RebootApproval {
		m, err := lc.Machine(t.Context(), "down-s1")
		if err != nil || m.Spec.Reboot == nil {
			t.Fatalf("down-s1: %v %+v", err, m)
		}
		return m.Spec.Reboot.Approval
	}
	if code, _, errOut := run(t, append([]string{"approve-reboot", "down-s1", "--servers-down", "down-s2"}, k...)...); code != exitOK {
		t.Fatalf("approve-reboot --servers-down: exit %d %s", code, errOut)
	}
	if a := approvalOf(); a == nil || strings.Join(a.ServersDown, ",") != "down-s2" || a.PendingHash == "" {
		t.Errorf("the approval written: %+v", a)
	}
	// The agent reports on the approved spec, and the operator approves again without it.
	cur, err := lc.Machine(t.Context(), "down-s1")
	if err != nil {
		t.Fatal(err)
	}
	report(t, lc, cur, network)
	if code, _, errOut := run(t, append([]string{"approve-reboot", "down-s1"}, k...)...); code != exitOK {
		t.Fatalf("approve-reboot: exit %d %s", code, errOut)
	}
	if a := approvalOf(); a == nil || len(a.ServersDown) != 0 {
		t.Errorf("an approval without --servers-down kept the earlier one's: %+v", a)
	}
}
