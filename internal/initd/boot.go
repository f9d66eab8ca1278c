package initd

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/initramfs"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

// bootControl is init's side of the boot loader (supervisor.Boot): what this boot is, the
// slot records, and the changes the agent asks for.
type bootControl struct {
	mu  sync.Mutex
	log io.Writer
	esp *espOwner

	slot, version string
	trial         bool
	args          string // the Cluster's and Machine's kernelArgs this boot runs with
	bootID        string
	bootTime      time.Time
	boots         state.BootLog
	recordMu      sync.Mutex // the boot log is read, changed and replaced

	committed   bool
	committedCh chan struct{}
	// failedCh is closed when the agent ends the trial (FailTrial).
	failedCh      chan struct{}
	rebootPending bool
	// layerDigest is the deployment layer's digest as built ("" when the disk records none).
	layerDigest string
	// role is the role of the layer's Machine manifest, which k3s is started with.
	role v1alpha1.Role
	// report is what this boot applied of the boot-time settings (nil until init knows).
	report *state.BootReport
	// reboot asks init's main loop to shut down and restart the machine.
	reboot func(why string)
}

func newBootControl(log io.Writer, cmd initramfs.Cmdline, version string, reboot func(string)) *bootControl {
	b := &bootControl{log: log, esp: newESPOwner(log), slot: cmd["liken.slot"], trial: cmd["liken.trial"] == "1", version: version,
		bootID: readTrim("/proc/sys/kernel/random/boot_id"), boots: state.BootLog{Dir: likenState},
		committedCh: make(chan struct{}), failedCh: make(chan struct{}), reboot: reboot}
	if up, err := strconv.ParseFloat(strings.Fields(readTrim("/proc/uptime") + " 0")[0], 64); err == nil {
		b.bootTime = time.Now().Add(-time.Duration(up * float64(time.Second))).UTC().Truncate(time.Second)
	}
	// Which of the environment's argument sets GRUB gave this boot.
	if err := b.withESP(func(e bootloader.ESP) error {
		env, err := e.Env()
		if err != nil {
			return err
		}
		b.args = env[bootloader.EnvKernelArgs]
		if b.trial {
			b.args = env[bootloader.EnvTrialArgs]
		}
		return nil
	}); err != nil {
		fmt.Fprintf(log, "liken-init: reading the boot loader's environment: %v\n", err)
	}
	return b
}

// withESP mounts the ESP for fn, through init's one owner of it.
func (b *bootControl) withESP(fn func(bootloader.ESP) error) error { return b.esp.with(fn) }

// record updates this boot's entry in the boot log; failures are printed, never fatal.
func (b *bootControl) record(change func(*state.BootRecord)) {
	if err := b.update(change); err != nil {
		fmt.Fprintf(b.log, "liken-init: boot log: %v\n", err)
	}
}

// update updates this boot's entry in the boot log.
func (b *bootControl) update(change func(*state.BootRecord)) error {
	b.recordMu.Lock()
	defer b.recordMu.Unlock()
	return b.boots.Update(b.bootID, change)
}

func (b *bootControl) setReport(r state.BootReport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.report = &r
}

func (b *bootControl) setLayer(digest string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.layerDigest = digest
}

func (b *bootControl) setRole(r v1alpha1.Role) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.role = r
}

// Info implements supervisor.Boot.
func (b *bootControl) Info() (supervisor.BootInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	info := supervisor.BootInfo{Slot: b.slot, Trial: b.trial, Committed: b.committed, Version: b.version,
		KernelArgs: b.args, BootID: b.bootID, RebootPending: b.rebootPending, BootTime: b.bootTime, K3s: readTrim("/etc/liken/k3s-version"), LayerDigest: b.layerDigest, Role: b.role, Report: b.report}
	if standIn() {
		info.K3s = "stand-in"
	}
	err := b.withESP(func(e bootloader.ESP) error {
		env, err := e.Env()
		if err != nil {
			return err
		}
		info.DefaultSlot = env[bootloader.EnvDefaultSlot]
		if info.DefaultSlot != bootloader.SlotB {
			info.DefaultSlot = bootloader.SlotA
		}
		info.Slots, err = e.Slots()
		return err
	})
	if err != nil {
		return info, err
	}
	info.Boots, err = b.boots.Load()
	return info, err
}

// SetSlot implements supervisor.Boot. The slot this machine runs and the slot it falls back
// to both hold releases that must stay; during a trial that is both slots.
func (b *bootControl) SetSlot(slot string, r bootloader.SlotRecord) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if slot != bootloader.SlotA && slot != bootloader.SlotB {
		return fmt.Errorf("no slot %q (A or B)", slot)
	}
	if slot == b.slot {
		return fmt.Errorf("slot %s is running: it cannot be rewritten", slot)
	}
	if b.rebootPending {
		// The reboot was asked for with the slots as they are (a trial may be armed).
		return fmt.Errorf("a reboot is under way: slot %s is not rewritten before it", slot)
	}
	return b.withESP(func(e bootloader.ESP) error {
		env, err := e.Env()
		if err != nil {
			return err
		}
		if b.trial && !b.committed && env[bootloader.EnvDefaultSlot] == slot {
			return fmt.Errorf("slot %s is the last good slot this trial falls back to: it cannot be rewritten", slot)
		}
		return e.SetSlot(slot, r)
	})
}

