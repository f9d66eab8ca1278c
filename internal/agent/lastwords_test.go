package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

// cutter stands between the agent and the API server. It holds every Event for delay (a
// slow API server: an Event in flight when the machine goes down is lost unless the agent
// waits for it), and, when marker is set, cuts the agent off from the moment it first tries
// to send an Event whose body holds marker: the network failing just as the machine says
// goodbye.
type cutter struct {
	delay  time.Duration
	marker []byte
	cut    atomic.Bool
	when   atomic.Pointer[time.Time]
}

func (c *cutter) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		isEvent := strings.HasSuffix(r.URL.Path, "/events") || strings.Contains(r.URL.Path, "/events/")
		if isEvent && c.delay > 0 {
			time.Sleep(c.delay)
		}
		if !c.cut.Load() && c.marker != nil && r.Method == http.MethodPost && isEvent && r.Body != nil {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return nil, err
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, c.marker) {
				now := time.Now()
				c.when.Store(&now)
				c.cut.Store(true)
			}
		}
		if c.cut.Load() {
			return nil, errors.New("connection refused (cut by the test)")
		}
		return next.RoundTrip(r)
	})
}

// TestLastWordsBeforeReboot: the Rebooting Event and the status that says Rebooting are in
// the API server before the reboot request reaches init; when the API server cannot be
// reached at that moment, the reboot still goes ahead within LastWords, and the next start
// sends what could not be said, marked as late.
func TestLastWordsBeforeReboot(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"w1": v1alpha1.RoleAgent})
	boot := f.bootedOnClusterRelease(t)

	// What init would find in the API server as each reboot request reaches it.
	type seen struct {
		rebootingEvents int
		state           v1alpha1.RebootState
		at              time.Time
	}
	var mu sync.Mutex
	var atReboot []seen
	boot.onReboot = func(supervisor.RebootRequest) {
		ctx := context.Background()
		s := seen{rebootingEvents: rebootingEvents(t, f, "w1", ""), at: time.Now()}
		if m, err := f.liken.Machine(ctx, "w1"); err == nil {
			s.state = m.Status.Reboot.State
		}
		mu.Lock()
		atReboot = append(atReboot, s)
		mu.Unlock()
	}
	w1 := newSim(t, "w1", v1alpha1.RoleAgent)
	w1.bootCtl = boot
	w1.wrap = (&cutter{delay: time.Second}).wrap
	w1.boot(t, f)
	w1.start(t)
	settled := func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Release.Slot == "A" && m.Status.Reboot.State == v1alpha1.RebootNone
	}
	f.waitFor(t, "w1", "running slot A", settled)

	requested := time.Now().Truncate(time.Second)
	request := func(at time.Time) {
		f.editMachine("w1", func(m *v1alpha1.Machine) {
			m.Spec.Reboot = &v1alpha1.RebootControl{Request: &v1alpha1.RebootRequest{RequestedAt: metav1.NewTime(at), RequestedBy: "test"}}
		})
		f.waitFor(t, "w1", "the request pending", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
			return hasPending(m, requestField) && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
		})
		approve(f, "w1")
	}
	request(requested)
	waitCount(t, "the first reboot request", func() bool { return boot.rebootCount() == 1 })
	mu.Lock()
	first := atReboot[0]
	mu.Unlock()
	if first.rebootingEvents != 1 || first.state != v1alpha1.RebootRebooting {
		t.Fatalf("when the reboot request reached init the API server had %d Rebooting Events and status.reboot.state %q; want 1 and Rebooting",
			first.rebootingEvents, first.state)
	}

	// The next boot loses the API server just as it says it is rebooting.
	w1.stop()
	boot.bootAsArmed("boot-2")
	cut := &cutter{marker: []byte("Rebooting")}
	w1.wrap, w1.lastWords = cut.wrap, 2*time.Second
	w1.start(t)
	f.waitFor(t, "w1", "back on slot A", settled)
	request(requested.Add(5 * time.Second))
	waitCount(t, "the reboot request with the API server cut off", func() bool { return boot.rebootCount() == 2 })
	mu.Lock()
	second := atReboot[1]
	mu.Unlock()
	if !cut.cut.Load() {
		t.Fatal("the agent never tried to send its Rebooting Event")
	}
	if waited := second.at.Sub(*cut.when.Load()); waited > w1.lastWords+5*time.Second {
		t.Errorf("the reboot waited %s for an unreachable API server; LastWords is %s", waited, w1.lastWords)
	}
	if second.rebootingEvents != 1 {
		t.Errorf("%d Rebooting Events in the API server; the second could not have reached it", second.rebootingEvents)
	}
	st, err := state.Store{Dir: filepath.Join(w1.dir, "state")}.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.UnsentEvents) == 0 || st.UnsentEvents[len(st.UnsentEvents)-1].Reason != "Rebooting" {
		t.Fatalf("the state file keeps %+v; want the unsent Rebooting Event last", st.UnsentEvents)
	}

	// The boot after: the API server is back, and the kept Event is said, marked as late.
	w1.stop()
	boot.bootAsArmed("boot-3")
	w1.wrap = nil
	w1.start(t)
	waitCount(t, "the kept Rebooting Event sent late", func() bool {
		return rebootingEvents(t, f, "w1", "the API server could not be reached then") == 1
	})
	waitCount(t, "the state file forgets the Events once sent", func() bool {
		st, err := state.Store{Dir: filepath.Join(w1.dir, "state")}.Load()
		return err == nil && len(st.UnsentEvents) == 0
	})
	if n := rebootingEvents(t, f, "w1", ""); n != 2 {
		t.Errorf("%d Rebooting Events after the late one was sent; want 2", n)
	}
	w1.stop()
}

