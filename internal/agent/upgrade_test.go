package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

// fakeBoot stands in for init's boot control on the host side: it keeps the slot records
// and the boot log in memory, refuses what init refuses, and records reboot requests. The
// VM tier runs the real init.
type fakeBoot struct {
	mu      sync.Mutex
	info    supervisor.BootInfo
	reboots []supervisor.RebootRequest
	// onReboot, when set, runs as a reboot request arrives, before it is taken: what the
	// machine said by then is all an operator will ever see from this boot.
	onReboot func(supervisor.RebootRequest)
	// rebootPending: a reboot was taken and the fake machine has not booted again; slot
	// writes are refused meanwhile, as init refuses them; slotWritesRefused counts them.
	rebootPending     bool
	slotWritesRefused int
	// failReboots makes that many reboot requests fail, as when init cannot be reached.
	failReboots int
	// refuseDisks: init finds each disk of spec.disks holding data, and leaves it.
	refuseDisks bool
}

func (b *fakeBoot) BootInfo(context.Context) (*supervisor.BootInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.info
	i.Slots = bootloader.Slots{}
	for k, v := range b.info.Slots {
		i.Slots[k] = v
	}
	i.Boots = append([]state.BootRecord(nil), b.info.Boots...)
	i.RebootPending = b.rebootPending
	return &i, nil
}

func (b *fakeBoot) SetSlot(_ context.Context, slot string, r bootloader.SlotRecord) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if slot == b.info.Slot || (b.info.Trial && !b.info.Committed && slot == b.info.DefaultSlot) {
		return fmt.Errorf("slot %s is in use", slot)
	}
	if b.rebootPending {
		b.slotWritesRefused++
		return errors.New("a reboot is under way")
	}
	b.info.Slots[slot] = r
	return nil
}

func (b *fakeBoot) Reboot(_ context.Context, r supervisor.RebootRequest) error {
	if b.onReboot != nil {
		b.onReboot(r)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.info.Trial && !b.info.Committed {
		return errors.New("uncommitted trial")
	}
	if b.failReboots > 0 {
		b.failReboots--
		return errors.New("init could not be reached (test)")
	}
	if r.TrialSlot != "" && b.info.Slots[r.TrialSlot].State != bootloader.SlotReady {
		return fmt.Errorf("slot %s holds no verified release", r.TrialSlot)
	}
	b.reboots = append(b.reboots, r)
	b.rebootPending = true
	if r.TrialSlot != "" {
		b.info.Boots[len(b.info.Boots)-1].Armed = r.TrialSlot
	}
	return nil
}

func (b *fakeBoot) CommitTrial(context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.info.Trial {
		return errors.New("not a trial")
	}
	b.info.Committed, b.info.DefaultSlot = true, b.info.Slot
	return nil
}

// FailTrial ends the trial as init does: the boot record says why, and the machine
// reboots (into its last good slot: bootAsArmed finds no trial armed).
func (b *fakeBoot) FailTrial(_ context.Context, end, msg string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := state.AgentEnds[end]; !ok {
		return fmt.Errorf("a trial cannot end %q", end)
	}
	switch {
	case !b.info.Trial:
		return errors.New("not a trial")
	case b.info.Committed:
		return errors.New("committed already")
	case b.rebootPending:
		return errors.New("a reboot is already under way")
	}
	b.info.Boots[len(b.info.Boots)-1].End = end
	b.info.Boots[len(b.info.Boots)-1].Message = msg
	b.reboots = append(b.reboots, supervisor.RebootRequest{Why: "the agent ended the trial: " + end})
	b.rebootPending = true
	return nil
}

func (b *fakeBoot) lastReboot() *supervisor.RebootRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.reboots) == 0 {
		return nil
	}
	r := b.reboots[len(b.reboots)-1]
	return &r
}

func (b *fakeBoot) get() supervisor.BootInfo {
	i, _ := b.BootInfo(context.Background())
	return *i
}

func (b *fakeBoot) rebootCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.reboots)
}

// lastRecord changes the newest boot record.
func (b *fakeBoot) lastRecord(change func(*state.BootRecord)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	change(&b.info.Boots[len(b.info.Boots)-1])
}

// boot makes the fake machine come up again: on slot, as a trial or not, with a new boot ID
// and the boot log's new records.
func (b *fakeBoot) boot(id, slot string, trial bool, args string, records ...state.BootRecord) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.info.BootID, b.info.Slot, b.info.Trial, b.info.Committed, b.info.KernelArgs = id, slot, trial, false, args
	b.info.BootTime = time.Now()
	b.info.Report = nil // made by the sim's start as init would, unless a test gives one
	b.rebootPending = false
	b.info.Boots = append(b.info.Boots, records...)
	b.info.Boots = append(b.info.Boots, state.BootRecord{ID: id, Slot: slot, Trial: trial})
}

// bootAsArmed makes the fake machine come up as init and GRUB bring it up after the reboot
// taken last: a one-shot trial of the slot and arguments it armed, else the slot it ran
// (a power cut, or a reboot without a trial).
func (b *fakeBoot) bootAsArmed(id string) {
	b.mu.Lock()
	slot, args, trial := b.info.Slot, b.info.KernelArgs, false
	if b.rebootPending && len(b.reboots) > 0 {
		if r := b.reboots[len(b.reboots)-1]; r.TrialSlot != "" {
			slot, args, trial = r.TrialSlot, r.TrialArgs, true
		}
	}
	b.mu.Unlock()
	b.boot(id, slot, trial, args)
}

