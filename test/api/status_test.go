package api

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func machineStatus() map[string]any {
	return map[string]any{
		"release": map[string]any{"version": "2026.07.20-001", "slot": "A", "lastGoodSlot": "A"},
		"pending": []any{map[string]any{
			"field": "machine.spec.network", "class": "Reboot", "from": "{}", "to": `{"interfaces":[]}`,
			"since": "2026-11-29T10:00:00Z",
		}},
		"pendingCount": int64(1),
		"pendingHash":  "sha256:" + strings.Repeat("0", 64),
		"reboot":       map[string]any{"state": "WaitingForApproval"},
		"upgrade":      map[string]any{"state": "Staged", "wantedVersion": "2026.08.01-001"},
		"conditions": []any{map[string]any{
			"type": "Ready", "status": "True", "reason": "Ready", "message": "k3s healthy, node Ready",
			"lastTransitionTime": "2026-11-29T10:00:00Z",
		}},
	}
}

// TestStatusOnlyThroughSubresource: an update of the main resource cannot write status, the
// status subresource can, and only spec changes bump metadata.generation.
func TestStatusOnlyThroughSubresource(t *testing.T) {
	c := dyn(t)
	res := c.Resource(machinesGVR)
	m := createFresh(t, c, examples(t)["server-2"], "status-test")
	if m.GetGeneration() != 1 {
		t.Fatalf("new Machine has generation %d, want 1", m.GetGeneration())
	}

	withStatus := m.DeepCopy()
	set(t, withStatus, machineStatus(), "status")
	got, err := res.Update(ctx(t), withStatus, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, found, _ := unstructured.NestedMap(got.Object, "status", "release"); found {
		t.Errorf("an update of the main resource wrote status")
	}
	if got.GetGeneration() != 1 {
		t.Errorf("a status-only update bumped generation to %d", got.GetGeneration())
	}

	set(t, got, machineStatus(), "status")
	got, err = res.UpdateStatus(ctx(t), got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("writing status through the subresource: %v", err)
	}
	if slot, _, _ := unstructured.NestedString(got.Object, "status", "release", "slot"); slot != "A" {
		t.Errorf("status.release.slot = %q after UpdateStatus, want A", slot)
	}
	if got.GetGeneration() != 1 {
		t.Errorf("a status write bumped generation to %d", got.GetGeneration())
	}

	set(t, got, "agent-only", "spec.nodeLabels.pool")
	set(t, got, "Manual", "status.release.slot") // ignored: spec update
	got, err = res.Update(ctx(t), got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetGeneration() != 2 {
		t.Errorf("a spec change left generation at %d, want 2", got.GetGeneration())
	}
	if slot, _, _ := unstructured.NestedString(got.Object, "status", "release", "slot"); slot != "A" {
		t.Errorf("a spec update changed status.release.slot to %q", slot)
	}

	// The status subresource cannot change spec either.
	set(t, got, "server", "spec.role")
	set(t, got, "changed-by-status", "spec.nodeLabels.pool")
	got, err = res.UpdateStatus(ctx(t), got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, _, _ := unstructured.NestedString(got.Object, "spec", "nodeLabels", "pool"); v != "agent-only" {
		t.Errorf("a status update changed spec.nodeLabels.pool to %q", v)
	}

	// Status is validated too.
	set(t, got, "C", "status.release.slot")
	if _, err := res.UpdateStatus(ctx(t), got, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), `Unsupported value: "C"`) {
		t.Errorf("status with slot C: got %v, want Unsupported value", err)
	}
}