// rebootingEvents counts the Rebooting Events about machine whose message holds substr.
func rebootingEvents(t *testing.T, f *fixture, machine, substr string) int {
	list, err := f.admin.CoreV1().Events(authority.EventNamespace).List(context.Background(),
		metav1.ListOptions{FieldSelector: "involvedObject.name=" + machine + ",reason=Rebooting"})
	if err != nil {
		t.Error(err)
		return 0
	}
	n := 0
	for _, e := range list.Items {
		if strings.Contains(e.Message, substr) {
			n += int(e.Count)
		}
	}
	return n
}

// TestApprovedRebootWithoutNewRelease: an approved Reboot-class change that needs no new
// release (the network) reboots, with no trial, and nothing before its approval. A spec
// change after the reboot was taken starts no slot write before the machine is down.
func TestApprovedRebootWithoutNewRelease(t *testing.T) {
	const v1, v2 = "2026.11.01-001", "2026.11.02-001"
	ch := newTestChannel(t, v1, v2)
	f := setup(t, map[string]v1alpha1.Role{"n1": v1alpha1.RoleAgent})
	f.useChannel(t, ch, v1)
	boot := f.bootedOnClusterRelease(t)
	n1 := newSim(t, "n1", v1alpha1.RoleAgent)
	n1.bootCtl = boot
	slotDir := t.TempDir()
	n1.slotDevice = func(slot string) (release.PartitionTarget, error) {
		return release.PartitionTarget{Path: filepath.Join(slotDir, slot+".img"), Size: 2 << 20}, nil
	}
	n1.boot(t, f)
	n1.start(t)
	f.waitFor(t, "n1", "running v1", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Release.Version == v1 && m.Status.Reboot.State == v1alpha1.RebootNone
	})

	f.editMachine("n1", func(m *v1alpha1.Machine) {
		m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
	})
	f.waitFor(t, "n1", "the network change waiting for approval", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, "machine.spec.network") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
	})
	if boot.rebootCount() != 0 {
		t.Fatal("rebooted before the approval")
	}
	approve(f, "n1")
	waitCount(t, "the approved reboot", func() bool { return boot.rebootCount() == 1 })
	if r := boot.lastReboot(); r.TrialSlot != "A" || r.TrialArgs != "" {
		t.Errorf("reboot request %+v; a network change boots as a trial of the running slot", r)
	}
	f.waitFor(t, "n1", "status Rebooting", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Reboot.State == v1alpha1.RebootRebooting
	})

	// The machine has not gone down yet (the fake leaves the agent running): a new release
	// now must wait for the next boot, not be written into a slot.
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Version = v2 })
	// A machine going down writes no status: a pass on the new Cluster is the evidence. A
	// slot job starts within the pass that decides it, and fetches in the background.
	n1.reconciled(t, "the Cluster asking for "+v2, func(_ *v1alpha1.Machine, c *v1alpha1.Cluster, _ *corev1.Node) bool {
		return c.Spec.Version == v2
	})
	n1.agent.mu.Lock()
	job := n1.agent.job
	n1.agent.mu.Unlock()
	if job != nil {
		t.Errorf("a slot job for release %s into slot %s started after the reboot was taken", job.version, job.slot)
	}
	if n := ch.gets[v2].Load(); n != 0 {
		t.Errorf("release %s was fetched %d times after the reboot was taken", v2, n)
	}
	boot.mu.Lock()
	refused := boot.slotWritesRefused
	boot.mu.Unlock()
	if refused != 0 {
		t.Errorf("the agent tried to write a slot %d times after the reboot was taken", refused)
	}
	n1.stop()
}