// testChannel publishes releases whose slot images are small, distinct byte patterns, and
// serves them over real HTTP, counting the slot image downloads per version.
type testChannel struct {
	*httptest.Server
	dir    string
	pins   map[string]string
	slots  map[string][]byte
	gets   map[string]*atomic.Int32
	failed atomic.Bool
}

func newTestChannel(t *testing.T, versions ...string) *testChannel {
	t.Helper()
	return serveTestChannel(t, httptest.NewServer, versions...)
}

// serveTestChannel is newTestChannel over a server that serve starts (httptest.NewServer,
// or httptest.NewTLSServer for an https channel with a CA of its own).
func serveTestChannel(t *testing.T, serve func(http.Handler) *httptest.Server, versions ...string) *testChannel {
	t.Helper()
	dir := t.TempDir()
	c := &testChannel{dir: dir, pins: map[string]string{}, slots: map[string][]byte{}, gets: map[string]*atomic.Int32{}}
	for i, v := range versions {
		img := bytes.Repeat([]byte(fmt.Sprintf("slot image %d of release %s\n", i, v)), 40_000)
		sum := sha256.Sum256(img)
		doc := &apirelease.Document{Schema: apirelease.Schema, Version: v, Created: time.Unix(1785000000, 0).UTC(),
			Files: []apirelease.File{{Name: "slot.img", Size: int64(len(img)), SHA256: hex.EncodeToString(sum[:]), Role: apirelease.RoleSlot}}}
		b, err := doc.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(dir, v), 0o755)
		os.WriteFile(filepath.Join(dir, v, apirelease.DocumentName), b, 0o644)
		os.WriteFile(filepath.Join(dir, v, "slot.img"), img, 0o644)
		c.pins[v], c.slots[v], c.gets[v] = apirelease.Digest(b), img, &atomic.Int32{}
	}
	files := http.FileServer(http.Dir(dir))
	c.Server = serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/slot.img"); ok && c.gets[v] != nil {
			c.gets[v].Add(1)
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(c.Close)
	return c
}

// useChannel points the Cluster at ch, pins its releases and sets version, for one test:
// the package's other tests share the Cluster, so it is restored afterwards.
func (f *fixture) useChannel(t *testing.T, ch *testChannel, version string) {
	t.Helper()
	old, err := f.liken.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f.restoreCluster(t, func(c *v1alpha1.Cluster) { c.Spec = old.Spec })
	f.editCluster(func(c *v1alpha1.Cluster) {
		c.Spec.Channel = ch.URL + "/"
		// Unsigned, by the test's explicit choice: TestReleaseMustBeSigned signs its channel.
		c.Spec.InsecureUnsignedChannel = true
		c.Spec.Releases = map[string]v1alpha1.Digest{}
		for v, pin := range ch.pins {
			c.Spec.Releases[v] = v1alpha1.Digest(pin)
		}
		c.Spec.Version = v1alpha1.ReleaseVersion(version)
	})
}

// testLayerDigest is the layer digest init reports in the tests' boots.
const testLayerDigest = "sha256:1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e1a7e"

// bootedOnClusterRelease is init's boot control for a machine booted from slot A, which
// holds the Cluster's release.
func (f *fixture) bootedOnClusterRelease(t *testing.T) *fakeBoot {
	t.Helper()
	c, err := f.liken.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	v := string(c.Spec.Version)
	boot := &fakeBoot{info: supervisor.BootInfo{DefaultSlot: "A", LayerDigest: testLayerDigest, Slots: bootloader.Slots{
		"A": {State: bootloader.SlotReady, Version: v, Digest: string(c.Spec.Releases[v])}}}}
	boot.boot("boot-1", "A", false, "")
	return boot
}

// installedWith is a server machine installed with ch's release v1 in slot A (its slots
// files of 2 MiB in slotDir), booted from it, not started.
func installedWith(t *testing.T, name string, ch *testChannel, v1 string) (s *sim, boot *fakeBoot, slotDir string) {
	t.Helper()
	s = newSim(t, name, v1alpha1.RoleServer)
	slotDir = t.TempDir()
	for _, n := range []string{"A", "B"} {
		os.WriteFile(filepath.Join(slotDir, n+".img"), make([]byte, 2<<20), 0o644)
	}
	os.WriteFile(filepath.Join(slotDir, "A.img"), append(append([]byte{}, ch.slots[v1]...), make([]byte, 2<<20-len(ch.slots[v1]))...), 0o644)
	sum := sha256.Sum256(ch.slots[v1])
	boot = &fakeBoot{info: supervisor.BootInfo{DefaultSlot: "A", LayerDigest: testLayerDigest, Slots: bootloader.Slots{
		"A": {State: bootloader.SlotReady, Version: v1, Digest: ch.pins[v1], SHA256: hex.EncodeToString(sum[:]), Size: int64(len(ch.slots[v1]))}}}}
	boot.boot("boot-1", "A", false, "")
	s.bootCtl = boot
	s.slotDevice = func(slot string) (release.PartitionTarget, error) {
		return release.PartitionTarget{Path: filepath.Join(slotDir, slot+".img"), Size: 2 << 20}, nil
	}
	return s, boot, slotDir
}

