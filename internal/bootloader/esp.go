package bootloader

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// SlotsFile on the ESP records which release each slot holds. GRUB never reads it; liken
// (install, init and, through init, the agent) does.
const SlotsFile = ConfigDir + "/slots.json"

// Slot names, as GRUB's environment and the API spell them.
const (
	SlotA = "A"
	SlotB = "B"
)

// Other is the slot that is not s.
func Other(s string) string {
	if s == SlotA {
		return SlotB
	}
	return SlotA
}

// SlotState says whether a slot's bytes can be trusted.
type SlotState string

const (
	// SlotReady: the slot holds Digest's slot image, verified as it was written.
	SlotReady SlotState = "Ready"
	// SlotWriting: a write started and has not verified; whatever the slot holds is no
	// release. A power cut while writing leaves this.
	SlotWriting SlotState = "Writing"
	// SlotCorrupt: the slot was found not to match its record; it holds no release.
	SlotCorrupt SlotState = "Corrupt"
)

// SlotRecord is what one slot holds.
type SlotRecord struct {
	State   SlotState `json:"state"`
	Version string    `json:"version,omitempty"`
	// Digest is the release document's pin.
	Digest string `json:"digest,omitempty"`
	// SHA256 and Size are the slot image's, from the release document: enough to check the
	// slot's bytes again without the channel.
	SHA256 string    `json:"sha256,omitempty"`
	Size   int64     `json:"size,omitempty"`
	At     time.Time `json:"at"`
}

// Holds reports whether the slot holds the release pinned as digest.
func (r SlotRecord) Holds(digest string) bool { return r.State == SlotReady && r.Digest == digest }

// Slots maps slot names to their records.
type Slots map[string]SlotRecord

// Environment variables of liken's GRUB configuration.
const (
	EnvDefaultSlot = "default_slot" // the last slot that passed its trial
	EnvTrialSlot   = "trial_slot"   // the slot to boot once, consumed before the kernel
	EnvInstallArgs = "install_args" // kernel arguments given at install (every boot)
	EnvKernelArgs  = "kernel_args"  // the Cluster's and Machine's kernelArgs of the last good boot
	EnvTrialArgs   = "trial_args"   // the kernelArgs a trial boots with
)

// ESP is a mounted EFI system partition.
type ESP struct{ Dir string }

// Env reads the environment block.
func (e ESP) Env() (Env, error) {
	b, err := os.ReadFile(filepath.Join(e.Dir, EnvFile))
	if err != nil {
		return nil, fmt.Errorf("reading the boot loader's environment: %w", err)
	}
	return ParseEnv(b)
}

// UpdateEnv changes the environment block in place: GRUB's block keeps its size and place,
// so a power cut leaves either the old or the new sectors (a 1 KiB block is two sectors;
// ParseEnv refuses a torn one and GRUB then boots the default).
func (e ESP) UpdateEnv(change func(Env)) error {
	env, err := e.Env()
	if err != nil {
		return err
	}
	change(env)
	b, err := env.Encode()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(e.Dir, EnvFile), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("writing the boot loader's environment: %w", err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return fmt.Errorf("writing the boot loader's environment: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing the boot loader's environment: %w", err)
	}
	return f.Close()
}

// Slots reads the slot records; a missing file means no slot holds a known release.
func (e ESP) Slots() (Slots, error) {
	b, err := os.ReadFile(filepath.Join(e.Dir, SlotsFile))
	if errors.Is(err, os.ErrNotExist) {
		return Slots{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the slot records: %w", err)
	}
	s := Slots{}
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("reading the slot records %s: %w", SlotsFile, err)
	}
	return s, nil
}

// SetSlot replaces one slot's record: written beside the old file, synced, renamed over it.
func (e ESP) SetSlot(slot string, r SlotRecord) error {
	if slot != SlotA && slot != SlotB {
		return fmt.Errorf("no slot %q (A or B)", slot)
	}
	s, err := e.Slots()
	if err != nil {
		return err
	}
	s[slot] = r
	return WriteSlots(filepath.Join(e.Dir, SlotsFile), s)
}

// WriteSlots writes a slot record file (install uses it on a file it copies in).
func WriteSlots(path string, s Slots) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("writing the slot records: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("writing the slot records: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing the slot records: %w", err)
	}
	f.Close()
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing the slot records: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// JoinArgs makes one kernel command line fragment from kernelArgs lists.
func JoinArgs[T ~string](lists ...[]T) string {
	var all []string
	for _, l := range lists {
		for _, a := range l {
			all = append(all, string(a))
		}
	}
	return strings.Join(all, " ")
}
