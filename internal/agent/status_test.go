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
		{"preflight failed", condInput{nodeFound: true, nodeReady: true, preflight: "iptables: resolves to a script"}, map[string]string{
			"Degraded": "True/PreflightFailed", "Ready": "True/Ready"}},
		{"disk refused", condInput{nodeFound: true, nodeReady: true, disks: []v1alpha1.DiskStatus{{Device: "/dev/vdb", Phase: v1alpha1.DiskReady}, {Device: "/dev/vdc", Phase: v1alpha1.DiskRefused, Reason: v1alpha1.DiskHoldsData}},
			notAppliedBoot: map[string]string{"machine.spec.disks": "not ready"}}, map[string]string{
			"Degraded": "True/DiskRefused", "Ready": "True/Ready"}},
		{"disks ready", condInput{nodeFound: true, nodeReady: true, disks: []v1alpha1.DiskStatus{{Device: "/dev/vdb", Phase: v1alpha1.DiskReady}}}, map[string]string{
			"Degraded": "False/Healthy"}},
		{"release refused", condInput{nodeFound: true, nodeReady: true, releaseRefused: &releaseRefusal{digest: "sha256:x", Reason: v1alpha1.ReasonReleaseNotSigned, message: "release v is not written: ..."}}, map[string]string{
			"Degraded": "True/ReleaseNotSigned", "UpgradeFailed": "False/Committed", "Ready": "True/Ready"}},
		{"a failed trial says more than a refusal", condInput{nodeFound: true, nodeReady: true, releaseRefused: &releaseRefusal{Reason: v1alpha1.ReasonReleaseVerifyFailed, message: "m"},
			trialFailed: &v1alpha1.FailedRelease{Reason: v1alpha1.ReasonWatchdog, Message: "reset"}}, map[string]string{
			"Degraded": "True/Watchdog", "UpgradeFailed": "True/Watchdog"}},
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