// TestUpgradeFlow drives the agent through an upgrade, a commit, a rollback without a
// download, a failed trial that is not retried, a retry, and a slot found corrupt, against a
// real API server and a real HTTP channel; init's boot control is faked (the VM tier runs
// the real one).
func TestUpgradeFlow(t *testing.T) {
	const v1, v2 = "2026.11.01-001", "2026.11.02-001"
	ch := newTestChannel(t, v1, v2)
	f := setup(t, map[string]v1alpha1.Role{"u1": v1alpha1.RoleServer})
	f.useChannel(t, ch, v1)

	// The machine was installed with v1 in slot A.
	s, boot, slotDir := installedWith(t, "u1", ch, v1)
	s.boot(t, f)
	s.start(t)
	f.waitFor(t, "u1", "v1 running from slot A", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Release.Slot == "A" && m.Status.Release.Version == v1 &&
			m.Status.Upgrade.State == v1alpha1.UpgradeIdle && len(m.Status.Pending) == 0 && condTrue(m, v1alpha1.MachineReady)
	})

	// A new version: written into slot B and verified, the reboot staged, nothing rebooted.
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Version = v2 })
	f.waitFor(t, "u1", "v2 staged in slot B", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeStaged && m.Status.Upgrade.TargetSlot == "B" &&
			m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval && hasPending(m, "cluster.spec.version")
	})
	if got, _ := os.ReadFile(filepath.Join(slotDir, "B.img")); !bytes.Equal(got[:len(ch.slots[v2])], ch.slots[v2]) {
		t.Fatal("slot B does not hold v2's slot image")
	}
	if rec := boot.get().Slots["B"]; !rec.Holds(ch.pins[v2]) {
		t.Fatalf("slot B's record: %+v", rec)
	}
	if n := ch.gets[v2].Load(); n != 1 {
		t.Errorf("v2's slot image fetched %d times; want 1", n)
	}
	if boot.lastReboot() != nil {
		t.Fatal("the agent rebooted without an approval")
	}

	// The approval of exactly this pending set reboots into a trial of B.
	approve(f, "u1")
	waitCount(t, "a reboot request", func() bool { return boot.lastReboot() != nil })
	if r := boot.lastReboot(); r.TrialSlot != "B" || r.TrialArgs != "" {
		t.Fatalf("reboot request %+v; want a trial of slot B", r)
	}
	f.waitFor(t, "u1", "status Rebooting", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootRebooting
	})

	// The trial boot of B: healthy, committed, and the pending set is empty.
	s.stop()
	boot.boot("boot-2", "B", true, "")
	s.start(t)
	f.waitFor(t, "u1", "v2 committed on slot B", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		r := m.Status.Release
		return r != nil && r.Slot == "B" && r.Version == v2 && !r.Trial && r.LastGoodSlot == "B" &&
			m.Status.Upgrade.State == v1alpha1.UpgradeIdle && len(m.Status.Pending) == 0
	})
	if !boot.get().Committed {
		t.Fatal("the agent did not commit the trial")
	}

	// Rollback of this machine alone: slot A still holds v1, so nothing is downloaded; the
	// slot is read back and checked before it is staged.
	f.editMachine("u1", func(m *v1alpha1.Machine) { m.Spec.Version = v1 })
	f.waitFor(t, "u1", "v1 staged in slot A", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeStaged && m.Status.Upgrade.TargetSlot == "A" && hasPending(m, "machine.spec.version")
	})
	if n := ch.gets[v1].Load(); n != 0 {
		t.Errorf("the rollback downloaded v1's slot image %d times; want 0", n)
	}
	approve(f, "u1")
	waitCount(t, "the rollback's reboot", func() bool { r := boot.lastReboot(); return r != nil && r.TrialSlot == "A" })

	// The trial of A misses its health deadline: the machine is back on B, the failure is
	// in status with init's reason, and v1 is not tried again.
	s.stop()
	boot.boot("boot-3", "A", true, "")
	boot.lastRecord(func(r *state.BootRecord) { r.End, r.Message = state.EndHealthDeadline, "not found healthy within 1m0s" })
	boot.boot("boot-4", "B", false, "")
	s.start(t)
	f.waitFor(t, "u1", "the failed trial reported", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeFellBack && len(m.Status.Upgrade.FailedReleases) == 1 &&
			m.Status.Upgrade.FailedReleases[0].Reason == v1alpha1.ReasonHealthDeadline && condTrue(m, v1alpha1.MachineUpgradeFailed) &&
			m.Status.Release.Slot == "B" && m.Status.Reboot.State == v1alpha1.RebootNone
	})
	reboots := boot.rebootCount()
	approve(f, "u1") // an approval does not bring a failed release back
	notRetried(t, f, "the approval")
	if boot.rebootCount() != reboots {
		t.Fatal("a failed release was tried again without spec.retryFailedDigest")
	}

	// Slot A is damaged on disk meanwhile. Retrying v1 reads it back, finds it corrupt,
	// writes it again from the channel and stages it.
	img, _ := os.ReadFile(filepath.Join(slotDir, "A.img"))
	img[1000] ^= 0xff
	os.WriteFile(filepath.Join(slotDir, "A.img"), img, 0o644)
	f.editMachine("u1", func(m *v1alpha1.Machine) {
		m.Spec.RetryFailedDigest = v1alpha1.Digest(ch.pins[v1])
		m.Spec.Reboot = nil // the earlier approval would reboot at once
	})
	f.waitFor(t, "u1", "v1 written again after the corruption", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeStaged && m.Status.Upgrade.TargetSlot == "A"
	})
	if n := ch.gets[v1].Load(); n != 1 {
		t.Errorf("v1's slot image fetched %d times after the corruption; want 1", n)
	}
	if got, _ := os.ReadFile(filepath.Join(slotDir, "A.img")); !bytes.Equal(got[:len(ch.slots[v1])], ch.slots[v1]) {
		t.Fatal("slot A was not rewritten")
	}
	// The retry fails too: the release is not tried again, whatever is approved, until the
	// Machine changes.
	approve(f, "u1")
	waitCount(t, "the retry's reboot", func() bool { return boot.rebootCount() == reboots+1 })
	s.stop()
	boot.boot("boot-5", "A", true, "")
	boot.boot("boot-6", "B", false, "")
	boot.lastRecord(func(r *state.BootRecord) { r.WatchdogReset = true })
	s.start(t)
	f.waitFor(t, "u1", "the failed retry reported", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		f := m.Status.Upgrade.FailedReleases
		return m.Status.Upgrade.State == v1alpha1.UpgradeFellBack && len(f) == 1 && f[0].Reason == v1alpha1.ReasonWatchdog
	})
	approve(f, "u1")
	notRetried(t, f, "the approval after the failed retry")
	if boot.rebootCount() != reboots+1 {
		t.Fatal("a release whose retry failed was tried again")
	}
	// The retry belongs to the setting: an unrelated edit of the Machine allows no other.
	f.editMachine("u1", func(m *v1alpha1.Machine) { m.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": "30"} })
	f.waitFor(t, "u1", "the sysctl edit applied", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return condTrue(m, v1alpha1.MachineConfigApplied)
	})
	// The status of the edit's generation: a slot job started for a retry would show there
	// as Downloading, since it starts within the pass that decides it.
	if m, _ := f.liken.Machine(t.Context(), "u1"); m.Status.Upgrade.State != v1alpha1.UpgradeFellBack {
		t.Fatalf("after an unrelated edit the failed release is %s; want it left FellBack: %s", m.Status.Upgrade.State, m.Status.Upgrade.Message)
	}
	approve(f, "u1")
	notRetried(t, f, "the approval after the unrelated edit")
	if boot.rebootCount() != reboots+1 {
		t.Fatal("an unrelated edit of the Machine let a failed retry be tried again")
	}
	// The state file is lost: the failure is read back from status, still not retried.
	s.stop()
	if err := os.RemoveAll(filepath.Join(s.dir, "state")); err != nil {
		t.Fatal(err)
	}
	s.start(t)
	f.waitFor(t, "u1", "the failure read back from status", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		f := m.Status.Upgrade.FailedReleases
		return m.Status.Upgrade.State == v1alpha1.UpgradeFellBack && len(f) == 1 && f[0].Reason == v1alpha1.ReasonWatchdog && f[0].Retried
	})
	// The status above may still be the last run's: the approval's generation is this
	// agent's.
	approve(f, "u1")
	notRetried(t, f, "the approval after the state file was lost")
	if boot.rebootCount() != reboots+1 {
		t.Fatal("a failed release was tried again after the state file was lost")
	}
	// Cleared and set again, the setting allows one more try.
	f.editMachine("u1", func(m *v1alpha1.Machine) { m.Spec.RetryFailedDigest = "" })
	f.waitFor(t, "u1", "the retry setting ended", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		f := m.Status.Upgrade.FailedReleases
		return len(f) == 1 && !f[0].Retried
	})
	f.editMachine("u1", func(m *v1alpha1.Machine) { m.Spec.RetryFailedDigest = v1alpha1.Digest(ch.pins[v1]) })
	f.waitFor(t, "u1", "v1 staged for the new setting's retry", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeStaged && m.Status.Upgrade.TargetSlot == "A"
	})
	approve(f, "u1")
	waitMachineCount(t, f, "u1", "the new setting's retry reboot", func() bool { return boot.rebootCount() == reboots+2 })
	events, _ := f.admin.CoreV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=u1"})
	seen := map[string]bool{}
	for _, e := range events.Items {
		seen[e.Reason] = true
	}
	for _, r := range []string{"WritingSlot", "SlotReady", "Rebooting", v1alpha1.ReasonCommitted, "TrialFailed", "SlotCorrupt"} {
		if !seen[r] {
			t.Errorf("no %s Event; got %v", r, seen)
		}
	}
	s.stop()
}

