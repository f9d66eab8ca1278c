package bootloader

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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

// The environment is kept in two copies, EnvFile and EnvFile2, so that no write torn by a
// power cut decides a boot. Each copy begins with gen (a generation number) and ends with
// seal, which equals gen only once the copy is whole: liken writes a copy with no seal,
// syncs, then writes the seal in place. GRUB (ConfigText's pick_env) and liken both read
// the sealed copy with the higher generation, and liken writes only the other one, so at
// every instant one sealed copy holds either the old intent or the new one. GRUB's own
// write, consuming a trial, changes one byte in place (trial_slot B to -), which cannot tear.
const (
	EnvFile2 = ConfigDir + "/grubenv2"
	envGen   = "gen"
	envSeal  = "seal"
	// Generations are ten digits from firstGen: GRUB compares them with test -gt, which
	// reads a leading 0 as octal, and every copy keeps the same layout.
	firstGen = 1_000_000_000
	lastGen  = 9_999_999_999
	noSeal   = "----------"
	// noTrial is trial_slot's value when no trial is armed: one character, like A or B, so
	// GRUB consumes a trial without moving a byte of the block.
	noTrial = "-"
)

// envCopy is one copy of the environment as read.
type envCopy struct {
	env    Env
	gen    uint64
	sealed bool
	exists bool
}

func readEnvCopy(path string) (envCopy, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return envCopy{}, nil
	}
	if err != nil {
		return envCopy{}, fmt.Errorf("reading the boot loader's environment: %w", err)
	}
	c := envCopy{exists: true}
	env, err := ParseEnv(b)
	if err != nil {
		return c, nil // torn beyond parsing: not sealed
	}
	c.env = env
	g, gerr := strconv.ParseUint(env[envGen], 10, 64)
	c.gen, c.sealed = g, gerr == nil && env[envSeal] == env[envGen]
	return c, nil
}

// envCopies reads both copies and says which is current: the sealed one with the higher
// generation. legacy is a disk installed before the two copies (EnvFile alone, no gen).
func (e ESP) envCopies() (copies [2]envCopy, current int, legacy bool, err error) {
	for i, name := range []string{EnvFile, EnvFile2} {
		if copies[i], err = readEnvCopy(filepath.Join(e.Dir, name)); err != nil {
			return copies, 0, false, err
		}
	}
	switch {
	case !copies[1].exists:
		if copies[0].env == nil {
			return copies, 0, false, errors.New("reading the boot loader's environment: " + EnvFile + " is missing or damaged")
		}
		return copies, 0, true, nil
	case copies[0].sealed && (!copies[1].sealed || copies[0].gen >= copies[1].gen):
		// Equal generations (never written so) go to the first copy, as GRUB's -gt does.
		return copies, 0, false, nil
	case copies[1].sealed:
		return copies, 1, false, nil
	}
	return copies, 0, false, errors.New("reading the boot loader's environment: neither copy is whole")
}

// Env reads the current environment: the sealed copy with the higher generation.
func (e ESP) Env() (Env, error) {
	copies, cur, _, err := e.envCopies()
	if err != nil {
		return nil, err
	}
	env := Env{}
	for k, v := range copies[cur].env {
		if k != envGen && k != envSeal {
			env[k] = v
		}
	}
	if env[EnvTrialSlot] == noTrial {
		env[EnvTrialSlot] = ""
	}
	return env, nil
}

// writeAt is where every environment write goes; PowerCuts records through it.
var writeAt = func(f *os.File, b []byte, off int64) error {
	_, err := f.WriteAt(b, off)
	return err
}

// UpdateEnv changes the environment: the other copy than the current one is written whole
// without a seal, synced, then sealed in place with the next generation.
func (e ESP) UpdateEnv(change func(Env)) error {
	copies, cur, legacy, err := e.envCopies()
	if err != nil {
		return err
	}
	env, err := e.Env()
	if err != nil {
		return err
	}
	change(env)
	if legacy {
		// A disk installed with one copy: its grub.cfg reads only that one, so it is
		// rewritten in place as before (both of its sectors, not torn-proof).
		b, err := env.Encode()
		if err != nil {
			return err
		}
		return writeInPlace(filepath.Join(e.Dir, EnvFile), []writePart{{b, 0}})
	}
	gen := copies[cur].gen + 1
	if gen > lastGen {
		return errors.New("the boot loader's environment has used every generation number")
	}
	unsealed, sealOff, err := env.encodeCopy(gen, false)
	if err != nil {
		return err
	}
	target := []string{EnvFile, EnvFile2}[1-cur]
	return writeInPlace(filepath.Join(e.Dir, target), []writePart{{unsealed, 0}, {[]byte(strconv.FormatUint(gen, 10)), int64(sealOff)}})
}

type writePart struct {
	b   []byte
	off int64
}

// writeInPlace writes each part into the existing file in place, syncing after each: the
// file keeps its size and clusters, so the FAT and directory are not rewritten.
func writeInPlace(path string, parts []writePart) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("writing the boot loader's environment: %w", err)
	}
	defer f.Close()
	for _, p := range parts {
		if err := writeAt(f, p.b, p.off); err != nil {
			return fmt.Errorf("writing the boot loader's environment: %w", err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("syncing the boot loader's environment: %w", err)
		}
	}
	return f.Close()
}

