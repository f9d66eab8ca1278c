package agent

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

func TestConditions(t *testing.T) {
	pending := []v1alpha1.PendingChange{{Field: "machine.spec.network", Class: v1alpha1.Reboot}}
	tests := []struct {
		name string
		in   condInput
		want map[string]string // type → status/reason
	}{
		{"all good", condInput{nodeFound: true, nodeReady: true}, map[string]string{
			"ConfigApplied": "True/Applied", "RebootPending": "False/NothingPending", "Degraded": "False/Healthy", "Ready": "True/Ready",
			"UpgradeFailed": "False/Committed"}},
		{"trial failed", condInput{nodeFound: true, nodeReady: true, trialFailed: &v1alpha1.FailedRelease{Digest: "sha256:x", Version: "v", Reason: v1alpha1.ReasonKernelPanic, Message: "the kernel panicked"}}, map[string]string{
			"UpgradeFailed": "True/KernelPanic", "Degraded": "True/KernelPanic", "Ready": "True/Ready"}},
		{"item failed", condInput{failures: map[string]string{"sysctl x": "no"}, nodeFound: true, nodeReady: true}, map[string]string{
			"ConfigApplied": "False/ApplyFailed", "Degraded": "True/ApplyFailed", "Ready": "False/Reconciling"}},
		{"restart pending", condInput{restartPending: true, nodeFound: true, nodeReady: true}, map[string]string{
			"ConfigApplied": "False/RestartingK3s", "Ready": "False/Reconciling"}},
		{"staged", condInput{pending: pending, nodeFound: true, nodeReady: true}, map[string]string{
			"RebootPending": "True/ChangesStaged", "Ready": "True/Ready", "ConfigApplied": "True/Applied"}},
		{"no node", condInput{}, map[string]string{"Ready": "False/NodeNotReady"}},
		{"k3s unhealthy", condInput{nodeFound: true, nodeReady: true, k3sUnhealthy: "answered 503"}, map[string]string{"Ready": "False/K3sNotReady"}},
		{"node not ready", condInput{nodeFound: true}, map[string]string{"Ready": "False/NodeNotReady"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[string]string{}
			for _, c := range conditions(tt.in) {
				got[c.Type] = string(c.Status) + "/" + c.Reason
				if c.Message == "" {
					t.Errorf("%s has no message", c.Type)
				}
			}
			if len(got) != 5 {
				t.Errorf("got %d conditions, want 5", len(got))
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %s, want %s", k, got[k], v)
				}
			}
		})
	}
}

func TestRebootState(t *testing.T) {
	m := &v1alpha1.Machine{}
	reboot := []v1alpha1.PendingChange{{Field: "machine.spec.network", Class: v1alpha1.Reboot}}
	nextBoot := []v1alpha1.PendingChange{{Field: "machine.spec.kernelArgs", Class: v1alpha1.NextBoot}}
	if s, _ := rebootState(m, "", nil, ""); s != v1alpha1.RebootNone {
		t.Errorf("nothing pending: %s", s)
	}
	if s, _ := rebootState(m, "", nextBoot, "sha256:x"); s != v1alpha1.RebootNone {
		t.Errorf("only NextBoot pending asks for no reboot: %s", s)
	}
	if s, _ := rebootState(m, "", reboot, "sha256:x"); s != v1alpha1.RebootWaitingForApproval {
		t.Errorf("Manual without approval: %s", s)
	}
	m.Spec.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: "sha256:old", ApprovedAt: &metav1.Time{}}}
	if s, _ := rebootState(m, "", reboot, "sha256:x"); s != v1alpha1.RebootWaitingForApproval {
		t.Errorf("an approval of another set counted: %s", s)
	}
	m.Spec.Reboot.Approval.PendingHash = "sha256:x"
	if s, _ := rebootState(m, "", reboot, "sha256:x"); s != v1alpha1.RebootWaitingForTurn {
		t.Errorf("approved: %s", s)
	}
	auto := v1alpha1.RebootAuto
	m2 := &v1alpha1.Machine{Spec: v1alpha1.MachineSpec{RebootPolicy: &auto}}
	if s, _ := rebootState(m2, "", reboot, "sha256:x"); s != v1alpha1.RebootWaitingForTurn {
		t.Errorf("Auto: %s", s)
	}
	if s, _ := rebootState(&v1alpha1.Machine{}, v1alpha1.RebootAuto, reboot, "sha256:x"); s != v1alpha1.RebootWaitingForTurn {
		t.Errorf("Cluster Auto: %s", s)
	}
	manual := v1alpha1.RebootManual
	if s, _ := rebootState(&v1alpha1.Machine{Spec: v1alpha1.MachineSpec{RebootPolicy: &manual}}, v1alpha1.RebootAuto, reboot, "sha256:x"); s != v1alpha1.RebootWaitingForApproval {
		t.Errorf("Machine Manual overriding Cluster Auto: %s", s)
	}
}

