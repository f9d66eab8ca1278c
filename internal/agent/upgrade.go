package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
	"liken.dev/liken/internal/tuf"
)

// Boot is init's control of the boot loader, over its socket (supervisor.Client): what the
// machine booted, what each slot holds, trials and reboots.
type Boot interface {
	BootInfo(ctx context.Context) (*supervisor.BootInfo, error)
	SetSlot(ctx context.Context, slot string, r bootloader.SlotRecord) error
	Reboot(ctx context.Context, r supervisor.RebootRequest) error
	CommitTrial(ctx context.Context) error
	// FailTrial ends this uncommitted trial now: init reboots into the last good slot, its
	// boot log saying end (state.EndGatesFailed or state.EndPeersUnreachable) and message.
	FailTrial(ctx context.Context, end, message string) error
}

// SlotDevice says where a slot's bytes live: its partition, or its region of a disk image.
type SlotDevice func(slot string) (release.PartitionTarget, error)

// slotJob writes (or checks) the inactive slot in the background; reconcile passes read its
// progress and outcome.
type slotJob struct {
	slot, version, digest string
	verifyOnly            bool
	src                   channelSource
	cancel                context.CancelFunc
	// exited is closed when the job's goroutine has returned.
	exited chan struct{}

	mu          sync.Mutex
	done, total int64
	finished    bool
	err         error
}

func (j *slotJob) progress() (done, total int64, finished bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.done, j.total, j.finished, j.err
}

// upgradeView is what one reconcile pass found about releases, for status.
type upgradeView struct {
	status  v1alpha1.UpgradeStatus
	release *v1alpha1.RunningRelease
	// staged: the inactive slot holds the wanted release, verified this boot.
	staged bool
	// releaseReady: a reboot now would run the wanted release, because it runs already or
	// is staged. A reboot for other changes waits for it, so one approval covers both.
	releaseReady bool
	// trialSlot and trialArgs are what a reboot now would try; empty slot: a plain reboot.
	trialSlot, trialArgs string
	// trialSettings is the hash (state.TrialHash) of the network and k3s data disks a reboot
	// now would try, when they are not the last good ones (fromSettings); empty: the reboot
	// keeps them.
	trialSettings, fromSettings string
	// settingsFailed: the spec's network and k3s data disks failed their trial here; they
	// are not tried again, and the disks wait with them. settingsFailedFields are the fields
	// whose values were in that trial.
	settingsFailed       bool
	settingsFailedFields []string
	wantVersion, digest  string
	// failed is the failure to report in UpgradeFailed, if the wanted release or arguments
	// failed their trial.
	failed *v1alpha1.FailedRelease
	// releaseRefused: the wanted release was refused before its trial, as untrusted.
	releaseRefused *releaseRefusal
}

// releaseRefusal is a release the agent would not write: one the channel's publisher did not
// sign (ReasonReleaseNotSigned) or whose bytes are not the pin's (ReasonReleaseVerifyFailed).
type releaseRefusal struct {
	digest, Reason, message string
}

// wanted is the release this machine should run: its own override, else the Cluster's.
func wanted(m *v1alpha1.Machine, c *v1alpha1.Cluster) (version, digest string) {
	version = string(c.Spec.Version)
	if m.Spec.Version != "" {
		version = string(m.Spec.Version)
	}
	return version, string(c.Spec.Releases[version])
}

// specArgs are the Cluster's and the Machine's kernel arguments, as the boot loader holds them.
func specArgs(c *v1alpha1.Cluster, m *v1alpha1.Machine) string {
	return bootloader.JoinArgs(c.Spec.KernelArgs, m.Spec.KernelArgs)
}

// groundStaged makes the applied release and kernel arguments what this boot really runs,
// so status.pending lists them exactly when the machine does not run what the spec asks.
func (a *Agent) groundStaged(applied *change.Spec, m *v1alpha1.Machine, c *v1alpha1.Cluster) {
	bi := a.bootInfo
	if bi == nil {
		return
	}
	running := bi.Slots[bi.Slot]
	_, want := wanted(m, c)
	if running.Digest != want {
		if m.Spec.Version != "" {
			applied.Machine.Version = v1alpha1.ReleaseVersion(running.Version)
			applied.Cluster.Version = c.Spec.Version
		} else {
			applied.Cluster.Version = v1alpha1.ReleaseVersion(running.Version)
			applied.Machine.Version = ""
		}
	} else {
		applied.Cluster.Version, applied.Machine.Version = c.Spec.Version, m.Spec.Version
	}
	if specArgs(c, m) == bi.KernelArgs {
		applied.Cluster.KernelArgs, applied.Machine.KernelArgs = c.Spec.KernelArgs, m.Spec.KernelArgs
	} else if bootloader.JoinArgs(applied.Cluster.KernelArgs, applied.Machine.KernelArgs) != bi.KernelArgs {
		// What ran before is not known field by field: show it all as the Cluster's.
		applied.Cluster.KernelArgs, applied.Machine.KernelArgs = splitArgs(bi.KernelArgs), nil
	}
}

func splitArgs(s string) []v1alpha1.KernelArg {
	var out []v1alpha1.KernelArg
	for _, f := range strings.Fields(s) {
		out = append(out, v1alpha1.KernelArg(f))
	}
	return out
}