// TestRebootRequest: an operator's request is pending like a change and reboots only once
// approved (under Manual); a reboot call that fails leaves it to be carried out; a boot after
// the request carries it out, so neither a kept approval nor a lost state file reboots the
// machine again.
func TestRebootRequest(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"q1": v1alpha1.RoleAgent})
	boot := f.bootedOnClusterRelease(t)
	q1 := newSim(t, "q1", v1alpha1.RoleAgent)
	q1.bootCtl = boot
	q1.boot(t, f)
	q1.start(t)
	f.waitFor(t, "q1", "running, with the layer init reported", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Reboot.State == v1alpha1.RebootNone && m.Status.Release.LayerDigest == testLayerDigest
	})

	at := metav1.NewTime(time.Now().Truncate(time.Second))
	f.editMachine("q1", func(m *v1alpha1.Machine) {
		m.Spec.Reboot = &v1alpha1.RebootControl{Request: &v1alpha1.RebootRequest{RequestedAt: at, RequestedBy: "alice", Reason: "driver bound the wrong device"}}
	})
	f.waitFor(t, "q1", "the request waiting for approval", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, requestField) && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
	})
	if boot.rebootCount() != 0 {
		t.Fatal("a request rebooted without an approval under rebootPolicy Manual")
	}

	// The first reboot call fails (init unreachable): the request is not forgotten.
	boot.mu.Lock()
	boot.failReboots = 1
	boot.mu.Unlock()
	approve(f, "q1")
	waitCount(t, "the approved request carried out after a failed reboot call", func() bool { return boot.rebootCount() == 1 })
	if r := boot.lastReboot(); r.TrialSlot != "" || !strings.Contains(r.Why, "alice asked for a reboot") || !strings.Contains(r.Why, "driver bound the wrong device") {
		t.Errorf("reboot request %+v", r)
	}

	// The machine is back: the request is done, though the spec still holds it and its
	// approval; with the state file lost as well, nothing reboots it again.
	for i, lose := range []bool{false, true} {
		q1.stop()
		if lose {
			os.RemoveAll(filepath.Join(q1.dir, "state"))
		}
		boot.bootAsArmed(fmt.Sprintf("boot-%d", i+2))
		if lose {
			// A machine clock an hour behind: only the status says the request was done.
			boot.mu.Lock()
			boot.info.BootTime = at.Add(-time.Hour)
			boot.mu.Unlock()
		}
		q1.start(t)
		done := func(m *v1alpha1.Machine) bool {
			return !hasPending(m, requestField) && m.Status.Reboot.State == v1alpha1.RebootNone
		}
		f.waitFor(t, "q1", "the request carried out", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return done(m) })
		// The second time round the status above may still be the boot before's: a pass of
		// this agent after it is the evidence that this boot, too, took the request as done.
		q1.reconciled(t, "the request carried out in status", func(m *v1alpha1.Machine, _ *v1alpha1.Cluster, _ *corev1.Node) bool { return done(m) })
		if n := boot.rebootCount(); n != 1 {
			t.Fatalf("%d reboots for one request (state file lost: %v)", n, lose)
		}
	}
	q1.stop()
}