// notRetried waits for u1's status of its current generation (after what, an edit) to say
// the release that failed its trial stays failed and no reboot is asked for. That status
// is the agent's decision: a reboot is taken, and a slot job started, within the pass
// that writes it; and None asks the coordinator for no turn.
func notRetried(t *testing.T, f *fixture, what string) {
	t.Helper()
	f.waitFor(t, "u1", what+" taken in, the failed release not retried", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeFellBack && m.Status.Reboot.State == v1alpha1.RebootNone
	})
}

func hasPending(m *v1alpha1.Machine, field string) bool {
	for _, p := range m.Status.Pending {
		if p.Field == field {
			return true
		}
	}
	return false
}

// approve approves the Machine's current pending set, as `liken approve-reboot` will.
func approve(f *fixture, name string) {
	f.t.Helper()
	m, err := f.liken.Machine(f.t.Context(), name)
	if err != nil {
		f.t.Fatal(err)
	}
	hash := m.Status.PendingHash
	f.editMachine(name, func(m *v1alpha1.Machine) {
		if m.Spec.Reboot == nil {
			m.Spec.Reboot = &v1alpha1.RebootControl{}
		}
		at := v1alpha1.NewApprovalTime(m.Spec.Reboot.Approval, hash, time.Now())
		m.Spec.Reboot.Approval = &v1alpha1.RebootApproval{PendingHash: hash, ApprovedBy: "test", ApprovedAt: &at}
	})
}

