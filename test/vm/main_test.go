package vm

import (
	"flag"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The VM tests run LIKEN_VM_PARALLEL at a time (default 2), longest first. A VM test spends
// much of its time waiting on the machine (a grace period, a trial's deadline, a drain, the
// API server inside a 1-vCPU machine starting): one test alone keeps a 2-core host about
// 60% busy (the ledger's CPU line), so two at once finish the tier sooner. Longest first,
// because the tier ends when its last test does: a long test started last would run
// alone at the end.

// expectedSeconds is roughly each VM test's time, for the order only (a test missing here
// goes after those listed): from make test's time ledger on a 2-core build machine without
// KVM, two VM tests at a time beside the other packages (ci21, December 2026).
// TestInstallAndBootSlotA's is the two tests it merged; TestNoMachineMatchesTheHardware's
// half of TestMachineFoundByMAC's, whose first boot it no longer has.
var expectedSeconds = map[string]int{
	"TestLabUpAndDown":                      1900,
	"TestTrialFailuresEndOnTheLastGoodSlot": 1036,
	"TestDataDiskAndNetworkTrials":          621,
	"TestTwoMachinesTakeTurns":              559,
	"TestUpgradeCommitAndRollback":          323,
	"TestClockBeforeK3s":                    127,
	"TestInstallAndBootSlotA":               80,
	"TestInstalledMachineJoinsTheAPI":       61,
	"TestNoMachineMatchesTheHardware":       52,
	"TestTrialOfBrokenSlotFallsBack":        35,
	"TestReleaseBuildReproducible":          31,
	"TestNetworkPortsInVM":                  17,
	"TestGRUBReadsEveryPowerCut":            13,
	"TestGRUBFindsNoSerialPort":             13,
	"TestInstallerInstallsAMachine":         190,
	"TestBootToSystemStage":                 9,
	"TestWaitEndsWhenAMachineStops":         6,
}

func TestMain(m *testing.M) {
	flag.Parse()
	// Every VM test waits in vmTest for one of the scheduler's slots, which decide how many
	// run at once and in what order; go test's own limit on parallel tests would hold the
	// longest back in source order.
	flag.Set("test.parallel", "64")
	sched.slots = 2
	if n, err := strconv.Atoi(os.Getenv("LIKEN_VM_PARALLEL")); err == nil && n > 0 {
		sched.slots = n
	}
	os.Exit(m.Run())
}

// afterOthers are the VM tests whose machines keep the host's cores busy for their whole
// run: the lab's server runs a control plane in TCG, about 0.9 of a host core at rest and
// both cores while it boots, its agent 0.3 (measured with /proc on QEMU, December 2026).
// Under make test they take a slot only once the other packages' tests are done (the file
// LIKEN_VM_AFTER names exists), while the lighter VM tests run beside those: started first,
// beside the unit tier, the lab's machines took 1063 s to be Ready against 206 s alone,
// and every second of that wait cost a core of the host.
var afterOthers = map[string]bool{"TestLabUpAndDown": true}

// afterOthersBound is the longest an afterOthers test waits for the other packages.
const afterOthersBound = 20 * time.Minute

// vmTest makes t one of the VM tests the scheduler runs LIKEN_VM_PARALLEL at a time,
// longest first. Every VM test calls it first. Each of meanwhile runs first, before the
// waits: host-side work (builds) that needs no VM, done while the test would wait anyway.
func vmTest(t *testing.T, meanwhile ...func()) {
	t.Helper()
	t.Parallel()
	for _, f := range meanwhile {
		f()
	}
	start := time.Now()
	if f := os.Getenv("LIKEN_VM_AFTER"); f != "" && afterOthers[t.Name()] {
		for {
			if _, err := os.Stat(f); err == nil {
				break
			}
			if time.Since(start) > afterOthersBound {
				t.Logf("the other packages' tests are not done after %s (%s is missing): starting anyway", afterOthersBound, f)
				break
			}
			time.Sleep(2 * time.Second)
		}
	}
	sched.acquire(t.Name())
	// go test counts the wait in the test's time; the ledger takes it out (hack/ledger).
	t.Logf("liken-ledger: waited %.1fs for a VM slot", time.Since(start).Seconds())
	t.Cleanup(sched.release)
}

var sched = scheduler{expected: expectedSeconds}

// scheduler hands out slots to waiting tests, the longest expected first. Tests released
// by t.Parallel all arrive within moments; the first slots are handed out once none has
// arrived for a settle time, so that the longest is among those waiting.
type scheduler struct {
	expected map[string]int
	mu       sync.Mutex
	cond     *sync.Cond
	slots    int
	running  int
	waiting  []string
	settled  bool
}

const settleTime = 500 * time.Millisecond

func (s *scheduler) acquire(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cond == nil {
		s.cond = sync.NewCond(&s.mu)
		go func() {
			for n := -1; ; {
				time.Sleep(settleTime)
				s.mu.Lock()
				if len(s.waiting) == n {
					s.settled = true
					s.cond.Broadcast()
					s.mu.Unlock()
					return
				}
				n = len(s.waiting)
				s.mu.Unlock()
			}
		}()
	}
	s.waiting = append(s.waiting, name)
	for !s.settled || s.running >= s.slots || s.next() != name {
		s.cond.Wait()
	}
	s.waiting = slices.DeleteFunc(s.waiting, func(w string) bool { return w == name })
	s.running++
	s.cond.Broadcast()
}

func (s *scheduler) release() {
	s.mu.Lock()
	s.running--
	s.cond.Broadcast()
	s.mu.Unlock()
}

// next is the waiting test expected to take longest (the first to arrive among equals).
func (s *scheduler) next() string {
	best := ""
	for _, w := range s.waiting {
		if best == "" || s.expected[w] > s.expected[best] {
			best = w
		}
	}
	return best
}

// TestSchedulerLongestFirst: tests arriving in source order get slots longest first, no
// more than the slots at once, and one unknown to the table goes last.
func TestSchedulerLongestFirst(t *testing.T) {
	s := &scheduler{slots: 2, expected: map[string]int{"long": 300, "mid": 200, "short": 100}}
	var mu sync.Mutex
	var order []string
	running, most := 0, 0
	var wg sync.WaitGroup
	for _, name := range []string{"short", "unknown", "mid", "long"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.acquire(name)
			mu.Lock()
			order = append(order, name)
			running++
			most = max(most, running)
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			mu.Lock()
			running--
			mu.Unlock()
			s.release()
		}()
		time.Sleep(10 * time.Millisecond) // arrivals in this order, as t.Parallel releases them
	}
	wg.Wait()
	if !slices.Equal(order[:2], []string{"long", "mid"}) && !slices.Equal(order[:2], []string{"mid", "long"}) || order[2] != "short" || order[3] != "unknown" {
		t.Errorf("slots given in the order %v; want long and mid, then short, then unknown", order)
	}
	if most != 2 {
		t.Errorf("%d tests ran at once with 2 slots", most)
	}
}
