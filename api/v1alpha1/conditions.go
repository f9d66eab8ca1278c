package v1alpha1

// Condition types and reasons. Code decides from these; people read them with
// `kubectl describe`. Each reason is CamelCase and says why the condition has its status.
// Every reason the agent or the coordinator sets is declared here and has a row in
// docs/troubleshoot.md, and none is declared that nothing sets: conditions_test.go reads the
// source to hold both.

// Machine condition types.
const (
	// MachineReady is True when k3s is healthy, the Node is Ready and the agent has
	// reconciled the current spec.
	MachineReady = "Ready"
	// MachineConfigApplied is True when every Live and RestartK3s change of the current
	// spec has been applied (NextBoot and Reboot changes are reported by RebootPending).
	MachineConfigApplied = "ConfigApplied"
	// MachineRebootPending is True when status.pending holds staged changes or a reboot
	// request; its message names the fields.
	MachineRebootPending = "RebootPending"
	// MachineDegraded is True when something the machine should do has failed and needs an
	// operator: an item that cannot be applied, an unpinned version, a failed trial.
	MachineDegraded = "Degraded"
	// MachineUpgradeFailed is True when the last trial of a release failed and the machine
	// fell back to its last good slot.
	MachineUpgradeFailed = "UpgradeFailed"
)

// Machine condition reasons.
const (
	// ReasonReady: k3s healthy, node Ready, spec reconciled.
	ReasonReady = "Ready"
	// ReasonK3sNotReady: k3s does not answer its readiness check.
	ReasonK3sNotReady = "K3sNotReady"
	// ReasonNodeNotReady: the Node's Ready condition is not True.
	ReasonNodeNotReady = "NodeNotReady"
	// ReasonReconciling: the agent has not yet applied the current spec.
	ReasonReconciling = "Reconciling"

	// ReasonApplied: every live change is applied.
	ReasonApplied = "Applied"
	// ReasonApplyFailed: one or more items could not be applied; the message names them.
	ReasonApplyFailed = "ApplyFailed"
	// ReasonRestartingK3s: k3s is being restarted to apply rendered configuration.
	ReasonRestartingK3s = "RestartingK3s"
	// ReasonNotAppliedAtBoot: init could not apply a boot-time setting (network, kernel
	// modules) at the last boot; it stays pending, and the message says why.
	ReasonNotAppliedAtBoot = "NotAppliedAtBoot"
	// ReasonPreflightFailed: a host check k3s needs failed at this boot (iptables through
	// k3s's PATH reaches no program); the message says which.
	ReasonPreflightFailed = "PreflightFailed"
	// ReasonDiskRefused: init left a disk of spec.disks untouched, or could not prepare it;
	// status.disks says which, what it found and what the spec wants.
	ReasonDiskRefused = "DiskRefused"
	// ReasonRoleMismatch: the machine booted with another role than its Machine's
	// spec.role (installed with the other role's layer): k3s keeps the layer's role and the
	// agent renders k3s's files for it. spec.role is immutable, so the fix is a reinstall
	// with the right layer, or the Machine deleted and made again with the role it runs. On
	// the Cluster's Degraded, the message names the machines.
	ReasonRoleMismatch = "RoleMismatch"

	// ReasonNothingPending: no staged change and no reboot request.
	ReasonNothingPending = "NothingPending"
	// ReasonChangesStaged: changes or an operator's reboot request (pending like a change)
	// wait for the next boot or a reboot; the message names them.
	ReasonChangesStaged = "ChangesStaged"

	// ReasonHealthy: nothing is degraded (a Machine's or the Cluster's Degraded).
	ReasonHealthy = "Healthy"
	// ReasonReleaseVerifyFailed: a downloaded file of the wanted release did not match its
	// pin; an Event, and Degraded until a download of it passes. The agent tries again.
	ReasonReleaseVerifyFailed = "ReleaseVerifyFailed"
	// ReasonReleaseNotSigned: the pinned release is not what the channel's keys signed (or
	// the signed metadata failed a check, or the Cluster names no channel root and does not
	// take the channel unsigned); nothing of it is downloaded. An Event, and Degraded until
	// the release is written; the agent checks again later, and the machine keeps running
	// what it runs.
	ReasonReleaseNotSigned = "ReleaseNotSigned"

	// ReasonKernelPanic, ReasonInitFailed, ReasonWatchdog, ReasonHealthDeadline and
	// ReasonBootInterrupted say why a trial boot failed.
	ReasonKernelPanic     = "KernelPanic"
	ReasonInitFailed      = "InitFailed"
	ReasonWatchdog        = "Watchdog"
	ReasonHealthDeadline  = "HealthDeadline"
	ReasonBootInterrupted = "BootInterrupted"
	// ReasonGateFailed: after its reboot, a machine's gates (spec.rollout.gates, or the
	// workloads that ran on it) failed or did not pass in time: an Event, the reason of
	// the failure the coordinator records in status.rollout.gateFailures, and, when the
	// trial ended for it (spec.rollout.commitAfterGates), of UpgradeFailed.
	ReasonGateFailed = "GateFailed"
	// ReasonPeersUnreachable: a server's trial of new network settings was healthy by its
	// own account, but no other machine reached it on the new network in time; the agent
	// ended the trial before its deadline.
	ReasonPeersUnreachable = "PeersUnreachable"
	// ReasonTrialFailed is used when the machine knows only that the trial did not commit.
	ReasonTrialFailed = "TrialFailed"
	// ReasonCommitted: the last trial passed and became the default slot.
	ReasonCommitted = "Committed"
)