func TestTrialFailureReasons(t *testing.T) {
	at := &state.Attempt{Slot: "B", BootID: "arm"}
	arming := state.BootRecord{ID: "arm", Slot: "A", Armed: "B"}
	trial := func(r state.BootRecord) state.BootRecord { r.ID, r.Slot, r.Trial = "trial", "B", true; return r }
	after := func(r state.BootRecord) state.BootRecord { r.ID, r.Slot = "after", "A"; return r }
	for _, tt := range []struct {
		name  string
		boots []state.BootRecord
		want  string
	}{
		{"health deadline", []state.BootRecord{arming, trial(state.BootRecord{Reached: "k3s", End: state.EndHealthDeadline}), after(state.BootRecord{})}, v1alpha1.ReasonHealthDeadline},
		{"init failed", []state.BootRecord{arming, trial(state.BootRecord{Reached: "system", End: state.EndInitFailed, Message: "no layer"}), after(state.BootRecord{})}, v1alpha1.ReasonInitFailed},
		{"kernel panic", []state.BootRecord{arming, trial(state.BootRecord{Reached: "k3s"}), after(state.BootRecord{Panic: "Kernel panic - not syncing: sysrq triggered crash"})}, v1alpha1.ReasonKernelPanic},
		{"init exited", []state.BootRecord{arming, trial(state.BootRecord{Reached: "k3s"}), after(state.BootRecord{Panic: "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100"})}, v1alpha1.ReasonInitFailed},
		{"gates failed", []state.BootRecord{arming, trial(state.BootRecord{Reached: "k3s", End: state.EndGatesFailed, Message: "gate smoke: Job failed"}), after(state.BootRecord{})}, v1alpha1.ReasonGateFailed},
		{"no peer reached it", []state.BootRecord{arming, trial(state.BootRecord{Reached: "k3s", End: state.EndPeersUnreachable, Message: "none of a1 renewed its Node Lease through it"}), after(state.BootRecord{})}, v1alpha1.ReasonPeersUnreachable},
		{"watchdog", []state.BootRecord{arming, trial(state.BootRecord{Reached: "k3s"}), after(state.BootRecord{WatchdogReset: true})}, v1alpha1.ReasonWatchdog},
		{"power cut", []state.BootRecord{arming, trial(state.BootRecord{Reached: "k3s"}), after(state.BootRecord{})}, v1alpha1.ReasonBootInterrupted},
		{"never reached init", []state.BootRecord{arming, after(state.BootRecord{})}, v1alpha1.ReasonTrialFailed},
		{"panic before init", []state.BootRecord{arming, after(state.BootRecord{Panic: "Kernel panic - not syncing: VFS: Unable to mount root fs"})}, v1alpha1.ReasonKernelPanic},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got, msg := trialFailure(at, tt.boots); got != tt.want || msg == "" {
				t.Errorf("reason %s (%q), want %s", got, msg, tt.want)
			}
		})
	}
	if armed(at, []state.BootRecord{{ID: "arm", Slot: "A"}}) {
		t.Error("a trial init never armed counted as armed")
	}
}

// TestTrialCommitsOnThisBootsEvidence: a trial boot whose Node still shows the boot before it
// (Ready, but reported by the last boot's kubelet) is not committed, and the Machine says why;
// once k3s reports this boot, the trial commits.
func TestTrialCommitsOnThisBootsEvidence(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"e1": v1alpha1.RoleServer})
	boot := f.bootedOnClusterRelease(t)
	boot.info.Slots["B"] = boot.info.Slots["A"]
	s := newSim(t, "e1", v1alpha1.RoleServer)
	s.bootCtl, s.kubeletLate = boot, true
	s.boot(t, f)
	s.reportBoot(t) // boot-1 registers the Node and it is Ready
	waitCount(t, "the Node Ready on boot-1", func() bool {
		n, err := f.admin.CoreV1().Nodes().Get(t.Context(), "e1", metav1.GetOptions{})
		return err == nil && n.Status.NodeInfo.BootID == "boot-1" && kube.NodeReady(n)
	})

	// The trial boot of B: the agent starts before k3s has reported this boot.
	boot.boot("boot-2", "B", true, "")
	s.start(t)
	defer s.stop()
	f.waitFor(t, "e1", "not Ready: the Node is from another boot", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineReady)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "from another boot")
	})
	// The stale Node reported again, Ready, as the last boot's kubelet would: a pass on
	// that report (a trial commits within a pass) is the evidence.
	f.reportNode(t, "e1")
	n, err := f.admin.CoreV1().Nodes().Get(t.Context(), "e1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reported := readyHeartbeat(n)
	s.reconciled(t, "the stale Node's new report", func(_ *v1alpha1.Machine, _ *v1alpha1.Cluster, n *corev1.Node) bool {
		return n != nil && n.Status.NodeInfo.BootID == "boot-1" && kube.NodeReady(n) && !readyHeartbeat(n).Before(reported)
	})
	if boot.get().Committed {
		t.Fatal("the trial was committed on the Node's Ready from the boot before it")
	}

	s.reportBoot(t)
	waitCount(t, "the trial committed", func() bool { return boot.get().Committed })
	f.waitFor(t, "e1", "Ready on slot B", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return condTrue(m, v1alpha1.MachineReady) && m.Status.Release != nil && m.Status.Release.Slot == "B" && !m.Status.Release.Trial
	})
}

