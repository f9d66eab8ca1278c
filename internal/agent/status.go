package agent

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/state"
)

// status computes the Machine's next status from what this pass did.
func (a *Agent) status(m *v1alpha1.Machine, out *outcome) v1alpha1.MachineStatus {
	s := *m.Status.DeepCopy()
	s.ObservedGeneration = m.Generation
	s.AppliedGeneration = a.st.MachineGeneration
	s.AppliedClusterGeneration = a.st.ClusterGeneration
	if a.cfg.Inventory != nil {
		s.Hardware, s.Network = a.inventoryStatus()
	}
	s.Clock = a.clockStatus()
	if bi := a.bootInfo; bi != nil && bi.Report != nil {
		s.Disks = bi.Report.DiskStatus
	}
	s.Pending = append([]v1alpha1.PendingChange(nil), a.st.Pending...)
	s.PendingCount = int32(len(s.Pending))
	s.PendingHash = change.PendingHash(s.Pending)
	if rv := out.reboot; rv != nil {
		s.Reboot.State, s.Reboot.Message = rv.state, rv.message
	}
	s.Reboot.ApprovedHash = a.st.ApprovedHash
	s.Reboot.LastRequestHandled = a.st.LastRequestHandled
	s.Reboot.LastRebootTime = a.st.LastRebootTime
	var failed *v1alpha1.FailedRelease
	var releaseRefused *releaseRefusal
	if v := out.view; v != nil {
		s.Release = v.release
		s.Upgrade = *v.status.DeepCopy()
		failed, releaseRefused = v.failed, v.releaseRefused
	}
	if out.etcdSnapshot != nil {
		s.EtcdSnapshot = out.etcdSnapshot.DeepCopy()
	}
	if !a.etcdRecordsRead {
		// Init wrote them before the agent started (both run before k3s): read once.
		a.etcdRecordsRead = true
		var err error
		if a.etcdRestore, err = state.LoadEtcdRestore(a.cfg.State.Dir); err != nil {
			a.log.Error("reading the last etcd restore", "err", err)
		}
		if a.etcdRejoin, err = state.LoadEtcdRejoin(a.cfg.State.Dir); err != nil {
			a.log.Error("reading the last etcd rejoin", "err", err)
		}
	}
	if a.etcdRestore != nil {
		s.EtcdRestore = a.etcdRestore.DeepCopy()
	}
	if a.etcdRejoin != nil {
		s.EtcdRejoin = a.etcdRejoin.DeepCopy()
	}
	if out.rebooting {
		s.Reboot.State, s.Reboot.Message = v1alpha1.RebootRebooting, "the machine is going down for its reboot"
	}
	if s.Reboot.State == "" {
		s.Reboot.State = v1alpha1.RebootNone
	}
	if s.Reboot.State != m.Status.Reboot.State || s.Reboot.Since == nil {
		now := metav1.NewTime(a.cfg.Now().UTC().Truncate(time.Second))
		s.Reboot.Since = &now
	}
	if s.Upgrade.State == "" {
		s.Upgrade.State = v1alpha1.UpgradeIdle
	}
	for _, c := range conditions(condInput{
		failures:       out.failures,
		restartPending: a.st.K3sRestartPending,
		pending:        s.Pending,
		nodeFound:      out.nodeFound,
		nodeReady:      out.nodeReady,
		nodeStale:      out.nodeStale,
		k3sUnhealthy:   out.k3sUnhealthy,
		trialFailed:    failed,
		releaseRefused: releaseRefused,
		notAppliedBoot: out.notAppliedBoot,
		preflight:      out.preflightFailed,
		disks:          s.Disks,
		roleMismatch:   out.roleMismatch,
	}) {
		c.ObservedGeneration = m.Generation
		meta.SetStatusCondition(&s.Conditions, c)
	}
	return s
}