// Cluster condition types.
const (
	// ClusterAvailable is True when no more machines are unavailable than the budget allows.
	ClusterAvailable = "Available"
	// ClusterProgressing is True while machines move to spec.version or apply staged changes.
	ClusterProgressing = "Progressing"
	// ClusterDegraded is True when a machine failed a trial, a drain was blocked, a turn is
	// held by a machine that does not come back, a machine runs another role than its
	// Machine's, or the maintenance windows cannot be read.
	ClusterDegraded = "Degraded"
	// ClusterRolloutPaused is True while spec.rollout.paused stops new reboot turns, or
	// the coordinator halted the rollout after spec.rollout.maxFailures failed trials; its
	// message says who paused, when and why, or which machines failed what.
	ClusterRolloutPaused = "RolloutPaused"
	// ClusterControlPlaneQuorum says whether the servers' etcd keeps its quorum through one
	// more server's reboot, from the etcd membership k3s reports on each server's Node (the
	// EtcdIsVoter condition): True (QuorumKept), False when fewer than three voters can
	// keep none through any reboot (TooFewVoters) or too few are healthy and up now
	// (QuorumAtRisk), Unknown when no Node reports it (NotReported).
	ClusterControlPlaneQuorum = "ControlPlaneQuorum"
)

// Cluster condition reasons (and ReasonHealthy, ReasonRoleMismatch).
const (
	// ReasonWithinBudget: no more machines are unavailable than the disruption budget allows.
	ReasonWithinBudget = "WithinBudget"
	// ReasonOverBudget: more machines are unavailable than the budget allows; the message
	// names them. No turn is given until enough are back.
	ReasonOverBudget = "OverBudget"
	// ReasonRollingOut: a machine does not run the release it is meant to, holds a turn or
	// waits for one.
	ReasonRollingOut = "RollingOut"
	// ReasonUpToDate: every machine runs the release it is meant to and nothing waits.
	ReasonUpToDate = "UpToDate"
	// ReasonTurnHolderNotBack: a machine holding a turn has been unavailable for longer than
	// 15 minutes (the coordinator's StuckAfter); turns never expire by themselves.
	ReasonTurnHolderNotBack = "TurnHolderNotBack"
	// ReasonMachinesNeedAttention: machines fell back from a trial, or drains were blocked.
	ReasonMachinesNeedAttention = "MachinesNeedAttention"
	// ReasonMaintenanceWindowInvalid: spec.maintenanceWindows cannot be read (an unknown
	// time zone, say); Auto reboots wait until it is fixed.
	ReasonMaintenanceWindowInvalid = "MaintenanceWindowInvalid"
	// ReasonPaused and ReasonNotPaused: spec.rollout.paused is true, or not.
	ReasonPaused    = "Paused"
	ReasonNotPaused = "NotPaused"
	// ReasonHalted: spec.rollout.maxFailures machines failed the trial of the same release
	// or kernel arguments, so the coordinator holds the rollout as if paused; the message
	// names them and why. liken rollout resume (spec.rollout.resumedAt) or another release
	// goes on.
	ReasonHalted = "Halted"
	// ReasonQuorumKept, ReasonQuorumAtRisk, ReasonTooFewVoters and ReasonNotReported: the
	// ControlPlaneQuorum condition's (above).
	ReasonQuorumKept   = "QuorumKept"
	ReasonQuorumAtRisk = "QuorumAtRisk"
	ReasonTooFewVoters = "TooFewVoters"
	ReasonNotReported  = "NotReported"
)