// readyHeartbeat is when n's Ready condition was last reported.
func readyHeartbeat(n *corev1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	return time.Time{}
}

// TestAppliedMeansObservedAtBoot: a boot-time setting is marked applied only when init's
// report of that boot says it applied it. A network init could not apply stays pending with
// init's reason in status; a kernel-module change a power cycle booted without stays pending;
// both are applied once a boot's report says so.
func TestAppliedMeansObservedAtBoot(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"o1": v1alpha1.RoleAgent})
	boot := f.bootedOnClusterRelease(t)
	boot.info.Report = &state.BootReport{}
	s := newSim(t, "o1", v1alpha1.RoleAgent)
	s.bootCtl = boot
	s.boot(t, f)
	s.start(t)
	f.waitFor(t, "o1", "Ready with nothing pending", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return condTrue(m, v1alpha1.MachineReady) && len(m.Status.Pending) == 0
	})
	// powerCycle boots the machine again, init reporting r for that boot.
	powerCycle := func(id string, r *state.BootReport) {
		s.stop()
		boot.boot(id, "A", false, "")
		boot.mu.Lock()
		boot.info.Report = r
		boot.mu.Unlock()
		s.start(t)
	}

	// A network change and a kernel module change, staged for the next boot.
	net := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth9", DHCP: true}}}
	mods := []v1alpha1.KernelModule{{Name: "dummy", Parameters: map[string]v1alpha1.ModuleParameterValue{"numdummies": "2"}}}
	f.editMachine("o1", func(m *v1alpha1.Machine) { m.Spec.Network, m.Spec.KernelModules = net, mods })
	f.waitFor(t, "o1", "both staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.network") && hasPending(m, "machine.spec.kernelModules")
	})

	// A power cycle: init applied the modules but not the network (no link eth9)...
	powerCycle("boot-2", &state.BootReport{Network: net, KernelModules: mods, Modules: []string{"dummy numdummies=2"},
		NotApplied: map[string]string{"machine.spec.network": "interface eth9: no link named eth9"}})
	f.waitFor(t, "o1", "the network still pending, with init's reason", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineDegraded)
		return hasPending(m, "machine.spec.network") && !hasPending(m, "machine.spec.kernelModules") &&
			c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonNotAppliedAtBoot && strings.Contains(c.Message, "no link named eth9")
	})

	// ...then a module change, and a power cycle whose init ran without it (the report
	// says what it loaded): still pending.
	mods2 := []v1alpha1.KernelModule{{Name: "dummy", Parameters: map[string]v1alpha1.ModuleParameterValue{"numdummies": "4"}}}
	f.editMachine("o1", func(m *v1alpha1.Machine) { m.Spec.KernelModules = mods2 })
	f.waitFor(t, "o1", "the new modules staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.kernelModules")
	})
	powerCycle("boot-3", &state.BootReport{Network: net, KernelModules: mods, Modules: []string{"dummy numdummies=2"}})
	f.waitFor(t, "o1", "the modules this boot ran without still pending", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.kernelModules") && !hasPending(m, "machine.spec.network") &&
			!meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineDegraded)
	})

	// A boot that applied both: nothing pending.
	powerCycle("boot-4", &state.BootReport{Network: net, KernelModules: mods2, Modules: []string{"dummy numdummies=4"}})
	f.waitFor(t, "o1", "everything applied", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return len(m.Status.Pending) == 0 && condTrue(m, v1alpha1.MachineReady)
	})

	// Disks: a boot whose init refused one stays pending, shows status.disks, is Degraded
	// with DiskRefused and says so in an Event; a boot that made it ready applies it.
	disks := []v1alpha1.Disk{{Device: "/dev/disk/by-id/virtio-data1", Partitions: []v1alpha1.Partition{{Label: "data", Filesystem: "ext4", MountPoint: "/var/mnt/data"}}}}
	f.editMachine("o1", func(m *v1alpha1.Machine) { m.Spec.Disks = disks })
	f.waitFor(t, "o1", "the disks staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return hasPending(m, "machine.spec.disks") })
	refused := v1alpha1.DiskStatus{Device: disks[0].Device, Path: "/dev/vdb", Serial: "data1", ContentID: "sha256:" + strings.Repeat("ab", 32),
		Phase: v1alpha1.DiskRefused, Reason: v1alpha1.DiskHoldsData, Message: "found an ext2/3/4 file system"}
	powerCycle("boot-5", &state.BootReport{Network: net, KernelModules: mods2, Disks: disks, DiskStatus: []v1alpha1.DiskStatus{refused},
		NotApplied: map[string]string{"machine.spec.disks": "not ready: /dev/disk/by-id/virtio-data1: HoldsData (see status.disks)"}})
	f.waitFor(t, "o1", "the refused disk in status and Degraded", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineDegraded)
		return hasPending(m, "machine.spec.disks") && len(m.Status.Disks) == 1 && m.Status.Disks[0] == refused &&
			c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonDiskRefused && strings.Contains(c.Message, "HoldsData")
	})
	waitCount(t, "a DiskRefused Event", func() bool {
		list, err := f.admin.CoreV1().Events(authority.EventNamespace).List(context.Background(),
			metav1.ListOptions{FieldSelector: "involvedObject.name=o1,reason=" + v1alpha1.ReasonDiskRefused})
		return err == nil && len(list.Items) == 1 && strings.Contains(list.Items[0].Message, "found an ext2/3/4 file system")
	})
	ready := refused
	ready.Phase, ready.Reason, ready.Message, ready.ContentID = v1alpha1.DiskReady, v1alpha1.DiskWiped, "1 of 1 partitions formatted", "gpt:0FC63DAF-8483-4772-8E79-3D69D8477DE4"
	powerCycle("boot-6", &state.BootReport{Network: net, KernelModules: mods2, Disks: disks, DiskStatus: []v1alpha1.DiskStatus{ready}})
	f.waitFor(t, "o1", "the disks applied", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return len(m.Status.Pending) == 0 && len(m.Status.Disks) == 1 && m.Status.Disks[0].Phase == v1alpha1.DiskReady &&
			!meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineDegraded)
	})

	// The Cluster's features.swap: applied when a boot's report says init booted with it.
	on := true
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Features.Swap = &on })
	f.waitFor(t, "o1", "swap staged", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return hasPending(m, "cluster.spec.features.swap") })
	powerCycle("boot-7", &state.BootReport{Network: net, KernelModules: mods2, Disks: disks, DiskStatus: []v1alpha1.DiskStatus{ready}})
	// The status before the power cycle says the same: a pass of the agent of boot-7 (the
	// first takes in init's report) is the evidence that this boot left swap pending.
	s.reconciled(t, "the Machine and the Cluster", nil)
	f.waitFor(t, "o1", "swap still pending after a boot without it", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return hasPending(m, "cluster.spec.features.swap") })
	powerCycle("boot-8", &state.BootReport{Network: net, KernelModules: mods2, Disks: disks, DiskStatus: []v1alpha1.DiskStatus{ready}, Swap: &on})
	defer s.stop()
	f.waitFor(t, "o1", "swap applied", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return len(m.Status.Pending) == 0 })
}