// notRetried says a pending field's value failed its trial here and is not tried again
// (a release, or the network and k3s data disks), so it alone is no reason to reboot. The
// network and the disks boot as one: while their trial failed, neither changes at a reboot.
func (v *upgradeView) notRetried(field string) bool {
	if v == nil {
		return false
	}
	switch field {
	case "cluster.spec.version", "machine.spec.version":
		return v.status.State == v1alpha1.UpgradeFellBack
	case "machine.spec.network", "machine.spec.disks":
		return v.settingsFailed
	}
	return false
}

// whyNotRetried says why each of fields (all notRetried) asks for no reboot: it failed a
// trial here, or it waits with the network and k3s data disks that did (they boot together).
func (v *upgradeView) whyNotRetried(fields []string) string {
	var failed, held []string
	for _, f := range fields {
		if (f == "machine.spec.network" || f == "machine.spec.disks") && !slices.Contains(v.settingsFailedFields, f) {
			held = append(held, f)
		} else {
			failed = append(failed, f)
		}
	}
	var out []string
	if len(failed) > 0 {
		out = append(out, strings.Join(failed, ", ")+" failed a trial here and is not tried again until the spec changes")
	}
	if len(held) > 0 {
		out = append(out, strings.Join(held, ", ")+" waits with the settings whose trial failed (the network and k3s's data disks boot together)")
	}
	return strings.Join(out, "; ")
}

// condInput is what the conditions are computed from.
type condInput struct {
	failures       map[string]string
	restartPending bool
	pending        []v1alpha1.PendingChange
	nodeFound      bool
	nodeReady      bool
	nodeStale      string
	k3sUnhealthy   string
	// notAppliedBoot: boot-time settings init could not apply at this boot, with why.
	notAppliedBoot map[string]string
	// preflight: how the host check init makes once k3s runs failed.
	preflight string
	// disks: what init did with spec.disks at this boot.
	disks []v1alpha1.DiskStatus
	// trialFailed is the failed trial of the wanted release or kernel arguments, if any.
	trialFailed *v1alpha1.FailedRelease
	// releaseRefused: the wanted release was not written, as untrusted.
	releaseRefused *releaseRefusal
	// roleMismatch says how the role this machine booted with and its Machine's differ.
	roleMismatch string
}

// roleMismatch says how the role this machine booted with (init's, from the layer's Machine
// manifest) and its Machine's spec.role differ, and what to do; "" when they agree or init
// does not say.
func roleMismatch(booted, spec v1alpha1.Role) string {
	if booted == "" || booted == spec {
		return ""
	}
	return fmt.Sprintf("this machine booted as %[1]s, the role of its deployment layer's Machine manifest, and k3s keeps that role; but the Machine's spec.role is %[2]s. "+
		"spec.role is immutable: reinstall the machine with the %[2]s layer, or, to keep it %[1]s, delete this Machine and apply it again with spec.role %[1]s "+
		"(no server's bootstrap makes a deleted Machine again)", booted, spec)
}