// TestReleasePendingNamesDigests: the pending release entry, and so the hash an approval
// binds to, changes when a version is pinned to another digest, even the running version.
func TestReleasePendingNamesDigests(t *testing.T) {
	d := func(c byte) v1alpha1.Digest { return v1alpha1.Digest("sha256:" + strings.Repeat(string(c), 64)) }
	a := &Agent{st: &state.State{}, cfg: Config{Now: time.Now},
		bootInfo: &supervisor.BootInfo{Slot: "A", Slots: bootloader.Slots{"A": {Version: "2026.01.01-001", Digest: string(d('a'))}}}}
	cluster := func(version string, pins map[string]v1alpha1.Digest) *v1alpha1.Cluster {
		return &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{Version: v1alpha1.ReleaseVersion(version), Releases: pins}}
	}
	m := &v1alpha1.Machine{}
	other := v1alpha1.PendingChange{Field: "machine.spec.network", Class: v1alpha1.Reboot, To: "{}"}
	hash := func(c *v1alpha1.Cluster, m *v1alpha1.Machine) (string, []v1alpha1.PendingChange) {
		p := a.releasePending([]v1alpha1.PendingChange{other}, m, c)
		return change.PendingHash(p), p
	}
	running, p := hash(cluster("2026.01.01-001", map[string]v1alpha1.Digest{"2026.01.01-001": d('a')}), m)
	if len(p) != 1 {
		t.Errorf("running the wanted release: pending %+v; want only the network", p)
	}
	h1, p := hash(cluster("2026.02.01-001", map[string]v1alpha1.Digest{"2026.02.01-001": d('b')}), m)
	if len(p) != 2 || p[1].Field != "cluster.spec.version" || p[1].To != `"2026.02.01-001@`+string(d('b'))+`"` {
		t.Fatalf("pending %+v", p)
	}
	h2, _ := hash(cluster("2026.02.01-001", map[string]v1alpha1.Digest{"2026.02.01-001": d('c')}), m)
	repinned, p := hash(cluster("2026.01.01-001", map[string]v1alpha1.Digest{"2026.01.01-001": d('c')}), m)
	if h1 == h2 || h1 == running || repinned == running || len(p) != 2 {
		t.Errorf("hashes: running %s, v2@b %s, v2@c %s, running version re-pinned %s (pending %+v); want all different", running, h1, h2, repinned, p)
	}
	m.Spec.Version = "2026.02.01-001"
	_, p = hash(cluster("2026.01.01-001", map[string]v1alpha1.Digest{"2026.01.01-001": d('a'), "2026.02.01-001": d('b')}), m)
	if len(p) != 2 || p[1].Field != "machine.spec.version" {
		t.Errorf("a Machine's own version: pending %+v", p)
	}
}

func TestApprovalUsedOnce(t *testing.T) {
	at := &metav1.Time{Time: time.Unix(1785000000, 0)}
	later := &metav1.Time{Time: time.Unix(1785000600, 0)}
	tests := []struct {
		name             string
		usedHash         string
		usedAt, approved *metav1.Time
		want             bool
	}{
		{"the approval acted on", "sha256:x", at, at, true},
		{"the same set approved again later", "sha256:x", at, later, false},
		{"without approvedAt, acted on", "sha256:x", nil, nil, true},
		{"without approvedAt, a new one with it", "sha256:x", nil, at, false},
		{"another set", "sha256:y", at, at, false},
		{"none acted on yet", "", nil, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &Agent{st: &state.State{ApprovedHash: tt.usedHash, ApprovedAt: tt.usedAt}}
			m := &v1alpha1.Machine{Spec: v1alpha1.MachineSpec{Reboot: &v1alpha1.RebootControl{
				Approval: &v1alpha1.RebootApproval{PendingHash: "sha256:x", ApprovedAt: tt.approved}}}}
			if got := a.approvalUsed(m); got != tt.want {
				t.Errorf("approvalUsed = %v, want %v", got, tt.want)
			}
		})
	}
}
