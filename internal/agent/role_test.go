package agent

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
)

// TestRoleMismatch: a machine installed with the agent layer whose Machine in the API says
// server (a reinstall with another role) reports it on the Machine, ConfigApplied False and
// Degraded True with RoleMismatch and the fix, with one Warning Event per boot, and the
// Cluster's Degraded names it; a machine whose roles agree beside it reports nothing of the
// kind.
func TestRoleMismatch(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"role1": v1alpha1.RoleServer, "role2": v1alpha1.RoleAgent})
	// Init started k3s as an agent on both: the role of their layer's Machine manifest.
	boot1, boot2 := f.bootedOnClusterRelease(t), f.bootedOnClusterRelease(t)
	boot1.info.Role, boot2.info.Role = v1alpha1.RoleAgent, v1alpha1.RoleAgent
	s1 := f.running(t, "role1", boot1)
	f.running(t, "role2", boot2)

	reported := func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		for _, typ := range []string{v1alpha1.MachineConfigApplied, v1alpha1.MachineDegraded} {
			c := meta.FindStatusCondition(m.Status.Conditions, typ)
			if c == nil || c.Reason != v1alpha1.ReasonRoleMismatch || (c.Status == metav1.ConditionTrue) != (typ == v1alpha1.MachineDegraded) ||
				!strings.Contains(c.Message, "booted as agent") || !strings.Contains(c.Message, "spec.role is server") ||
				!strings.Contains(c.Message, "reinstall the machine with the server layer") {
				return false
			}
		}
		return true
	}
	f.waitFor(t, "role1", "ConfigApplied False and Degraded True with RoleMismatch", reported)
	f.waitFor(t, "role2", "its status written", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return len(m.Status.Conditions) > 0 })
	if m, _ := f.liken.Machine(t.Context(), "role2"); m != nil {
		for _, c := range m.Status.Conditions {
			if c.Reason == v1alpha1.ReasonRoleMismatch {
				t.Errorf("role2 booted with its Machine's role and reports %s %s: %s", c.Type, c.Reason, c.Message)
			}
		}
	}
	f.waitCluster(t, "the Cluster's Degraded naming role1 alone", func(c *v1alpha1.Cluster) bool {
		d := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ClusterDegraded)
		return d != nil && d.Status == metav1.ConditionTrue && d.Reason == v1alpha1.ReasonRoleMismatch &&
			strings.Contains(d.Message, "role1") && !strings.Contains(d.Message, "role2")
	})
	f.waitRoleEvents(t, "role1", 1)
	// k3s goes on with the role it booted with: its files are an agent's, never restarted
	// into a server's.
	if b, err := os.ReadFile(s1.paths.Config); err != nil || strings.Contains(string(b), "write-kubeconfig-mode") {
		t.Errorf("k3s's config on the machine booted as an agent (%v):\n%s", err, b)
	}
	if n := s1.restarts(); n != 0 {
		t.Errorf("k3s restarted %d times on the machine booted as an agent", n)
	}

	// The agent starting again on the same boot says nothing new; the next boot says it again.
	s1.stop()
	s1.start(t)
	// The status from before the restart still says RoleMismatch: what shows the new agent
	// had its say is a pass of its own, and the Events it recorded by then sent.
	s1.reconciled(t, "the Machine and the Cluster", nil)
	s1.eventsSent(t)
	f.waitFor(t, "role1", "RoleMismatch still reported after the agent's restart", reported)
	f.waitRoleEvents(t, "role1", 1)
	s1.comeBack(t, boot1, "boot-2")
	f.waitRoleEvents(t, "role1", 2)
	f.waitFor(t, "role1", "RoleMismatch reported on the next boot", reported)
}

// waitCluster polls the Cluster until ok holds, failing with its last conditions.
func (f *fixture) waitCluster(t *testing.T, what string, ok func(*v1alpha1.Cluster) bool) {
	t.Helper()
	var last *v1alpha1.Cluster
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := f.liken.Cluster(ctx)
		if err != nil {
			return false, nil
		}
		last = c
		return ok(c), nil
	})
	if err != nil {
		t.Fatalf("%s never happened; the Cluster's conditions: %+v", what, last.Status.Conditions)
	}
}

// waitRoleEvents waits until the Machine's RoleMismatch Warning Events number n, and fails
// at once if there are more.
func (f *fixture) waitRoleEvents(t *testing.T, name string, n int) {
	t.Helper()
	m, err := f.liken.Machine(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	var got []corev1.Event
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := f.admin.CoreV1().Events(authority.EventNamespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + name + ",involvedObject.uid=" + string(m.UID) + ",reason=" + v1alpha1.ReasonRoleMismatch})
		if err != nil {
			return false, nil
		}
		got = list.Items
		if len(got) > n {
			return false, context.Canceled
		}
		return len(got) == n, nil
	})
	if err != nil {
		var msgs []string
		for _, e := range got {
			msgs = append(msgs, e.Type+": "+e.Message)
		}
		t.Fatalf("%s: %d RoleMismatch Events, want %d: %q", name, len(got), n, msgs)
	}
	for _, e := range got {
		if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "spec.role is server") {
			t.Errorf("%s: RoleMismatch Event %s: %s", name, e.Type, e.Message)
		}
	}
}