// promoteBootSettings records, on the first pass of a new boot, the boot-time settings init
// applied at this boot, as its report says (internal/initd): the network and the kernel
// modules only when init applied them whole and they are what the agent staged; the match
// init found the machine by. What init could not apply stays pending, and is remembered
// with init's reason. The release and kernel arguments are grounded in what the boot loader
// booted instead (groundStaged). Disks count as applied when init made each one ready.
func (a *Agent) promoteBootSettings() error {
	bi := a.bootInfo
	if bi == nil || bi.BootID == a.st.BootID {
		return nil
	}
	a.st.NotAppliedAtBoot = nil
	if a.st.Applied != nil && a.st.Staged != nil {
		staged := *a.st.Staged
		promoted, err := change.Keep(staged, *a.st.Applied, func(fc v1alpha1.FieldClass) bool { return fc.Path == "machine.spec.match" })
		if err != nil {
			return err
		}
		if rep := bi.Report; rep != nil {
			for _, f := range []struct {
				field       string
				ran, wanted any
				promote     func()
			}{
				{"machine.spec.network", rep.Network, staged.Machine.Network, func() { promoted.Machine.Network = staged.Machine.Network }},
				{"machine.spec.kernelModules", rep.KernelModules, staged.Machine.KernelModules, func() { promoted.Machine.KernelModules = staged.Machine.KernelModules }},
				{"machine.spec.disks", rep.Disks, staged.Machine.Disks, func() { promoted.Machine.Disks = staged.Machine.Disks }},
				{"cluster.spec.features.swap", rep.Swap, staged.Cluster.Features.Swap, func() { promoted.Cluster.Features.Swap = staged.Cluster.Features.Swap }},
			} {
				switch why := rep.NotApplied[f.field]; {
				case why != "":
					a.st.NotAppliedAtBoot = append(a.st.NotAppliedAtBoot, state.NotAppliedAtBoot{Field: f.field, Reason: why, BootID: bi.BootID, Spec: staged})
				case sameJSON(f.ran, f.wanted):
					f.promote()
				default:
					a.log.Warn("this boot ran without the staged value; it stays pending", "field", f.field)
				}
			}
			if _, failed := rep.NotApplied["machine.spec.network"]; !failed {
				// What runs is applied, whatever a trial before promoted.
				promoted.Machine.Network = rep.Network
			}
		}
		a.st.Applied = &promoted
	}
	if rep := bi.Report; rep != nil && (!bi.Trial || bi.Committed) {
		// Outside a trial, the network init applied whole is the one to fall back to, and
		// the disks it ran with.
		if _, failed := rep.NotApplied["machine.spec.network"]; !failed {
			a.st.GoodNetwork = &state.GoodNetwork{Network: rep.Network}
		}
		a.st.GoodDisks = &state.GoodDisks{Disks: rep.Disks}
	}
	a.st.BootID = bi.BootID
	return a.cfg.State.Save(a.st)
}