// Reboot implements supervisor.Boot.
func (b *bootControl) Reboot(r supervisor.RebootRequest) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.trial && !b.committed {
		return errors.New("this boot is an uncommitted trial: it ends by its commit or its health deadline")
	}
	if b.rebootPending {
		return errors.New("a reboot is already under way")
	}
	if r.TrialSlot != "" {
		if r.TrialSlot != bootloader.SlotA && r.TrialSlot != bootloader.SlotB {
			return fmt.Errorf("no slot %q (A or B)", r.TrialSlot)
		}
		recorded := false
		err := b.withESP(func(e bootloader.ESP) error {
			slots, err := e.Slots()
			if err != nil {
				return err
			}
			if rec := slots[r.TrialSlot]; rec.State != bootloader.SlotReady {
				return fmt.Errorf("slot %s holds no verified release (%s): it is not tried", r.TrialSlot, rec.State)
			}
			// Recorded before it is armed: a power cut between the two leaves a record of a
			// trial that may not have run, which the agent counts as failed, never a trial
			// that ran unrecorded and is forgotten.
			if err := b.update(func(rec *state.BootRecord) { rec.Armed = r.TrialSlot }); err != nil {
				return fmt.Errorf("recording the trial in the boot log: %w", err)
			}
			recorded = true
			return e.UpdateEnv(func(env bootloader.Env) {
				env[bootloader.EnvTrialSlot] = r.TrialSlot
				env[bootloader.EnvTrialArgs] = r.TrialArgs
			})
		})
		if err != nil {
			// The error may come after the environment was written (a failed sync or
			// unmount): the record is cleared only when the environment is read back without
			// the trial.
			if recorded {
				armedAfterAll := true
				if rerr := b.withESP(func(e bootloader.ESP) error {
					env, err := e.Env()
					armedAfterAll = err != nil || env[bootloader.EnvTrialSlot] == r.TrialSlot
					return err
				}); rerr == nil && !armedAfterAll {
					b.record(func(rec *state.BootRecord) { rec.Armed = "" })
				}
			}
			return fmt.Errorf("arming the trial of slot %s: %w", r.TrialSlot, err)
		}
		fmt.Fprintf(b.log, "liken-init: the next boot tries slot %s once (kernel arguments %q)\n", r.TrialSlot, r.TrialArgs)
	}
	b.rebootPending = true
	why := r.Why
	if why == "" {
		why = "asked by the agent"
	}
	b.reboot(why)
	return nil
}

// FailTrial implements supervisor.Boot: the agent found the trial unfit before its deadline
// (its gates failed, or no peer reached a server on its new network). The boot loader made
// the last good slot the next boot already, when it started this trial, so a reboot is the
// fallback; the record says why, before it.
func (b *bootControl) FailTrial(end, message string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	why, ok := state.AgentEnds[end]
	if !ok {
		return fmt.Errorf("a trial cannot end %q", end)
	}
	switch {
	case !b.trial:
		return errors.New("this boot is not a trial")
	case b.committed:
		return errors.New("this trial is committed already: it is the default slot, and a rollback is an upgrade to the other slot")
	case b.rebootPending:
		return errors.New("a reboot is already under way")
	}
	if message == "" {
		message = "the agent ended it"
	}
	b.record(func(r *state.BootRecord) { r.End, r.Message = end, message })
	fmt.Fprintf(b.log, "liken-init: trial of slot %s ended by the agent (%s): %s; rebooting into the last good slot\n", b.slot, why, message)
	b.rebootPending = true
	close(b.failedCh)
	b.reboot(why)
	return nil
}

// Commit implements supervisor.Boot: the trial's slot and kernel arguments become the
// default.
func (b *bootControl) Commit() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.trial {
		return errors.New("this boot is not a trial")
	}
	if b.committed {
		return nil
	}
	select {
	case <-b.failedCh:
		return errors.New("the agent ended this trial (its gates failed, or no peer reached it): it is not committed")
	default:
	}
	err := b.withESP(func(e bootloader.ESP) error {
		return e.UpdateEnv(func(env bootloader.Env) {
			env[bootloader.EnvDefaultSlot] = b.slot
			env[bootloader.EnvKernelArgs] = b.args
			env[bootloader.EnvTrialSlot], env[bootloader.EnvTrialArgs] = "", ""
		})
	})
	if err != nil {
		return fmt.Errorf("committing the trial of slot %s: %w", b.slot, err)
	}
	b.committed = true
	close(b.committedCh)
	b.record(func(r *state.BootRecord) { r.Reached = state.ReachedCommitted })
	fmt.Fprintf(b.log, "liken-init: trial of slot %s committed: it is the default now\n", b.slot)
	return nil
}