// TestTrialCommitsDespiteUnrelatedFailures: a trial's verdict depends only on what the
// trial is about. A sysctl this machine lacks and a Machine spec.version that is not pinned
// are failures in status, but the trial boot, healthy, commits; before, they held the commit
// until init's deadline and the good release was recorded as failed (HealthDeadline).
func TestTrialCommitsDespiteUnrelatedFailures(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"x1": v1alpha1.RoleServer})
	boot := f.bootedOnClusterRelease(t)
	boot.info.Slots["B"] = boot.info.Slots["A"]
	f.editMachine("x1", func(m *v1alpha1.Machine) {
		m.Spec.Sysctls = v1alpha1.Sysctls{"kernel.no_such_key": "1"}
		m.Spec.Version = "2099.01.01-001" // not in spec.releases
	})
	s := newSim(t, "x1", v1alpha1.RoleServer)
	s.bootCtl = boot
	boot.boot("boot-2", "B", true, "")
	s.boot(t, f)
	s.start(t)
	defer s.stop()
	f.waitFor(t, "x1", "the trial committed, with the unrelated failures in status", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineConfigApplied)
		return boot.get().Committed && c != nil && c.Status == metav1.ConditionFalse &&
			strings.Contains(c.Message, "sysctl kernel.no_such_key") && strings.Contains(c.Message, "not pinned")
	})
	if m, _ := f.liken.Machine(t.Context(), "x1"); len(m.Status.Upgrade.FailedReleases) > 0 {
		t.Errorf("a release was recorded as failed: %+v", m.Status.Upgrade.FailedReleases)
	}
}

// TestTrialGates: what a healthy trial still waits for from its gates, by the turn the
// coordinator keeps for it.
func TestTrialGates(t *testing.T) {
	off := false
	turn := func(boot string, g *v1alpha1.TurnGates) v1alpha1.Turn {
		return v1alpha1.Turn{Machine: "m1", Phase: v1alpha1.TurnDrained, BootID: boot, Gates: g}
	}
	gates := func(phase v1alpha1.GatePhase, boot, gate, msg string) *v1alpha1.TurnGates {
		return &v1alpha1.TurnGates{Phase: phase, BootID: boot, Gate: gate, Message: msg}
	}
	for _, tt := range []struct {
		name    string
		rollout *v1alpha1.Rollout
		turns   []v1alpha1.Turn
		waits   bool
		failed  string
	}{
		{"no turn", nil, nil, false, ""},
		{"another machine's turn", nil, []v1alpha1.Turn{{Machine: "m2", Phase: v1alpha1.TurnDrained, BootID: "b1"}}, false, ""},
		{"not judged yet", nil, []v1alpha1.Turn{turn("b1", nil)}, true, ""},
		{"checking", nil, []v1alpha1.Turn{turn("b1", gates(v1alpha1.GateChecking, "b2", "", "web 1 of 2 available"))}, true, ""},
		{"a verdict on another boot", nil, []v1alpha1.Turn{turn("b1", gates(v1alpha1.GatePassed, "b0", "", ""))}, true, ""},
		{"passed", nil, []v1alpha1.Turn{turn("b1", gates(v1alpha1.GatePassed, "b2", "", ""))}, false, ""},
		{"failed", nil, []v1alpha1.Turn{turn("b1", gates(v1alpha1.GateFailed, "b2", "smoke", "Job smoke-1 failed"))}, false, "gate smoke: Job smoke-1 failed"},
		{"commitAfterGates off", &v1alpha1.Rollout{CommitAfterGates: &off}, []v1alpha1.Turn{turn("b1", nil)}, false, ""},
		{"a coordinator older than the gates (no boot ID in its turn)", nil, []v1alpha1.Turn{turn("", nil)}, false, ""},
		{"still draining", nil, []v1alpha1.Turn{{Machine: "m1", Phase: v1alpha1.TurnDraining, BootID: "b1"}}, false, ""},
		{"a turn given on this boot", nil, []v1alpha1.Turn{turn("b2", nil)}, false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{Rollout: tt.rollout}}
			c.Status.Turns = tt.turns
			waiting, failed := trialGates(c, "m1", "b2")
			if (waiting != "") != tt.waits || failed != tt.failed {
				t.Errorf("waiting %q, failed %q; want waiting %v, failed %q", waiting, failed, tt.waits, tt.failed)
			}
			if tt.waits && !strings.Contains(waiting, "its gates") {
				t.Errorf("waiting %q does not say it waits for its gates", waiting)
			}
		})
	}
	if w, f := trialGates(nil, "m1", "b2"); w != "" || f != "" {
		t.Errorf("without a Cluster: %q %q", w, f)
	}
}