// TestKilledInLastWords: an agent that dies after it marked the approval and the request as
// used and before it asked init to reboot (inside its last words) carries them out on its
// next start in the same boot, instead of reporting "a reboot happened already" for ever.
// The agent's reconcile goroutine exits at the instant init is asked (runtime.Goexit): not
// a line of the agent after that point runs, as after a SIGKILL; item 18's chaos test kills
// real processes.
func TestKilledInLastWords(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"k1": v1alpha1.RoleAgent})
	boot := f.bootedOnClusterRelease(t)
	var killed atomic.Bool
	boot.onReboot = func(supervisor.RebootRequest) {
		if killed.CompareAndSwap(false, true) {
			runtime.Goexit()
		}
	}
	k1 := newSim(t, "k1", v1alpha1.RoleAgent)
	k1.bootCtl = boot
	k1.boot(t, f)
	k1.start(t)
	f.waitFor(t, "k1", "running", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Reboot.State == v1alpha1.RebootNone
	})
	at := metav1.NewTime(time.Now().Truncate(time.Second))
	f.editMachine("k1", func(m *v1alpha1.Machine) {
		m.Spec.Reboot = &v1alpha1.RebootControl{Request: &v1alpha1.RebootRequest{RequestedAt: at, RequestedBy: "alice"}}
	})
	f.waitFor(t, "k1", "the request waiting for approval", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return hasPending(m, requestField) && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
	})
	approve(f, "k1")
	waitCount(t, "the agent killed as it asked init to reboot", killed.Load)
	k1.stop()
	if boot.rebootCount() != 0 {
		t.Fatal("init took a reboot the agent was killed before asking for")
	}
	st, err := state.Store{Dir: filepath.Join(k1.dir, "state")}.Load()
	if err != nil || st.RebootAsked == nil || st.ApprovedHash == "" {
		t.Fatalf("the state file after the kill: asked %+v, approval marked %q (%v); want both recorded", st.RebootAsked, st.ApprovedHash, err)
	}

	k1.start(t) // the same boot: init restarted the agent
	waitCount(t, "the approved request carried out after the kill", func() bool { return boot.rebootCount() == 1 })
	if r := boot.lastReboot(); !strings.Contains(r.Why, "alice asked for a reboot") {
		t.Errorf("reboot request %+v", r)
	}
	k1.stop()
	// Restarted while init takes the machine down: the reboot is under way, not asked twice.
	k1.start(t)
	// A machine going down writes no status: a pass of the agent started again is the
	// evidence that it took in the reboot under way.
	k1.reconciled(t, "the Machine and the Cluster", nil)
	if n := boot.rebootCount(); n != 1 {
		t.Errorf("an agent restarted while init takes the machine down asked again: %d reboots", n)
	}
	k1.stop()
	boot.bootAsArmed("boot-2")
	k1.start(t)
	f.waitFor(t, "k1", "the request carried out once", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return !hasPending(m, requestField) && m.Status.Reboot.State == v1alpha1.RebootNone
	})
	if n := boot.rebootCount(); n != 1 {
		t.Errorf("%d reboots for one request", n)
	}
	k1.stop()
	if st, _ := (state.Store{Dir: filepath.Join(k1.dir, "state")}).Load(); st.RebootAsked != nil {
		t.Errorf("the boot after kept the reboot asked: %+v", st.RebootAsked)
	}
}

// TestStatusWrittenWhenStopped: an agent asked to stop (init does so at every shutdown, a
// power-off included) while it writes its status finishes the write, even when the API
// server is slow to answer.
func TestStatusWrittenWhenStopped(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"p1": v1alpha1.RoleAgent})
	p1 := newSim(t, "p1", v1alpha1.RoleAgent)
	var armed atomic.Int64 // the generation whose status write is slowed down
	started := make(chan struct{}, 1)
	p1.wrap = func(next http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if gen := armed.Load(); gen != 0 && r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/machines/p1/status") && r.Body != nil {
				// Only the write for the edit: other passes (the coordinator writing the
				// Cluster's status wakes the agent too) may write status meanwhile.
				b, err := io.ReadAll(r.Body)
				r.Body.Close()
				if err != nil {
					return nil, err
				}
				r.Body = io.NopCloser(bytes.NewReader(b))
				if bytes.Contains(b, []byte(fmt.Sprintf(`"observedGeneration":%d`, gen))) {
					select {
					case started <- struct{}{}:
					default:
					}
					time.Sleep(time.Second) // a slow API server
				}
			}
			return next.RoundTrip(r)
		})
	}
	p1.boot(t, f)
	p1.start(t)
	f.waitFor(t, "p1", "settled", func(m *v1alpha1.Machine, _ *corev1.Node) bool { return condTrue(m, v1alpha1.MachineConfigApplied) })

	m0, err := f.liken.Machine(t.Context(), "p1")
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(m0.Generation + 1)
	f.editMachine("p1", func(m *v1alpha1.Machine) { m.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": "7"} })
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent never wrote its status for the edit")
	}
	p1.stop() // as init does at a shutdown, while the write is under way
	m, err := f.liken.Machine(t.Context(), "p1")
	if err != nil {
		t.Fatal(err)
	}
	if m.Status.ObservedGeneration != m.Generation || !condTrue(m, v1alpha1.MachineConfigApplied) {
		t.Errorf("after the agent stopped its status says generation %d of %d (ConfigApplied %v): the write under way was lost",
			m.Status.ObservedGeneration, m.Generation, condTrue(m, v1alpha1.MachineConfigApplied))
	}
}