// TestRebootView: what a machine says of its reboot, and whether it may reboot, from its
// pending set, policy, approval and the coordinator's records.
func TestRebootView(t *testing.T) {
	t0 := time.Unix(1785000000, 0)
	reboot := []v1alpha1.PendingChange{{Field: "machine.spec.network", Class: v1alpha1.Reboot}}
	nextBoot := []v1alpha1.PendingChange{{Field: "machine.spec.kernelArgs", Class: v1alpha1.NextBoot}}
	hash := change.PendingHash(reboot)
	approval := func(h string) *v1alpha1.RebootControl {
		return &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: h, ApprovedBy: "ops", ApprovedAt: &metav1.Time{Time: t0}}}
	}
	auto, manual := v1alpha1.RebootAuto, v1alpha1.RebootManual
	turn := func(phase v1alpha1.TurnPhase, h string) []v1alpha1.Turn {
		return []v1alpha1.Turn{{Machine: "m1", PendingHash: h, Phase: phase, Since: metav1.NewTime(t0)}}
	}
	healthy := &outcome{nodeReady: true, failures: map[string]string{}}
	for _, tt := range []struct {
		name      string
		spec      v1alpha1.MachineSpec
		cluster   v1alpha1.ClusterSpec
		status    v1alpha1.ClusterStatus
		pending   []v1alpha1.PendingChange
		st        state.State
		out       *outcome
		want      v1alpha1.RebootState
		mayReboot bool
		says      string
	}{
		{name: "nothing pending", want: v1alpha1.RebootNone},
		{name: "only NextBoot pending asks for no reboot", pending: nextBoot, want: v1alpha1.RebootNone},
		{name: "Manual without approval", pending: reboot, want: v1alpha1.RebootWaitingForApproval, says: "approve pending set " + hash},
		{name: "an approval of another set is stale", pending: reboot, spec: v1alpha1.MachineSpec{Reboot: approval("sha256:old")},
			want: v1alpha1.RebootWaitingForApproval, says: "stale"},
		{name: "approved: waits for a turn", pending: reboot, spec: v1alpha1.MachineSpec{Reboot: approval(hash)},
			status: v1alpha1.ClusterStatus{Coordinator: "s1", Waiting: []v1alpha1.WaitingMachine{{Machine: "m1", Reason: "the disruption budget allows 1"}}},
			want:   v1alpha1.RebootWaitingForTurn, says: "(approved by ops); waiting for a disruption-budget turn: the disruption budget allows 1"},
		{name: "no coordinator yet is said", pending: reboot, spec: v1alpha1.MachineSpec{Reboot: approval(hash)},
			want: v1alpha1.RebootWaitingForTurn, says: "no coordinator"},
		{name: "Auto needs no approval", pending: reboot, spec: v1alpha1.MachineSpec{RebootPolicy: &auto},
			want: v1alpha1.RebootWaitingForTurn, says: "rebootPolicy is Auto"},
		{name: "Cluster Auto", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto}, want: v1alpha1.RebootWaitingForTurn},
		{name: "Machine Manual overrides Cluster Auto", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto},
			spec: v1alpha1.MachineSpec{RebootPolicy: &manual}, want: v1alpha1.RebootWaitingForApproval},
		{name: "Auto never reboots twice for one set", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto},
			st: state.State{ApprovedHash: hash}, want: v1alpha1.RebootWaitingForApproval, says: "happened already"},
		{name: "a used approval does not count again", pending: reboot, spec: v1alpha1.MachineSpec{Reboot: approval(hash)},
			st: state.State{ApprovedHash: hash, ApprovedAt: &metav1.Time{Time: t0}}, want: v1alpha1.RebootWaitingForApproval},
		{name: "a turn being drained", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto}, status: v1alpha1.ClusterStatus{Turns: turn(v1alpha1.TurnDraining, hash)},
			want: v1alpha1.RebootDraining, says: "cordons the Node"},
		{name: "a drained turn for this set: reboot", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto}, status: v1alpha1.ClusterStatus{Turns: turn(v1alpha1.TurnDrained, hash)},
			want: v1alpha1.RebootDraining, mayReboot: true},
		{name: "a drained turn for another set: no reboot", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto}, status: v1alpha1.ClusterStatus{Turns: turn(v1alpha1.TurnDrained, "sha256:old")},
			want: v1alpha1.RebootWaitingForTurn},
		{name: "a drained turn under Manual without approval: no reboot", pending: reboot, status: v1alpha1.ClusterStatus{Turns: turn(v1alpha1.TurnDrained, hash)},
			want: v1alpha1.RebootWaitingForApproval},
		{name: "a blocked drain holds it back until its retry time", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto},
			status: v1alpha1.ClusterStatus{DrainBlocked: []v1alpha1.DrainBlock{{Machine: "m1", PendingHash: hash, RetryAt: metav1.NewTime(t0.Add(time.Minute)), Message: "pod x/y: PodDisruptionBudget x/pdb"}}},
			want:   v1alpha1.RebootDrainBlocked, says: "PodDisruptionBudget x/pdb"},
		{name: "after the retry time it waits for a turn again", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto},
			status: v1alpha1.ClusterStatus{DrainBlocked: []v1alpha1.DrainBlock{{Machine: "m1", PendingHash: hash, RetryAt: metav1.NewTime(t0.Add(-time.Second))}}},
			want:   v1alpha1.RebootWaitingForTurn},
		{name: "back from the reboot, not healthy: verifying", status: v1alpha1.ClusterStatus{Turns: turn(v1alpha1.TurnDrained, hash)},
			out: &outcome{failures: map[string]string{}}, want: v1alpha1.RebootVerifying, says: "Node is not Ready"},
		{name: "back from the reboot and healthy", status: v1alpha1.ClusterStatus{Turns: turn(v1alpha1.TurnDrained, hash)},
			out: healthy, want: v1alpha1.RebootNone, says: "takes the turn back"},
		{name: "a change that fails to apply does not hold the turn", status: v1alpha1.ClusterStatus{Turns: turn(v1alpha1.TurnDrained, hash)},
			out: &outcome{nodeReady: true, failures: map[string]string{"sysctl vm.x": "no such key"}}, want: v1alpha1.RebootNone},
		{name: "a turn an operator gave back does not reboot", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto},
			status: v1alpha1.ClusterStatus{Turns: []v1alpha1.Turn{{Machine: "m1", PendingHash: hash, Phase: v1alpha1.TurnDrained, Since: metav1.NewTime(t0), ReleasedBy: "ops"}}},
			want:   v1alpha1.RebootWaitingForTurn},
		{name: "a turn wins over a block the machine's clock still sees", pending: reboot, cluster: v1alpha1.ClusterSpec{RebootPolicy: auto},
			status: v1alpha1.ClusterStatus{Turns: turn(v1alpha1.TurnDraining, hash),
				DrainBlocked: []v1alpha1.DrainBlock{{Machine: "m1", PendingHash: hash, RetryAt: metav1.NewTime(t0.Add(time.Minute))}}},
			want: v1alpha1.RebootDraining},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st
			a := &Agent{st: &st, cfg: Config{Machine: "m1", Boot: supervisor.Client{}, Now: func() time.Time { return t0 }}}
			out := tt.out
			if out == nil {
				out = &outcome{failures: map[string]string{}}
			}
			m := &v1alpha1.Machine{Spec: tt.spec}
			c := &v1alpha1.Cluster{Spec: tt.cluster, Status: tt.status}
			rv := a.rebootView(m, c, tt.pending, change.PendingHash(tt.pending), out)
			if rv.state != tt.want || rv.mayReboot != tt.mayReboot || !strings.Contains(rv.message, tt.says) {
				t.Errorf("got %s (may reboot %v): %q; want %s (may reboot %v) saying %q", rv.state, rv.mayReboot, rv.message, tt.want, tt.mayReboot, tt.says)
			}
		})
	}
	a := &Agent{st: &state.State{}, cfg: Config{Machine: "m1", Now: time.Now}}
	rv := a.rebootView(&v1alpha1.Machine{Spec: v1alpha1.MachineSpec{Reboot: approval(hash)}}, &v1alpha1.Cluster{}, reboot, hash, &outcome{})
	if rv.state != v1alpha1.RebootNone || !strings.Contains(rv.message, "liken cannot reboot it") {
		t.Errorf("without boot control a machine asks for a turn: %s %q", rv.state, rv.message)
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
