// Package state is what a machine's agent remembers across restarts and reboots, in one
// JSON file on the state partition, replaced atomically. It is the "applied" side of every
// diff: the agent re-applies nothing it finds recorded here, so a restarted agent neither
// writes the kernel again nor restarts k3s needlessly.
package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/event"
)

// Version is the schema version of the state file.
const Version = 1

// State is the agent's memory.
type State struct {
	Version int `json:"version"`
	// Applied is the spec in effect on this machine: Live and RestartK3s fields as last
	// applied, NextBoot and Reboot fields as this boot runs them. Nil before the first
	// reconcile.
	Applied *change.Spec `json:"applied,omitempty"`
	// Staged is the desired spec the next boot applies (NextBoot and Reboot fields). Init
	// reads it at boot.
	Staged *change.Spec `json:"staged,omitempty"`
	// MachineGeneration and ClusterGeneration were fully applied or staged.
	MachineGeneration int64 `json:"machineGeneration,omitempty"`
	ClusterGeneration int64 `json:"clusterGeneration,omitempty"`
	// Pending is the staged change set, with when each entry was first seen.
	Pending []v1alpha1.PendingChange `json:"pending,omitempty"`
	// SysctlOriginals maps each sysctl liken changed to its value before that.
	SysctlOriginals map[string]string `json:"sysctlOriginals,omitempty"`
	// NodeLabels and NodeTaints are the labels and taints liken put on its Node, so it
	// removes only its own.
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
	NodeTaints []v1alpha1.Taint  `json:"nodeTaints,omitempty"`
	// K3sRestartPending is set before rendered k3s files are replaced and cleared once
	// the supervisor restarted k3s, so a crash in between still ends in a restart.
	K3sRestartPending bool `json:"k3sRestartPending,omitempty"`
	// BootID is the boot whose boot-time settings Applied records.
	BootID string `json:"bootID,omitempty"`
	// Attempt is the trial armed before the last reboot the agent asked for, kept until the
	// boot after it says how it went.
	Attempt *Attempt `json:"attempt,omitempty"`
	// FailedReleases are the releases whose trial failed here; none is tried again unless
	// spec.retryFailedDigest names it.
	FailedReleases []v1alpha1.FailedRelease `json:"failedReleases,omitempty"`
	// FailedKernelArgs are kernel arguments whose trial failed; they are not tried again
	// until the spec asks for different ones.
	FailedKernelArgs *FailedArgs `json:"failedKernelArgs,omitempty"`
	// GoodNetwork is the network of the last boot that was not a trial, or of a trial that
	// committed: init boots with it, and with the staged network only in a trial boot armed
	// for it. Nil: init takes the staged network (state written before network trials).
	GoodNetwork *GoodNetwork `json:"goodNetwork,omitempty"`
	// FailedNetwork is the network whose trial failed; it is not tried again until the spec
	// asks for a different one. Args holds its hash (NetworkHash).
	FailedNetwork *FailedArgs `json:"failedNetwork,omitempty"`
	// LastRequestHandled is the requestedAt of the last reboot request carried out.
	LastRequestHandled *metav1.Time `json:"lastRequestHandled,omitempty"`
	// LastRebootTime is when the agent last asked init to reboot.
	LastRebootTime *metav1.Time `json:"lastRebootTime,omitempty"`
	// ApprovedHash and ApprovedAt identify the approval the last reboot acted on: each
	// approval reboots the machine at most once.
	ApprovedHash string       `json:"approvedHash,omitempty"`
	ApprovedAt   *metav1.Time `json:"approvedAt,omitempty"`
	// NotAppliedAtBoot are boot-time settings init could not apply at the last boot: they
	// stay pending, with the reason in status, while the spec asks for the same value.
	NotAppliedAtBoot []NotAppliedAtBoot `json:"notAppliedAtBoot,omitempty"`
	// UnsentEvents are Events the agent recorded but could not send before it last went
	// down (the API server was away); the next start sends them.
	UnsentEvents []event.Event `json:"unsentEvents,omitempty"`
}