// encodeCopy is one copy of the environment: gen first, seal last (noSeal unless sealed),
// and sealOff the offset of seal's value.
func (e Env) encodeCopy(gen uint64, sealed bool) (b []byte, sealOff int, err error) {
	body := Env{}
	for k, v := range e {
		if k != envGen && k != envSeal {
			body[k] = v
		}
	}
	if body[EnvTrialSlot] == "" {
		body[EnvTrialSlot] = noTrial
	}
	g := strconv.FormatUint(gen, 10)
	seal := noSeal
	if sealed {
		seal = g
	}
	var buf bytes.Buffer
	buf.WriteString(envHeader + envGen + "=" + g + "\n")
	for _, k := range body.keys() {
		buf.WriteString(k + "=" + escapeEnv(body[k]) + "\n")
	}
	buf.WriteString(envSeal + "=")
	sealOff = buf.Len()
	buf.WriteString(seal + "\n")
	if buf.Len() > EnvSize {
		return nil, 0, fmt.Errorf("environment block: %d bytes of variables do not fit in %d", buf.Len(), EnvSize)
	}
	buf.Write(bytes.Repeat([]byte("#"), EnvSize-buf.Len()))
	return buf.Bytes(), sealOff, nil
}

// EnvCopies are the two sealed copies install writes: EnvFile current, EnvFile2 one
// generation older with the same content.
func EnvCopies(env Env) (first, second []byte, err error) {
	if first, _, err = env.encodeCopy(firstGen+1, true); err != nil {
		return nil, nil, err
	}
	second, _, err = env.encodeCopy(firstGen, true)
	return first, second, err
}

// The slot records are kept in two copies too (SlotsFile and SlotsFile2), each with a
// generation and a checksum: a copy is rewritten in place and may be torn or, on FAT,
// lose its clusters to a power cut; the other still holds the records before the write.
const SlotsFile2 = ConfigDir + "/slots2.json"

// slotsCopy is one copy of the slot records as written.
type slotsCopy struct {
	Generation uint64 `json:"generation"`
	Slots      Slots  `json:"slots"`
	// SHA256 is the checksum of Slots as encoded in this file (json.Marshal).
	SHA256 string `json:"sha256"`
}

func readSlotsCopy(path string) (c slotsCopy, ok, exists bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, false, false, nil
	}
	if err != nil {
		return c, false, true, fmt.Errorf("reading the slot records: %w", err)
	}
	if json.Unmarshal(b, &c) != nil || c.Generation == 0 {
		// A disk installed before the two copies: one file, the records alone, no
		// generation (0, so any copy written since is newer).
		var legacy Slots
		if err := json.Unmarshal(b, &legacy); err == nil {
			return slotsCopy{Slots: legacy}, true, true, nil
		}
		return c, false, true, nil
	}
	sb, _ := json.Marshal(c.Slots)
	sum := sha256.Sum256(sb)
	return c, hex.EncodeToString(sum[:]) == c.SHA256, true, nil
}

// slotCopies reads both copies; current is the whole one with the higher generation.
func (e ESP) slotCopies() (copies [2]slotsCopy, current int, err error) {
	var ok, exists [2]bool
	for i, name := range []string{SlotsFile, SlotsFile2} {
		if copies[i], ok[i], exists[i], err = readSlotsCopy(filepath.Join(e.Dir, name)); err != nil {
			return copies, 0, err
		}
	}
	switch {
	case !ok[0] && !ok[1] && (!exists[0] || !exists[1]):
		// None written yet, or only a first write that a power cut tore: no slot holds a
		// known release (each is checked again before it is trusted).
		return copies, -1, nil
	case ok[0] && (!ok[1] || copies[0].Generation >= copies[1].Generation):
		return copies, 0, nil
	case ok[1]:
		return copies, 1, nil
	}
	return copies, 0, errors.New("reading the slot records: neither copy is whole")
}

// Slots reads the slot records; none written means no slot holds a known release.
func (e ESP) Slots() (Slots, error) {
	copies, cur, err := e.slotCopies()
	if err != nil || cur < 0 {
		return Slots{}, err
	}
	s := Slots{}
	for k, v := range copies[cur].Slots {
		s[k] = v
	}
	return s, nil
}

// SetSlot replaces one slot's record: the copy that is not current is rewritten with the
// next generation and synced.
func (e ESP) SetSlot(slot string, r SlotRecord) error {
	if slot != SlotA && slot != SlotB {
		return fmt.Errorf("no slot %q (A or B)", slot)
	}
	copies, cur, err := e.slotCopies()
	if err != nil {
		return err
	}
	s, gen, target := Slots{}, uint64(1), SlotsFile
	if cur >= 0 {
		for k, v := range copies[cur].Slots {
			s[k] = v
		}
		gen = copies[cur].Generation + 1
		target = []string{SlotsFile, SlotsFile2}[1-cur]
	}
	s[slot] = r
	b, err := encodeSlots(s, gen)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(e.Dir, target), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("writing the slot records: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("writing the slot records: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing the slot records: %w", err)
	}
	return f.Close()
}

func encodeSlots(s Slots, gen uint64) ([]byte, error) {
	sb, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(sb)
	b, err := json.MarshalIndent(slotsCopy{Generation: gen, Slots: s, SHA256: hex.EncodeToString(sum[:])}, "", "  ")
	return append(b, '\n'), err
}

// SlotsCopies are the two copies install writes: SlotsFile current, SlotsFile2 a
// generation older with the same records.
func SlotsCopies(s Slots) (first, second []byte, err error) {
	if first, err = encodeSlots(s, 2); err != nil {
		return nil, nil, err
	}
	second, err = encodeSlots(s, 1)
	return first, second, err
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