func sameJSON(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// notAppliedAtBoot are the boot-time settings init could not apply at this boot whose value
// the spec still asks for, each with init's reason.
func (a *Agent) notAppliedAtBoot(desired change.Spec) map[string]string {
	out := map[string]string{}
	for _, n := range a.st.NotAppliedAtBoot {
		changes, err := change.Diff(n.Spec, desired)
		if err != nil {
			continue
		}
		same := true
		for _, ch := range changes {
			if ch.Field == n.Field {
				same = false
			}
		}
		if same {
			out[n.Field] = n.Reason
		}
	}
	return out
}

// loadBoot asks init what this boot is, once per change of what init knows.
func (a *Agent) loadBoot(ctx context.Context) error {
	if a.cfg.Boot == nil {
		return nil
	}
	bi, err := a.cfg.Boot.BootInfo(ctx)
	if errors.Is(err, supervisor.ErrNoBootControl) {
		a.log.Warn("init has no boot loader control: releases, trials and reboots are not managed on this host")
		a.cfg.Boot = nil
		return nil
	}
	if err != nil {
		return err
	}
	a.bootInfo, a.bootInfoAt = bi, a.cfg.Now()
	return nil
}

// resolveAttempt settles the trial armed before the last reboot: committed (or still to be
// committed, if this boot is that trial) or fallen back, with the reason the boot log gives.
func (a *Agent) resolveAttempt(m *v1alpha1.Machine) error {
	at, bi := a.st.Attempt, a.bootInfo
	if at == nil || bi == nil || bi.BootID == at.BootID {
		return nil // no trial, or the reboot has not happened yet
	}
	// A trial of network or disk settings alone boots the same slot with the same arguments
	// as the boot after its failure: the boot log says whether it committed.
	if bi.Slot == at.Slot && bi.KernelArgs == at.KernelArgs && (at.Network == "" || bi.Trial || at.Committed(bi.Boots)) {
		if bi.Trial && !bi.Committed {
			return nil // this boot is the trial: commitTrial settles it
		}
		// Committed, by this agent before it restarted or by the boot log.
		return a.settleCommitted(at, bi.Report)
	}
	if !armed(at, bi.Boots) {
		// The agent stopped between remembering the trial and init arming it: no trial ran.
		a.log.Warn("the trial remembered was never armed; forgetting it", "slot", at.Slot, "version", at.Version)
		a.st.Attempt = nil
		return a.cfg.State.Save(a.st)
	}
	reason, msg := trialFailure(at, bi.Boots)
	if at.Waiting != "" && reason != v1alpha1.ReasonPeersUnreachable { // whose message says it
		msg += "; the agent was waiting: " + at.Waiting
	}
	now := metav1.NewTime(a.cfg.Now().UTC().Truncate(time.Second))
	what := []string{}
	if at.Digest != at.FromDigest {
		a.forgetFailure(at.Digest)
		// A failure while spec.retryFailedDigest names the digest uses up that setting, whether
		// the setting allowed this trial or was made before the release first failed.
		retried := at.Retry || string(m.Spec.RetryFailedDigest) == at.Digest
		a.st.FailedReleases = append(a.st.FailedReleases, v1alpha1.FailedRelease{Digest: at.Digest, Version: at.Version, Reason: reason, Message: msg, At: now, Retried: retried})
		what = append(what, fmt.Sprintf("release %s in slot %s", at.Version, at.Slot))
	}
	if at.KernelArgs != at.FromKernelArgs {
		a.st.FailedKernelArgs = &state.FailedArgs{Args: at.KernelArgs, Reason: reason, Message: msg, At: now}
		what = append(what, fmt.Sprintf("kernel arguments %q", at.KernelArgs))
	}
	if at.Network != "" && at.Network != at.FromNetwork {
		a.st.FailedNetwork = &state.FailedArgs{Args: at.Network, Reason: reason, Message: msg, At: now}
		what = append(what, a.settingsTried(m))
	}
	a.st.Attempt = nil
	if err := a.cfg.State.Save(a.st); err != nil {
		return err
	}
	text := fmt.Sprintf("the trial of %s failed (%s: %s); the machine is back on slot %s", strings.Join(what, " and "), reason, msg, bi.Slot)
	a.log.Warn(text)
	a.events.Event(m, corev1.EventTypeWarning, "TrialFailed", text)
	return nil
}

// settleCommitted records a committed trial: its release and kernel arguments are failures
// no more, and the network and disks this boot runs with (rep, init's report) are the last
// good ones, whatever the trial was for.
func (a *Agent) settleCommitted(at *state.Attempt, rep *state.BootReport) error {
	a.forgetFailure(at.Digest)
	if fa := a.st.FailedKernelArgs; fa != nil && fa.Args == at.KernelArgs {
		a.st.FailedKernelArgs = nil
	}
	if rep != nil {
		a.st.GoodNetwork = &state.GoodNetwork{Network: rep.Network}
		a.st.GoodDisks = &state.GoodDisks{Disks: rep.Disks}
		if fn := a.st.FailedNetwork; fn != nil && fn.Args == at.Network {
			a.st.FailedNetwork = nil
		}
	}
	a.st.Attempt = nil
	return a.cfg.State.Save(a.st)
}

func (a *Agent) forgetFailure(digest string) {
	out := a.st.FailedReleases[:0]
	for _, f := range a.st.FailedReleases {
		if f.Digest != digest {
			out = append(out, f)
		}
	}
	a.st.FailedReleases = out
}

func (a *Agent) failedRelease(digest string) *v1alpha1.FailedRelease {
	for i := range a.st.FailedReleases {
		if a.st.FailedReleases[i].Digest == digest {
			return &a.st.FailedReleases[i]
		}
	}
	return nil
}

// goodNetwork is the network the machine falls back to: the last one it ran outside a
// trial, or committed in one.
func (a *Agent) goodNetwork() *v1alpha1.MachineNetwork {
	if g := a.st.GoodNetwork; g != nil {
		return g.Network
	}
	if a.st.Applied != nil {
		return a.st.Applied.Machine.Network
	}
	return nil
}

// goodDisks are the disks the machine falls back to, as goodNetwork is its network; before
// any is recorded, the disks this boot runs with.
func (a *Agent) goodDisks() []v1alpha1.Disk {
	if g := a.st.GoodDisks; g != nil {
		return g.Disks
	}
	if bi := a.bootInfo; bi != nil && bi.Report != nil {
		return bi.Report.Disks
	}
	if a.st.Applied != nil {
		return a.st.Applied.Machine.Disks
	}
	return nil
}

// trialFields are the fields of m's settings tried only in a trial boot that differ from the
// last good ones: machine.spec.network, machine.spec.disks (the disks k3s's data needs), both
// or none.
func (a *Agent) trialFields(m *v1alpha1.Machine) []string {
	var fields []string
	if state.NetworkHash(m.Spec.Network) != state.NetworkHash(a.goodNetwork()) {
		fields = append(fields, "machine.spec.network")
	}
	if state.TrialHash(nil, m.Spec.Disks) != state.TrialHash(nil, a.goodDisks()) {
		fields = append(fields, "machine.spec.disks")
	}
	return fields
}

// settingsTried names, for a message, what trialFields says differs.
func (a *Agent) settingsTried(m *v1alpha1.Machine) string {
	var what []string
	for _, f := range a.trialFields(m) {
		switch f {
		case "machine.spec.network":
			what = append(what, "the network settings of spec.network")
		case "machine.spec.disks":
			what = append(what, "the disks of spec.disks that k3s's data needs")
		}
	}
	if len(what) == 0 {
		return "the network and disk settings"
	}
	return strings.Join(what, " and ")
}

// armed reports whether init armed the attempt's trial, by the arming boot's record. A log
// that no longer holds that boot (16 boots later) counts as armed.
func armed(at *state.Attempt, boots []state.BootRecord) bool {
	for _, b := range boots {
		if b.ID == at.BootID {
			return b.Armed == at.Slot
		}
	}
	return true
}

// trialFailure reads init's boot log for why the trial after at failed. The trial boot
// may have said (a missed health deadline, a failed init); the boot after it may have found
// a panic's log in the firmware's store or a watchdog reset; else the trial stopped without
// a word: power lost, or a reset.
func trialFailure(at *state.Attempt, boots []state.BootRecord) (reason, msg string) {
	start := -1
	for i, b := range boots {
		if b.ID == at.BootID {
			start = i
		}
	}
	after := boots[start+1:]
	var trial *state.BootRecord
	var next []state.BootRecord
	for i := range after {
		if trial == nil && after[i].Slot == at.Slot && after[i].Trial {
			trial = &after[i]
			next = after[i+1:]
		}
	}
	if trial == nil {
		next = after
	}
	if trial != nil {
		switch trial.End {
		case state.EndHealthDeadline:
			return v1alpha1.ReasonHealthDeadline, "the trial boot was not healthy in time: " + trial.Message
		case state.EndInitFailed:
			return v1alpha1.ReasonInitFailed, "liken's init failed in the trial boot: " + trial.Message
		case state.EndGatesFailed:
			return v1alpha1.ReasonGateFailed, "the trial boot was healthy, but its gates failed: " + trial.Message
		case state.EndPeersUnreachable:
			return v1alpha1.ReasonPeersUnreachable, "the trial boot was healthy by its own account, but no peer reached it: " + trial.Message
		}
	}
	if len(next) > 0 {
		n := next[0]
		switch {
		case strings.Contains(n.Panic, "Attempted to kill init"):
			return v1alpha1.ReasonInitFailed, "init exited and the kernel panicked: " + firstLine(n.Panic)
		case n.Panic != "":
			return v1alpha1.ReasonKernelPanic, "the kernel panicked: " + firstLine(n.Panic)
		case n.WatchdogReset:
			return v1alpha1.ReasonWatchdog, "the machine stopped responding and the watchdog reset it"
		}
	}
	if trial == nil {
		return v1alpha1.ReasonTrialFailed, "the trial boot never reached liken's init (the kernel or the initramfs failed, or power was lost)"
	}
	return v1alpha1.ReasonBootInterrupted, fmt.Sprintf("the trial boot reached stage %q and then stopped without a word: power lost or the machine reset", trial.Reached)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// upgrade works out where the machine stands against the wanted release and moves it on:
// starts writing or checking the inactive slot, and says what a reboot would try.
func (a *Agent) upgrade(ctx context.Context, m *v1alpha1.Machine, c *v1alpha1.Cluster, out *outcome) *upgradeView {
	v := &upgradeView{status: v1alpha1.UpgradeStatus{State: v1alpha1.UpgradeIdle, FailedReleases: append([]v1alpha1.FailedRelease(nil), a.st.FailedReleases...)}}
	v.status.WantedVersion, _ = wanted(m, c)
	bi := a.bootInfo
	if a.cfg.Boot == nil || bi == nil {
		v.status.Message = "this machine was not booted by liken's init: releases and reboots are not managed here"
		return v
	}
	running := bi.Slots[bi.Slot]
	// To the second, as the API stores a time: a finer one never equals the status read
	// back, and the same status would be written again on every pass.
	v.release = &v1alpha1.RunningRelease{Version: bi.Version, Digest: running.Digest, Slot: v1alpha1.Slot(bi.Slot),
		LastGoodSlot: v1alpha1.Slot(bi.DefaultSlot), Trial: bi.Trial && !bi.Committed, BootTime: &metav1.Time{Time: bi.BootTime.Truncate(time.Second)}, K3s: bi.K3s, LayerDigest: bi.LayerDigest}
	if bi.Trial && bi.Committed {
		v.release.LastGoodSlot = v1alpha1.Slot(bi.Slot)
	}
	if running.Version != "" {
		v.release.Version = running.Version
	}
	args := specArgs(c, m)
	v.trialArgs = args
	if fa := a.st.FailedKernelArgs; fa != nil && fa.Args == args {
		v.trialArgs = bi.KernelArgs // not tried again until the spec changes them
		v.failed = &v1alpha1.FailedRelease{Reason: fa.Reason, Message: fmt.Sprintf("kernel arguments %q failed their trial: %s", fa.Args, fa.Message), At: fa.At}
		// For the coordinator, which halts a rollout of the same arguments after
		// spec.rollout.maxFailures such failures.
		v.status.FailedKernelArgs = &v1alpha1.FailedArgs{Args: fa.Args, Reason: fa.Reason, Message: fa.Message, At: fa.At}
	}
	v.fromSettings = state.TrialHash(a.goodNetwork(), a.goodDisks())
	h := state.TrialHash(m.Spec.Network, m.Spec.Disks)
	if fn := a.st.FailedNetwork; fn != nil && fn.Args != h {
		// The spec moved on: settings that failed once may be asked for again, and tried.
		a.st.FailedNetwork = nil
	}
	if h != v.fromSettings {
		if fn := a.st.FailedNetwork; fn != nil && fn.Args == h {
			// Not tried again until the spec asks for other settings.
			v.failed = &v1alpha1.FailedRelease{Reason: fn.Reason, Message: a.settingsTried(m) + " failed their trial; the machine runs its last good ones: " + fn.Message, At: fn.At}
			v.settingsFailed = true
			v.settingsFailedFields = a.trialFields(m)
		} else {
			v.trialSettings = h
		}
	}
	version, digest := wanted(m, c)
	v.wantVersion, v.digest = version, digest
	switch {
	case version == "":
		v.status.Message = "no release version is set"
		a.stopJob()
		v.releaseReady = true // a reboot for other changes runs the same release
		return v
	case digest == "":
		out.failures["version"] = fmt.Sprintf("release %s is not pinned in the Cluster's spec.releases", version)
		v.status.Message = out.failures["version"]
		a.stopJob()
		v.releaseReady = true // a reboot for other changes runs the same release
		return v
	}
	v.status.TargetVersion, v.status.TargetDigest = version, digest
	if a.rebooting {
		// The reboot is armed with the slots as they are: a spec change from now on waits
		// for the next boot, and no slot job starts (stopJob waited for any running one).
		v.status.Message = "the machine is going down for its reboot; changes made now are acted on after it"
		return v
	}
	if v.release.Trial {
		v.status.State, v.status.TargetSlot = v1alpha1.UpgradeTrial, v1alpha1.Slot(bi.Slot)
		v.status.Message = fmt.Sprintf("trial boot of slot %s: it becomes the default once k3s is healthy and the Node Ready on this boot", bi.Slot)
		if c != nil && c.Spec.Rollout.CommitsAfterGates() {
			v.status.Message += ", and its gates pass (spec.rollout.commitAfterGates)"
		}
		if a.trialWaiting != "" {
			v.status.Message += "; " + a.trialWaiting
		}
		return v
	}
	if running.Digest == digest {
		a.stopJob()
		v.releaseReady = true
		v.status.TargetSlot = v1alpha1.Slot(bi.Slot)
		v.status.Message = fmt.Sprintf("running release %s from slot %s", version, bi.Slot)
		if v.trialArgs != bi.KernelArgs || v.trialSettings != "" {
			v.trialSlot = bi.Slot // new kernel arguments, network or k3s data disks boot as a trial of this slot
		}
		return v
	}
	target := bootloader.Other(bi.Slot)
	v.status.TargetSlot = v1alpha1.Slot(target)
	if f := a.failedRelease(digest); f != nil && !a.retryAllowed(m, digest) {
		a.stopJob()
		v.status.State = v1alpha1.UpgradeFellBack
		v.status.Message = fmt.Sprintf("release %s failed its trial on %s (%s: %s); it is tried again only when spec.retryFailedDigest names %s (once per setting)",
			version, f.At.Format(time.RFC3339), f.Reason, f.Message, digest)
		if f.Retried {
			v.status.Message = fmt.Sprintf("release %s failed again on %s, in the retry spec.retryFailedDigest allowed (%s: %s); to try once more, clear spec.retryFailedDigest, wait until this failure no longer shows retried, and set it again",
				version, f.At.Format(time.RFC3339), f.Reason, f.Message)
		}
		v.failed = f
		// Not retried, so it holds back no reboot for other changes or a request.
		v.releaseReady = true
		return v
	}
	rec := bi.Slots[target]
	if rec.Holds(digest) && a.verified[target] == digest {
		v.status.State, v.staged, v.releaseReady, v.trialSlot = v1alpha1.UpgradeStaged, true, true, target
		v.status.Message = fmt.Sprintf("slot %s holds release %s, verified; it boots as a trial at the next reboot", target, version)
		return v
	}
	if r := a.jobRefused; r != nil && r.digest == digest {
		v.releaseRefused = r
	}
	verifyOnly := rec.Holds(digest)
	j := a.job
	if j != nil && (j.slot != target || j.digest != digest || j.verifyOnly != verifyOnly) {
		a.stopJob()
		j = nil
	}
	if j == nil {
		// The pause after a failure is kept for the same release from the same channel; an
		// edit of the channel's settings (its CA, its root) is tried at once.
		if wait := a.jobRetryAt.Sub(a.cfg.Now()); wait > 0 && a.jobRetryDigest == digest && a.jobRetrySource == sourceOf(c) {
			a.queue.AddAfter(keyReconcile, wait)
		} else {
			j = a.startJob(ctx, m, c, target, version, digest, verifyOnly)
		}
	}
	v.status.State = v1alpha1.UpgradeDownloading
	if j == nil {
		v.status.Message = fmt.Sprintf("writing release %s into slot %s failed; retrying at %s: %s", version, target, a.jobRetryAt.Format(time.RFC3339), a.jobLastErr)
		return v
	}
	done, total, _, _ := j.progress()
	v.status.BytesDone, v.status.BytesTotal = done, total
	if verifyOnly {
		v.status.Message = fmt.Sprintf("checking slot %s's bytes against release %s", target, version)
	} else {
		v.status.Message = fmt.Sprintf("writing release %s into slot %s, verified as it streams", version, target)
	}
	return v
}

// stopJob stops the slot job and waits until it has stopped: nothing writes a slot after
// this returns (the reboot path relies on it).
func (a *Agent) stopJob() {
	if a.job != nil {
		a.job.cancel()
		<-a.job.exited
		a.job = nil
	}
}

// startJob writes the release into slot (or checks the slot's bytes) in the background.
func (a *Agent) startJob(ctx context.Context, m *v1alpha1.Machine, c *v1alpha1.Cluster, slot, version, digest string, verifyOnly bool) *slotJob {
	jctx, cancel := context.WithCancel(ctx)
	j := &slotJob{slot: slot, version: version, digest: digest, verifyOnly: verifyOnly, cancel: cancel, exited: make(chan struct{})}
	a.job = j
	src := sourceOf(c)
	j.src = src
	rec := a.bootInfo.Slots[slot]
	obj := m.DeepCopy()
	go func() {
		defer close(j.exited)
		var err error
		if verifyOnly {
			err = a.checkSlot(jctx, j, rec)
		} else {
			err = a.writeSlot(jctx, j, src, obj, rec)
		}
		j.mu.Lock()
		j.finished, j.err = true, err
		j.mu.Unlock()
		a.queue.Add(keyJob)
	}()
	return j
}

// channelSource is the Cluster's channel as a slot job reads it: its URL, the root its
// signatures chain to (or the operator's choice of none), and the CAs its server may use.
type channelSource struct {
	url, root string
	unsigned  bool
	ca        string
}

func sourceOf(c *v1alpha1.Cluster) channelSource {
	return channelSource{url: string(c.Spec.Channel), root: string(c.Spec.ChannelRoot), unsigned: c.Spec.InsecureUnsignedChannel, ca: c.Spec.ChannelCA}
}

// writeSlot fetches the release's slot image into the slot, every byte hashed as it is
// written. The slot is recorded as being written first, so a power cut leaves no record that
// claims a release.
func (a *Agent) writeSlot(ctx context.Context, j *slotJob, src channelSource, m *v1alpha1.Machine, prev bootloader.SlotRecord) error {
	f := a.cfg.Fetcher
	if f == nil {
		f = &release.Fetcher{}
	}
	fetcher := *f
	channel, root := src.url, src.root
	if err := channelTrusted(root, src.unsigned); err != nil {
		return fmt.Errorf("release %s is not written: %w", j.version, err)
	}
	if src.ca != "" {
		pool, err := release.TrustPool(src.ca)
		if err != nil {
			return fmt.Errorf("release %s is not written: spec.channelCA: %w", j.version, err)
		}
		fetcher.RootCAs = pool
	}
	if root != "" {
		// The pin must be what the channel's publisher signed, before anything of the
		// release is fetched. What was trusted is kept beside the agent's state, so a
		// channel rolled back to older metadata is refused.
		if err := tuf.VerifyRelease(ctx, &fetcher, channel, root, j.version, j.digest, filepath.Join(a.cfg.State.Dir, "tuf")); err != nil {
			return fmt.Errorf("release %s is not written: %w", j.version, err)
		}
	}
	doc, _, err := fetcher.Document(ctx, channel, j.version, j.digest)
	if err != nil {
		return err
	}
	file := doc.File(apirelease.RoleSlot)
	if file == nil {
		return fmt.Errorf("release %s has no slot image", j.version)
	}
	target, err := a.cfg.SlotDevice(j.slot)
	if err != nil {
		return err
	}
	if file.Size > target.Size {
		return fmt.Errorf("release %s's slot image (%d bytes) does not fit slot %s (%d bytes)", j.version, file.Size, j.slot, target.Size)
	}
	now := time.Now().UTC().Truncate(time.Second)
	if err := a.cfg.Boot.SetSlot(ctx, j.slot, bootloader.SlotRecord{State: bootloader.SlotWriting, Version: j.version, Digest: j.digest, At: now}); err != nil {
		return err
	}
	if prev.State == bootloader.SlotWriting {
		a.events.Eventf(m, corev1.EventTypeWarning, "SlotWriteInterrupted", "the last write of release %s into slot %s never finished (power lost or the machine reset): writing it again", prev.Version, j.slot)
	}
	a.log.Info("writing a release into the inactive slot", "slot", j.slot, "version", j.version, "bytes", file.Size)
	a.events.Eventf(m, corev1.EventTypeNormal, "WritingSlot", "writing release %s (%d bytes) into slot %s", j.version, file.Size, j.slot)
	j.mu.Lock()
	j.total = file.Size
	j.mu.Unlock()
	var last time.Time
	fetcher.Progress = func(p release.Progress) {
		j.mu.Lock()
		j.done = p.Done
		j.mu.Unlock()
		if time.Since(last) > 2*time.Second {
			last = time.Now()
			a.queue.Add(keyReconcile) // status shows the progress
		}
	}
	if err := fetcher.File(ctx, channel, j.version, *file, target); err != nil {
		return err
	}
	rec := bootloader.SlotRecord{State: bootloader.SlotReady, Version: j.version, Digest: j.digest, SHA256: file.SHA256, Size: file.Size, At: time.Now().UTC().Truncate(time.Second)}
	if err := a.cfg.Boot.SetSlot(ctx, j.slot, rec); err != nil {
		return err
	}
	a.log.Info("slot written and verified", "slot", j.slot, "version", j.version)
	return nil
}

// channelTrusted says whether the Cluster lets a release be written at all: from a signed
// channel whose root it names, or, by the operator's explicit choice, from one taken
// unverified.
func channelTrusted(root string, unsigned bool) error {
	if root == "" && !unsigned {
		return &tuf.VerifyError{Check: tuf.CheckUnsigned, Err: errors.New("the Cluster names no channel root: set spec.channelRoot to the digest of the channel's signed root (liken release keys init prints it), or spec.insecureUnsignedChannel: true to take releases as pinned, unverified")}
	}
	return nil
}

// checkSlot reads a slot back from the disk (not the page cache) and compares it with its
// record, so a slot damaged after it was written is never tried as good.
func (a *Agent) checkSlot(ctx context.Context, j *slotJob, rec bootloader.SlotRecord) error {
	target, err := a.cfg.SlotDevice(j.slot)
	if err != nil {
		return err
	}
	got, err := target.Hash(ctx, rec.Size, func(n int64) {
		j.mu.Lock()
		j.done, j.total = n, rec.Size
		j.mu.Unlock()
	})
	if err != nil {
		return err
	}
	if got != rec.SHA256 {
		bad := rec
		bad.State, bad.At = bootloader.SlotCorrupt, time.Now().UTC().Truncate(time.Second)
		if err := a.cfg.Boot.SetSlot(ctx, j.slot, bad); err != nil {
			return err
		}
		return &corruptSlot{slot: j.slot, version: rec.Version, want: rec.SHA256, got: got}
	}
	return nil
}

type corruptSlot struct{ slot, version, want, got string }

func (e *corruptSlot) Error() string {
	return fmt.Sprintf("slot %s does not hold release %s any more: its bytes hash to sha256:%s, the release says sha256:%s; it will be written again",
		e.slot, e.version, e.got, e.want)
}

// finishJob takes a finished job's outcome: a verified slot, or an error to report and
// retry after a pause.
func (a *Agent) finishJob(ctx context.Context) error {
	j := a.job
	if j == nil {
		return nil
	}
	_, _, finished, err := j.progress()
	if !finished {
		return nil
	}
	a.job = nil
	if rerr := a.loadBoot(ctx); rerr != nil {
		return rerr
	}
	m, _, _, _ := a.observe()
	if err == nil {
		a.verified[j.slot] = j.digest
		if r := a.jobRefused; r != nil && r.digest == j.digest {
			a.jobRefused = nil
		}
		if m != nil {
			a.events.Eventf(m, corev1.EventTypeNormal, "SlotReady", "slot %s holds release %s, verified", j.slot, j.version)
		}
		a.jobLastErr = ""
		a.queue.Add(keyReconcile)
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	var corrupt *corruptSlot
	if errors.As(err, &corrupt) {
		a.queue.Add(keyReconcile) // the slot is now recorded corrupt: write it again
	} else {
		a.jobRetryAt, a.jobRetryDigest, a.jobRetrySource = a.cfg.Now().Add(30*time.Second), j.digest, j.src
		// A pass now publishes the failure (status, Degraded); the one after the pause retries.
		// Without the first, the failure waited for some unrelated event to be seen.
		a.queue.Add(keyReconcile)
		a.queue.AddAfter(keyReconcile, 30*time.Second)
	}
	a.jobLastErr = err.Error()
	a.log.Error("slot job failed", "slot", j.slot, "version", j.version, "err", err)
	if m != nil {
		reason := "SlotWriteFailed"
		var mm *apirelease.MismatchError
		var ve *tuf.VerifyError
		switch {
		case errors.As(err, &mm):
			reason = v1alpha1.ReasonReleaseVerifyFailed
			a.jobRefused = &releaseRefusal{digest: j.digest, Reason: v1alpha1.ReasonReleaseVerifyFailed, message: err.Error()}
		case errors.As(err, &ve):
			reason = v1alpha1.ReasonReleaseNotSigned
			a.jobRefused = &releaseRefusal{digest: j.digest, Reason: v1alpha1.ReasonReleaseNotSigned, message: err.Error()}
		}
		if corrupt != nil {
			reason = "SlotCorrupt"
		}
		a.events.Event(m, corev1.EventTypeWarning, reason, err.Error())
	}
	return nil
}

// maybeReboot reboots when the machine should and may: a reboot-class change is staged and
// approved, or an operator asked for a reboot. It arms the trial the view names first and
// remembers it, so the next boot can tell how it went.
func (a *Agent) maybeReboot(ctx context.Context, m *v1alpha1.Machine, v *upgradeView, hash string, out *outcome) (bool, error) {
	bi := a.bootInfo
	if a.cfg.Boot == nil || bi == nil || (bi.Trial && !bi.Committed) || a.rebooting {
		return a.rebooting, nil
	}
	// Every reboot, an operator's request included (it is pending like a change), needs a
	// drained disruption-budget turn given for exactly the pending set and, under Manual,
	// an approval of that set (rebootView); it waits while a wanted release is still being
	// written, so one approval covers all of it. A wanted release that failed its trial
	// here is not retried, so it alone is no reason to reboot.
	rebootFields := false
	for _, p := range a.st.Pending {
		rebootFields = rebootFields || (p.Class == v1alpha1.Reboot && !v.notRetried(p.Field))
	}
	if !rebootFields || !v.releaseReady || out.reboot == nil || !out.reboot.mayReboot {
		return false, nil
	}
	asked := &state.RebootAsked{BootID: bi.BootID, PrevApprovedHash: a.st.ApprovedHash, PrevApprovedAt: a.st.ApprovedAt,
		PrevRequest: a.st.LastRequestHandled, PrevRebootTime: a.st.LastRebootTime}
	why := fmt.Sprintf("staged changes %s", hash)
	if p := a.requestPending(m); p != nil {
		r := m.Spec.Reboot.Request
		why = fmt.Sprintf("%s asked for a reboot at %s", orSomeone(r.RequestedBy), r.RequestedAt.UTC().Format(time.RFC3339))
		if r.Reason != "" {
			why += " (" + r.Reason + ")"
		}
		why += fmt.Sprintf("; with staged changes %s", hash)
		t := r.RequestedAt
		a.st.LastRequestHandled = &t
	}
	// Remembered whatever the policy, so no set reboots the machine twice by itself.
	a.st.ApprovedHash, a.st.ApprovedAt = hash, nil
	if a.approved(m, hash) {
		a.st.ApprovedAt = m.Spec.Reboot.Approval.ApprovedAt
		why += ", approved by " + orSomeone(m.Spec.Reboot.Approval.ApprovedBy)
	} else {
		why += ", rebootPolicy Auto"
	}
	why += ", on its disruption-budget turn"
	req := supervisor.RebootRequest{Why: why}
	trialSlot := v.trialSlot
	if trialSlot == "" && (v.trialArgs != bi.KernelArgs || v.trialSettings != "") {
		trialSlot = bi.Slot
	}
	if a.st.GoodNetwork == nil {
		// State from before network trials: what runs now is what a failed trial falls back
		// to, and init must know it before any trial is armed.
		a.st.GoodNetwork = &state.GoodNetwork{Network: a.goodNetwork()}
	}
	if a.st.GoodDisks == nil {
		a.st.GoodDisks = &state.GoodDisks{Disks: a.goodDisks()} // likewise, from before disk trials
	}
	if trialSlot != "" {
		req.TrialSlot, req.TrialArgs = trialSlot, v.trialArgs
		digest, version := bi.Slots[bi.Slot].Digest, bi.Slots[bi.Slot].Version
		if v.staged {
			digest, version = v.digest, v.wantVersion
		}
		a.st.Attempt = &state.Attempt{Slot: trialSlot, Version: version, Digest: digest, KernelArgs: v.trialArgs,
			Retry:    v.staged && a.failedRelease(v.digest) != nil, // the one try the setting allows
			FromSlot: bi.Slot, FromDigest: bi.Slots[bi.Slot].Digest, FromKernelArgs: bi.KernelArgs, BootID: bi.BootID,
			Network: v.trialSettings, FromNetwork: v.fromSettings, Peers: a.peersToWaitFor(ctx, m, v),
			At: metav1.NewTime(a.cfg.Now().UTC().Truncate(time.Second))}
	}
	now := metav1.NewTime(a.cfg.Now().UTC().Truncate(time.Second))
	a.st.LastRebootTime = &now
	a.st.RebootAsked = asked
	since := out.reboot.turnSince
	a.st.RebootedForTurn = &since
	// Remember the trial before arming it: whatever happens next, the boot after can tell.
	if err := a.cfg.State.Save(a.st); err != nil {
		return false, err
	}
	a.log.Info("rebooting", "why", why, "trialSlot", req.TrialSlot, "trialArgs", req.TrialArgs)
	msg := "rebooting: " + why
	if req.TrialSlot != "" {
		msg += fmt.Sprintf("; the next boot tries slot %s once", req.TrialSlot)
	}
	a.events.Event(m, corev1.EventTypeNormal, "Rebooting", msg)
	a.rebooting, out.rebooting = true, true
	// Nothing writes a slot from here on: the trial armed next names the slots as they are.
	a.stopJob()
	a.sayLastWords(ctx, m, out)
	if err := a.cfg.Boot.Reboot(ctx, req); err != nil {
		a.rebooting = false
		a.takeBackReboot()
		a.cfg.State.Save(a.st)
		return false, err
	}
	return true, nil
}

// takeBackReboot undoes what a reboot init never took marked as used: the approval and the
// request are still to be carried out, and no trial was armed.
func (a *Agent) takeBackReboot() {
	r := a.st.RebootAsked
	if r == nil {
		return
	}
	a.st.ApprovedHash, a.st.ApprovedAt, a.st.LastRequestHandled, a.st.LastRebootTime = r.PrevApprovedHash, r.PrevApprovedAt, r.PrevRequest, r.PrevRebootTime
	if at := a.st.Attempt; at != nil && at.BootID == r.BootID {
		a.st.Attempt = nil
	}
	a.st.RebootAsked, a.st.RebootedForTurn = nil, nil
}

// settleRebootAsked, at the agent's start, settles a reboot decided before it: done if this
// is another boot; under way if init has taken it (the agent was restarted as the machine
// went down); otherwise never asked of init (the agent was killed while it said its last
// words), so what it marked as used is taken back and the next pass decides again.
func (a *Agent) settleRebootAsked() error {
	r, bi := a.st.RebootAsked, a.bootInfo
	if r == nil || bi == nil {
		return nil
	}
	switch {
	case bi.BootID != r.BootID:
		a.st.RebootAsked = nil
	case bi.RebootPending:
		a.rebooting = true
		return nil
	default:
		a.log.Warn("the agent stopped after deciding to reboot and before init took the reboot: the approval or request is carried out again")
		a.takeBackReboot()
	}
	return a.cfg.State.Save(a.st)
}

// sayLastWords makes sure what the machine says before it goes down (its status, which
// says Rebooting, and every Event recorded so far, the Rebooting one last) reaches the API
// server before the reboot is asked for, waiting at most LastWords in all: an unreachable
// API server never holds a reboot back. Events not sent by then are kept in the state
// file and sent by the next boot's agent.
func (a *Agent) sayLastWords(ctx context.Context, m *v1alpha1.Machine, out *outcome) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.LastWords)
	defer cancel()
	for try := 0; ; try++ {
		err := a.writeStatus(ctx, m, out)
		if err == nil {
			break
		}
		// Say so in status even when the Machine just changed.
		fresh, gerr := a.liken.Machine(ctx, a.cfg.Machine)
		if !apierrors.IsConflict(err) || gerr != nil || try == 2 {
			a.log.Warn("writing status before the reboot; the next boot writes it again", "err", err)
			break
		}
		m = fresh
	}
	a.keepUnsent(a.events.Flush(ctx))
}

// adoptStatusRecords takes back what the machine's status says it acted on (the request it
// carried out, the approval it used) when the state file has lost it, so neither is acted
// on a second time.
func (a *Agent) adoptStatusRecords(m *v1alpha1.Machine) {
	rs := m.Status.Reboot
	if a.st.LastRequestHandled == nil && rs.LastRequestHandled != nil {
		t := *rs.LastRequestHandled
		a.st.LastRequestHandled = &t
	}
	if a.st.ApprovedHash == "" && rs.ApprovedHash != "" {
		a.st.ApprovedHash = rs.ApprovedHash
		if r := m.Spec.Reboot; r != nil && r.Approval != nil && r.Approval.PendingHash == rs.ApprovedHash {
			a.st.ApprovedAt = r.Approval.ApprovedAt
		}
	}
}

// releasePending makes the pending release entry name digests, not only versions: the
// entry of the field that chooses the release (the Machine's version, else the Cluster's)
// goes from the running "version@digest" to the wanted one, and is there exactly when they
// differ. An approval binds to it through the pending hash, so re-pinning a version to
// another digest makes an earlier approval stale. Without init's boot information (a
// machine liken's init did not boot) the entries stay as the spec's difference has them.
func (a *Agent) releasePending(pending []v1alpha1.PendingChange, m *v1alpha1.Machine, c *v1alpha1.Cluster) []v1alpha1.PendingChange {
	bi := a.bootInfo
	if bi == nil {
		return pending
	}
	out := pending[:0:0]
	for _, p := range pending {
		if p.Field != "cluster.spec.version" && p.Field != "machine.spec.version" {
			out = append(out, p)
		}
	}
	version, digest := wanted(m, c)
	running := bi.Slots[bi.Slot]
	if version == "" || digest == "" || running.Digest == digest {
		return out // an unpinned version is a failure in status, not a pending change
	}
	field := "cluster.spec.version"
	if m.Spec.Version != "" {
		field = "machine.spec.version"
	}
	from, _ := json.Marshal(running.Version + "@" + running.Digest)
	to, _ := json.Marshal(version + "@" + digest)
	p := v1alpha1.PendingChange{Field: field, Class: v1alpha1.Reboot, From: string(from), To: string(to), Since: metav1.NewTime(a.cfg.Now().UTC().Truncate(time.Second))}
	for _, old := range a.st.Pending {
		if old.Field == p.Field && old.From == p.From && old.To == p.To {
			p.Since = old.Since
		}
	}
	return append(out, p)
}

// requestField is the pending entry of an operator's reboot request.
const requestField = "machine.spec.reboot.request"

// requestPending is the pending entry of an operator's reboot request the machine has not
// carried out: it asks for a reboot like a Reboot-class change, so it waits for the same
// approval (bound to the pending hash, which includes it) and the same turn.
func (a *Agent) requestPending(m *v1alpha1.Machine) *v1alpha1.PendingChange {
	if a.cfg.Boot == nil || m.Spec.Reboot == nil || m.Spec.Reboot.Request == nil || a.requestHandled(m) {
		return nil
	}
	r := m.Spec.Reboot.Request
	b, _ := json.Marshal(r)
	return &v1alpha1.PendingChange{Field: requestField, Class: v1alpha1.Reboot, To: string(b), Since: r.RequestedAt}
}

// requestHandled: the machine carried out this request (its state file says so, or, with
// the state file lost, its status), or booted after it was made, which is the reboot it
// asked for whatever caused it. requestedAt is compared with the boot time to the second;
// the operator's and the machine's clocks are assumed to agree that far.
func (a *Agent) requestHandled(m *v1alpha1.Machine) bool {
	at := m.Spec.Reboot.Request.RequestedAt
	same := func(t *metav1.Time) bool { return t != nil && t.Time.Equal(at.Time) }
	if same(a.st.LastRequestHandled) || (a.st.LastRequestHandled == nil && same(m.Status.Reboot.LastRequestHandled)) {
		return true
	}
	bi := a.bootInfo
	return bi != nil && !bi.BootTime.IsZero() && at.Time.Before(bi.BootTime.Truncate(time.Second))
}

func orSomeone(who string) string {
	if who == "" {
		return "an operator"
	}
	return who
}

// approved reports whether an operator approved exactly this pending set and the approval
// has not been used for a reboot yet.
func (a *Agent) approved(m *v1alpha1.Machine, hash string) bool {
	if m.Spec.Reboot == nil || m.Spec.Reboot.Approval == nil || m.Spec.Reboot.Approval.PendingHash != hash {
		return false
	}
	return !a.approvalUsed(m)
}

func (a *Agent) approvalUsed(m *v1alpha1.Machine) bool {
	ap := m.Spec.Reboot.Approval
	// An approval without approvedAt is used once too: nil matches nil.
	sameTime := (a.st.ApprovedAt == nil && ap.ApprovedAt == nil) || (a.st.ApprovedAt != nil && ap.ApprovedAt != nil && a.st.ApprovedAt.Equal(ap.ApprovedAt))
	return a.st.ApprovedHash == ap.PendingHash && sameTime
}

// retryAllowed: spec.retryFailedDigest names digest, and the failure is not that setting's
// retry failing again, so a retry that fails is not retried by any later edit.
func (a *Agent) retryAllowed(m *v1alpha1.Machine, digest string) bool {
	f := a.failedRelease(digest)
	return string(m.Spec.RetryFailedDigest) == digest && (f == nil || !f.Retried)
}

// endRetrySettings marks the failures whose retry setting is gone as not retried, so setting
// spec.retryFailedDigest again allows one more try. It reports whether anything changed.
func (a *Agent) endRetrySettings(m *v1alpha1.Machine) bool {
	changed := false
	for i := range a.st.FailedReleases {
		if f := &a.st.FailedReleases[i]; f.Retried && string(m.Spec.RetryFailedDigest) != f.Digest {
			f.Retried, changed = false, true
		}
	}
	return changed
}

// adoptFailures takes back the failed releases the Machine's status lists and the state file
// does not (it was lost or replaced), so a lost file never makes a failure forgotten. A
// failure of the release this machine runs committed is not taken back: its commit forgot
// it, and only the status write after that was lost.
func (a *Agent) adoptFailures(m *v1alpha1.Machine) {
	var running string
	if bi := a.bootInfo; bi != nil && !(bi.Trial && !bi.Committed) {
		running = bi.Slots[bi.Slot].Digest
	}
	for _, f := range m.Status.Upgrade.FailedReleases {
		if f.Digest != running && a.failedRelease(f.Digest) == nil {
			a.log.Info("a failed release the state file does not hold is taken back from status", "digest", f.Digest, "version", f.Version)
			a.st.FailedReleases = append(a.st.FailedReleases, f)
		}
	}
}