// conditions computes the Machine's conditions (see api/v1alpha1/conditions.go).
func conditions(in condInput) []metav1.Condition {
	var out []metav1.Condition
	add := func(t string, ok bool, reason, msg string) {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		out = append(out, metav1.Condition{Type: t, Status: st, Reason: reason, Message: msg})
	}
	failed := failureKey(in.failures)
	switch {
	case in.roleMismatch != "":
		// Before any item: the Machine's role is not applied at all (k3s keeps its own).
		add(v1alpha1.MachineConfigApplied, false, v1alpha1.ReasonRoleMismatch, in.roleMismatch)
	case failed != "":
		add(v1alpha1.MachineConfigApplied, false, v1alpha1.ReasonApplyFailed, "could not apply: "+failed)
	case in.restartPending:
		add(v1alpha1.MachineConfigApplied, false, v1alpha1.ReasonRestartingK3s, "k3s configuration changed; k3s restarts in place")
	default:
		add(v1alpha1.MachineConfigApplied, true, v1alpha1.ReasonApplied, "every live and k3s change is applied")
	}
	if len(in.pending) > 0 {
		var f []string
		for _, p := range in.pending {
			f = append(f, fmt.Sprintf("%s (%s)", p.Field, p.Class))
		}
		sort.Strings(f)
		add(v1alpha1.MachineRebootPending, true, v1alpha1.ReasonChangesStaged, "staged: "+strings.Join(f, ", "))
	} else {
		add(v1alpha1.MachineRebootPending, false, v1alpha1.ReasonNothingPending, "nothing is staged")
	}
	if f := in.trialFailed; f != nil {
		msg := f.Message
		if f.Version != "" {
			msg = fmt.Sprintf("release %s (%s): %s", f.Version, f.Digest, f.Message)
		}
		add(v1alpha1.MachineUpgradeFailed, true, f.Reason, msg)
	} else {
		add(v1alpha1.MachineUpgradeFailed, false, v1alpha1.ReasonCommitted, "no trial of the wanted release or kernel arguments has failed")
	}
	switch {
	case in.roleMismatch != "":
		add(v1alpha1.MachineDegraded, true, v1alpha1.ReasonRoleMismatch, in.roleMismatch)
	case failed != "":
		add(v1alpha1.MachineDegraded, true, v1alpha1.ReasonApplyFailed, "could not apply: "+failed)
	case in.trialFailed != nil:
		add(v1alpha1.MachineDegraded, true, in.trialFailed.Reason, "a trial failed: see the UpgradeFailed condition")
	case in.releaseRefused != nil:
		// The machine runs on what it has; the release it was asked for is what failed.
		add(v1alpha1.MachineDegraded, true, in.releaseRefused.Reason, in.releaseRefused.message+"; this machine keeps running what it runs")
	case in.preflight != "":
		add(v1alpha1.MachineDegraded, true, v1alpha1.ReasonPreflightFailed, in.preflight)
	case len(notReady(in.disks)) > 0:
		add(v1alpha1.MachineDegraded, true, v1alpha1.ReasonDiskRefused, "disks not ready, left untouched or failed (see status.disks): "+strings.Join(notReady(in.disks), "; "))
	case len(in.notAppliedBoot) > 0:
		var f []string
		for field, why := range in.notAppliedBoot {
			f = append(f, field+": "+why)
		}
		sort.Strings(f)
		add(v1alpha1.MachineDegraded, true, v1alpha1.ReasonNotAppliedAtBoot, "init could not apply at this boot (still pending): "+strings.Join(f, "; "))
	default:
		add(v1alpha1.MachineDegraded, false, v1alpha1.ReasonHealthy, "nothing has failed")
	}
	switch {
	case in.k3sUnhealthy != "":
		add(v1alpha1.MachineReady, false, v1alpha1.ReasonK3sNotReady, in.k3sUnhealthy)
	case !in.nodeFound:
		add(v1alpha1.MachineReady, false, v1alpha1.ReasonNodeNotReady, "the Node is not registered yet")
	case in.nodeStale != "":
		add(v1alpha1.MachineReady, false, v1alpha1.ReasonNodeNotReady, in.nodeStale)
	case !in.nodeReady:
		add(v1alpha1.MachineReady, false, v1alpha1.ReasonNodeNotReady, "the Node is not Ready")
	case failed != "" || in.restartPending:
		add(v1alpha1.MachineReady, false, v1alpha1.ReasonReconciling, "the agent has not applied the current spec")
	default:
		add(v1alpha1.MachineReady, true, v1alpha1.ReasonReady, "node Ready and spec applied")
	}
	return out
}

// notReady names each disk init did not make ready, with its reason.
func notReady(disks []v1alpha1.DiskStatus) []string {
	var out []string
	for _, d := range disks {
		if d.Phase != v1alpha1.DiskReady {
			out = append(out, fmt.Sprintf("%s %s (%s)", d.Device, d.Phase, d.Reason))
		}
	}
	return out
}
