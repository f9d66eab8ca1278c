package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/atomicfile"
)

// BootRecord is what init wrote about one boot. A boot that crashed, hung or lost power
// leaves its record without an End: the machine itself could not say goodbye.
type BootRecord struct {
	// ID is the kernel's boot_id.
	ID      string    `json:"id"`
	Slot    string    `json:"slot"`
	Trial   bool      `json:"trial,omitempty"`
	Version string    `json:"version,omitempty"`
	Started time.Time `json:"started"`
	// Reached is the last stage init got to: "system", "k3s", "committed".
	Reached string `json:"reached,omitempty"`
	// End is how the boot ended when init could tell: "reboot", "poweroff",
	// "health-deadline", "init-failed".
	End     string `json:"end,omitempty"`
	Message string `json:"message,omitempty"`
	// Panic is the kernel log of a panic this boot found in the firmware's store (pstore),
	// left there by the boot before it.
	Panic string `json:"panic,omitempty"`
	// Armed is the slot whose trial this boot armed for the next boot, if any.
	Armed string `json:"armed,omitempty"`
	// WatchdogReset is set when the watchdog reports that it reset the machine before
	// this boot.
	WatchdogReset bool `json:"watchdogReset,omitempty"`
	// StateFS is how this boot found the state file system before mounting it: "clean",
	// or why not (the boot before it did not unmount it: power lost, a crash).
	StateFS string `json:"stateFS,omitempty"`
	// Shutdown is how this boot's shutdown went, when it had one: "clean" (every process
	// ended by SIGTERM), or what it had to force.
	Shutdown string `json:"shutdown,omitempty"`
}

// BootReport is what init applied at this boot of the settings only a boot applies: the
// agent marks them applied only as this report says (internal/agent promoteBootSettings).
type BootReport struct {
	// Network and KernelModules are the Machine's settings init used at this boot (the spec
	// the agent staged last, or the layer's manifest).
	Network       *v1alpha1.MachineNetwork `json:"network,omitempty"`
	KernelModules []v1alpha1.KernelModule  `json:"kernelModules,omitempty"`
	// Disks is the spec.disks init used at this boot, and DiskStatus what became of each.
	Disks      []v1alpha1.Disk       `json:"disks,omitempty"`
	DiskStatus []v1alpha1.DiskStatus `json:"diskStatus,omitempty"`
	// Swap is the Cluster's features.swap init booted with.
	Swap *bool `json:"swap,omitempty"`
	// NotApplied maps a field ("machine.spec.network") to why init could not apply all of it.
	NotApplied map[string]string `json:"notApplied,omitempty"`
	// Modules are the Machine's modules init loaded, each as "name param=value ...".
	Modules []string `json:"modules,omitempty"`
	// Cmdline is the kernel command line in effect.
	Cmdline string `json:"cmdline,omitempty"`
	// Clock is how init set the clock at this boot, before k3s started.
	Clock *ClockSet `json:"clock,omitempty"`
	// PreflightDone says init has made the host check it makes once k3s runs (iptables
	// through k3s's PATH); PreflightFailed says how it failed, if it did.
	PreflightDone   bool   `json:"preflightDone,omitempty"`
	PreflightFailed string `json:"preflightFailed,omitempty"`
}

// ClockSet is one setting of the clock from a time server; a nil one in a report says no
// server answered and the clock ran as the hardware clock started it.
type ClockSet struct {
	Server string        `json:"server"`
	Offset time.Duration `json:"offset"`
	At     time.Time     `json:"at"`
	// Took is how long setting it took, the waiting for a server included.
	Took time.Duration `json:"took"`
}

// Boot stages and ends init records.
const (
	ReachedSystem    = "system"
	ReachedK3s       = "k3s"
	ReachedCommitted = "committed"

	EndReboot         = "reboot"
	EndPowerOff       = "poweroff"
	EndHealthDeadline = "health-deadline"
	EndInitFailed     = "init-failed"
	// EndGatesFailed: the agent ended the trial before its deadline, the machine's gates
	// having failed on it (Cluster spec.rollout.commitAfterGates).
	EndGatesFailed = "gates-failed"
	// EndPeersUnreachable: the agent ended a server's trial of new network settings before
	// its deadline: the server was healthy by its own account, but no other machine reached
	// it on the new network within the peers' wait (internal/agent peersReach).
	EndPeersUnreachable = "peers-unreachable"
)

// AgentEnds are the ends the agent may give a trial before its deadline (init's
// /v1/trial/fail), with init's words for each on the console.
var AgentEnds = map[string]string{
	EndGatesFailed:      "the trial failed its gates",
	EndPeersUnreachable: "no peer reached the trial's network",
}

// maxBoots is how many boot records are kept.
const maxBoots = 16

// BootLog is init's record of recent boots, on the state partition beside the agent's state.
type BootLog struct {
	Dir string
}

func (l BootLog) path() string { return filepath.Join(l.Dir, "boots.json") }

// Load returns the records, oldest first; none when there is no log yet.
func (l BootLog) Load() ([]BootRecord, error) {
	b, err := os.ReadFile(l.path())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the boot log: %w", err)
	}
	var out []BootRecord
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("reading the boot log %s: %w", l.path(), err)
	}
	return out, nil
}

// Update changes the record of boot id (adding it when new) and keeps the newest records.
func (l BootLog) Update(id string, change func(*BootRecord)) error {
	recs, err := l.Load()
	if err != nil {
		recs = nil // a damaged log is replaced: it only explains failures
	}
	i := len(recs)
	for j := range recs {
		if recs[j].ID == id {
			i = j
		}
	}
	if i == len(recs) {
		recs = append(recs, BootRecord{ID: id})
	}
	change(&recs[i])
	if len(recs) > maxBoots {
		recs = recs[len(recs)-maxBoots:]
	}
	b, err := json.MarshalIndent(recs, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(l.path(), b, 0o600)
}