// TestTrialCommitsAfterItsGates: a trial boot healthy by its own account commits only once
// the coordinator's verdict on its gates, for this boot, is Passed, and says meanwhile that
// it waits for them; a Failed verdict ends the trial (init reboots into the last good slot,
// GateFailed and the gate's message in the boot log, which TestTrialFailureReasons reads as
// the failure's reason), with a GateFailed Event. The coordinator's side is written by hand
// here (no coordinator runs): its gates are internal/coordinator's tests.
func TestTrialCommitsAfterItsGates(t *testing.T) {
	f := setupFleet(t, map[string]v1alpha1.Role{"g1": v1alpha1.RoleAgent})
	setTurn := func(t *testing.T, g *v1alpha1.TurnGates) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c, err := f.liken.Cluster(t.Context())
			if err != nil {
				return err
			}
			c.Status.Turns = nil
			if g != nil {
				g.Since = metav1.NewTime(time.Now().Truncate(time.Second))
				c.Status.Turns = []v1alpha1.Turn{{Machine: "g1", Since: metav1.NewTime(time.Now().Truncate(time.Second)), Phase: v1alpha1.TurnDrained, BootID: "boot-1", Gates: g}}
			}
			_, err = f.liken.UpdateClusterStatus(t.Context(), c)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		c, err := f.liken.Cluster(context.Background())
		if err == nil {
			c.Status.Turns = nil
			f.liken.UpdateClusterStatus(context.Background(), c)
		}
	})
	for _, tt := range []struct {
		name    string
		verdict v1alpha1.GatePhase
	}{
		{"passed", v1alpha1.GatePassed},
		{"failed", v1alpha1.GateFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			boot := f.bootedOnClusterRelease(t)
			boot.info.Slots["B"] = boot.info.Slots["A"]
			s := newSim(t, "g1", v1alpha1.RoleAgent)
			s.bootCtl = boot
			s.boot(t, f)
			// The machine drained on boot-1 and came back in a trial of slot B: the
			// coordinator checks its gates.
			setTurn(t, &v1alpha1.TurnGates{Phase: v1alpha1.GateChecking, BootID: "boot-2", Message: "Deployment default/web: 1 of 2 available"})
			boot.boot("boot-2", "B", true, "")
			s.start(t)
			defer s.stop()
			f.waitFor(t, "g1", "a healthy trial waiting for its gates", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
				return condTrue(m, v1alpha1.MachineReady) && m.Status.Upgrade.State == v1alpha1.UpgradeTrial &&
					strings.Contains(m.Status.Upgrade.Message, "its gates") && strings.Contains(m.Status.Upgrade.Message, "1 of 2 available")
			})
			if boot.get().Committed || boot.rebootCount() != 0 {
				t.Fatalf("the trial committed or ended before its gates' verdict: committed %v, reboots %d", boot.get().Committed, boot.rebootCount())
			}
			g := &v1alpha1.TurnGates{Phase: tt.verdict, BootID: "boot-2"}
			if tt.verdict == v1alpha1.GateFailed {
				g.Gate, g.Message = "smoke", "Job smoke-g1 failed"
			}
			setTurn(t, g)
			if tt.verdict == v1alpha1.GatePassed {
				waitCount(t, "the trial committed", func() bool { return boot.get().Committed })
				if boot.rebootCount() != 0 {
					t.Errorf("%d reboots after the gates passed", boot.rebootCount())
				}
				return
			}
			waitCount(t, "the trial ended", func() bool { return boot.rebootCount() == 1 })
			if boot.get().Committed {
				t.Fatal("a trial whose gates failed was committed")
			}
			if last := boot.get().Boots; last[len(last)-1].End != state.EndGatesFailed || last[len(last)-1].Message != "gate smoke: Job smoke-g1 failed" {
				t.Errorf("the trial's boot record: %+v", last[len(last)-1])
			}
			waitCount(t, "a GateFailed Event on g1", func() bool {
				evs, err := f.admin.CoreV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=g1,reason=" + v1alpha1.ReasonGateFailed})
				return err == nil && len(evs.Items) > 0 && strings.Contains(evs.Items[0].Message, "Job smoke-g1 failed")
			})
		})
	}
}