// Attempt is a trial boot the agent armed: a release in a slot, kernel arguments, or both.
type Attempt struct {
	Slot       string `json:"slot"`
	Version    string `json:"version"`
	Digest     string `json:"digest"`
	KernelArgs string `json:"kernelArgs"`
	// From* are what the machine ran when it armed the trial.
	FromSlot       string `json:"fromSlot"`
	FromDigest     string `json:"fromDigest"`
	FromKernelArgs string `json:"fromKernelArgs"`
	// Network is the hash (NetworkHash) of the network this trial boots with, when it tries
	// one other than FromNetwork, the last good one; empty otherwise.
	Network     string `json:"network,omitempty"`
	FromNetwork string `json:"fromNetwork,omitempty"`
	// Retry: spec.retryFailedDigest allowed this trial of a failed digest; its failure uses
	// that setting's one retry.
	Retry bool `json:"retry,omitempty"`
	// BootID is the boot that armed the trial.
	BootID string      `json:"bootID"`
	At     metav1.Time `json:"at"`
}

// NotAppliedAtBoot is a boot-time setting init could not apply at a boot.
type NotAppliedAtBoot struct {
	Field  string `json:"field"`
	Reason string `json:"reason"`
	BootID string `json:"bootID"`
	// Spec is the staged spec whose value init tried.
	Spec change.Spec `json:"spec"`
}

// FailedArgs are kernel arguments whose trial failed.
type FailedArgs struct {
	Args    string      `json:"args"`
	Reason  string      `json:"reason"`
	Message string      `json:"message,omitempty"`
	At      metav1.Time `json:"at"`
}

// Store reads and writes the state file in a directory.
type Store struct {
	Dir string
}

func (s Store) path() string { return filepath.Join(s.Dir, "agent-state.json") }

// Load returns the stored state, or an empty one when there is none yet.
func (s Store) Load() (*State, error) {
	b, err := os.ReadFile(s.path())
	if errors.Is(err, os.ErrNotExist) {
		return &State{Version: Version, SysctlOriginals: map[string]string{}, NodeLabels: map[string]string{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading agent state: %w", err)
	}
	st := &State{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("reading agent state %s: %w", s.path(), err)
	}
	if st.Version != Version {
		return nil, fmt.Errorf("reading agent state %s: schema version %d, this agent knows %d", s.path(), st.Version, Version)
	}
	if st.SysctlOriginals == nil {
		st.SysctlOriginals = map[string]string{}
	}
	if st.NodeLabels == nil {
		st.NodeLabels = map[string]string{}
	}
	return st, nil
}

// Save replaces the state file.
func (s Store) Save(st *State) error {
	st.Version = Version
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding agent state: %w", err)
	}
	return atomicfile.Write(s.path(), b, 0o600)
}

// GoodNetwork is a network a machine ran with and reached its cluster on (nil Network: the
// default, DHCP on the first port with a link).
type GoodNetwork struct {
	Network *v1alpha1.MachineNetwork `json:"network,omitempty"`
}

// NetworkHash identifies a Machine's network settings, for trials and their failures.
func NetworkHash(n *v1alpha1.MachineNetwork) string {
	b, _ := json.Marshal(n)
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// BootNetwork is the network a boot runs with: the staged one only in the trial boot the
// agent armed for it (the same slot, the same settings); otherwise the last good one, so a
// network that failed its trial, or one staged and not yet tried, never strands a machine
// that is not on trial. how says which, for the console.
func (st *State) BootNetwork(trial bool, slot string) (n *v1alpha1.MachineNetwork, how string) {
	if st.Staged == nil {
		return nil, "nothing staged"
	}
	staged := st.Staged.Machine.Network
	if st.GoodNetwork == nil || NetworkHash(staged) == NetworkHash(st.GoodNetwork.Network) {
		return staged, "the staged settings"
	}
	if at := st.Attempt; trial && at != nil && at.Slot == slot && at.Network == NetworkHash(staged) {
		return staged, "this trial boot tries the staged settings; the last good ones come back if it fails"
	}
	return st.GoodNetwork.Network, "the last good settings (the staged ones are tried only in a trial boot armed for them)"
}
