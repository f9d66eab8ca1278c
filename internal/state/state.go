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
	"path"
	"path/filepath"
	"strings"

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
	// GoodDisks are the disks of that boot, kept as GoodNetwork is: a change to a disk k3s's
	// data needs (NeedsTrial) is tried only in a trial boot. Nil: init takes the staged
	// disks (state written before disk trials).
	GoodDisks *GoodDisks `json:"goodDisks,omitempty"`
	// FailedNetwork are the network and k3s data disks whose trial failed; they are not
	// tried again until the spec asks for different ones. Args holds their hash (TrialHash).
	FailedNetwork *FailedArgs `json:"failedNetwork,omitempty"`
	// LastRequestHandled is the requestedAt of the last reboot request carried out.
	LastRequestHandled *metav1.Time `json:"lastRequestHandled,omitempty"`
	// RebootAsked is the reboot the agent is about to ask init for, recorded with what it
	// marked as used for it, before it says its last words; it is cleared by the boot
	// after. An agent killed before init took the request finds it on its next start in
	// the same boot and takes the marks back, so the approval or request is carried out
	// rather than dropped.
	RebootAsked *RebootAsked `json:"rebootAsked,omitempty"`
	// RebootedForTurn is the disruption-budget turn (its since) the last reboot was made on:
	// once back, the machine holds that turn until it is healthy on this boot, whatever
	// else has become pending meanwhile.
	RebootedForTurn *metav1.Time `json:"rebootedForTurn,omitempty"`
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

// RebootAsked is a reboot the agent decided on, and what it held before.
type RebootAsked struct {
	// BootID is the boot the reboot was to end.
	BootID           string       `json:"bootID"`
	PrevApprovedHash string       `json:"prevApprovedHash,omitempty"`
	PrevApprovedAt   *metav1.Time `json:"prevApprovedAt,omitempty"`
	PrevRequest      *metav1.Time `json:"prevRequest,omitempty"`
	PrevRebootTime   *metav1.Time `json:"prevRebootTime,omitempty"`
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
	// Network is the hash (TrialHash) of the network and k3s data disks this trial boots
	// with, when it tries others than FromNetwork, the last good ones; empty otherwise.
	Network     string `json:"network,omitempty"`
	FromNetwork string `json:"fromNetwork,omitempty"`
	// Peers are the other Nodes Ready when a server armed a trial of new network settings:
	// the trial commits only once one of them has reached this server (its kubelet renewed
	// its Lease), since the server's own agent reaches its k3s over loopback whatever the
	// network. Waiting says what the commit last waited for, for the failure's message.
	Peers   []string `json:"peers,omitempty"`
	Waiting string   `json:"waiting,omitempty"`
	// Retry: spec.retryFailedDigest allowed this trial of a failed digest; its failure uses
	// that setting's one retry.
	Retry bool `json:"retry,omitempty"`
	// BootID is the boot that armed the trial.
	BootID string      `json:"bootID"`
	At     metav1.Time `json:"at"`
}

// Committed reports whether the trial boot after the one that armed at committed, by init's
// boot log.
func (at *Attempt) Committed(boots []BootRecord) bool {
	after := false
	for _, b := range boots {
		switch {
		case b.ID == at.BootID:
			after = true
		case after && b.Trial && b.Slot == at.Slot:
			return b.Reached == ReachedCommitted
		}
	}
	return false
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

// GoodDisks are the disks a machine ran with when it last reached its cluster healthy.
type GoodDisks struct {
	Disks []v1alpha1.Disk `json:"disks,omitempty"`
}

// NetworkHash identifies a Machine's network settings.
func NetworkHash(n *v1alpha1.MachineNetwork) string { return jsonHash(n) }

// jsonHash is the sha256 of v's JSON, as "sha256:<hex>".
func jsonHash(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// k3sData are where k3s keeps its data (its data-dir, k3s.DefaultPaths.DataDir) and where the
// kubelet keeps its pods' (its root-dir): a disk mounted at, above or below one of them
// decides what k3s finds when it starts.
var k3sData = []string{"/var/lib/rancher/k3s", "/var/lib/kubelet"}

// NeedsTrial reports whether k3s's own data depends on d: a wrong disk there starts k3s
// afresh (a server with an empty datastore) or not at all, so a change to it boots as a
// trial, as a network change does.
func NeedsTrial(d v1alpha1.Disk) bool {
	for _, p := range d.Partitions {
		if p.MountPoint == "" {
			continue
		}
		mp := path.Clean(p.MountPoint)
		for _, k := range k3sData {
			if mp == k || strings.HasPrefix(k, mp+"/") || strings.HasPrefix(mp, k+"/") {
				return true
			}
		}
	}
	return false
}

// TrialHash identifies the settings a machine tries only in a trial boot: its network, and
// the disks k3s's data needs. With no such disk it is NetworkHash, as before disks had
// trials.
func TrialHash(n *v1alpha1.MachineNetwork, disks []v1alpha1.Disk) string {
	var k3s []v1alpha1.Disk
	for _, d := range disks {
		if NeedsTrial(d) {
			k3s = append(k3s, d)
		}
	}
	if len(k3s) == 0 {
		return NetworkHash(n)
	}
	return jsonHash(struct {
		Network *v1alpha1.MachineNetwork `json:"network"`
		Disks   []v1alpha1.Disk          `json:"disks"`
	}{n, k3s})
}

// BootSettings are the network and disks a boot runs with: the staged ones only in the trial
// boot the agent armed for them (the same slot, the same settings) when they differ from the
// last good ones in the network or in a disk k3s's data needs; otherwise the last good ones,
// so settings that failed their trial, or are staged and not yet tried, never strand a
// machine that is not on trial. A trial the boot log shows committed made the staged ones
// good, even if the agent stopped before it recorded them. how says which, for the console.
func (st *State) BootSettings(trial bool, slot string, boots []BootRecord) (n *v1alpha1.MachineNetwork, disks []v1alpha1.Disk, how string) {
	if st.Staged == nil {
		return nil, nil, "nothing staged"
	}
	staged := st.Staged.Machine
	goodN, goodD := staged.Network, staged.Disks
	if st.GoodNetwork != nil {
		goodN = st.GoodNetwork.Network
	}
	if st.GoodDisks != nil {
		goodD = st.GoodDisks.Disks
	}
	h := TrialHash(staged.Network, staged.Disks)
	if h == TrialHash(goodN, goodD) {
		return staged.Network, staged.Disks, "the staged settings"
	}
	if at := st.Attempt; trial && at != nil && at.Slot == slot && at.Network == h {
		return staged.Network, staged.Disks, "this trial boot tries the staged settings; the last good ones come back if it fails"
	}
	if at := st.Attempt; at != nil && at.Network == h && at.Committed(boots) {
		return staged.Network, staged.Disks, "the staged settings (their trial committed)"
	}
	return goodN, goodD, "the last good settings (the staged ones are tried only in a trial boot armed for them)"
}
