package vm

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// The machines each test booted, by top-level test name: a wait on the API's state ends
// at once when one of them stopped that the test did not stop (it cannot come back, so
// the state the wait looks for cannot come either).
var (
	machinesMu sync.Mutex
	machines   = map[string][]*VM{}
)

func topLevel(t *testing.T) string {
	name, _, _ := strings.Cut(t.Name(), "/")
	return name
}

func register(t *testing.T, v *VM) {
	machinesMu.Lock()
	defer machinesMu.Unlock()
	machines[topLevel(t)] = append(machines[topLevel(t)], v)
}

// stoppedMachine describes a machine of t's that stopped on its own (powered off, or
// QEMU exited), or is "".
func stoppedMachine(t *testing.T) string {
	machinesMu.Lock()
	defer machinesMu.Unlock()
	for _, v := range machines[topLevel(t)] {
		if v.stoppedByItself() {
			c := v.Console()
			lines := strings.Split(strings.TrimRight(c, "\n"), "\n")
			return fmt.Sprintf("a machine stopped (%v) %s after it started; its console's last lines:\n%s",
				v.err, v.ended.Sub(v.start).Round(time.Second), strings.Join(lines[max(0, len(lines)-15):], "\n"))
		}
	}
	return ""
}

// firstBoot bounds a wait for a freshly installed machine to be running (k3s healthy, its
// Machine reporting). Alone that takes 51 s to 2m21s, but the VM tests that start first run
// beside make test's compiling of every package, the race build and vet, when a machine
// gets about a fifth of a core: 4m32s once, and more than 5 minutes twice (December 2026,
// k3s started 107 s into the boot against 16 s alone). Twice the worst seen.
const firstBoot = 10 * time.Minute

// waitUntil polls cond every interval until it holds, the bound passes, or one of the test's
// machines stops by itself; it logs how much of its bound it used (for choosing bounds
// from the ledger's measured times).
func waitUntil(t *testing.T, what string, interval, bound time.Duration, cond func(ctx context.Context) (bool, error)) error {
	t.Helper()
	start := time.Now()
	var stopped string
	err := wait.PollUntilContextTimeout(t.Context(), interval, bound, true, func(ctx context.Context) (bool, error) {
		if stopped = stoppedMachine(t); stopped != "" {
			return false, fmt.Errorf("%s", stopped)
		}
		return cond(ctx)
	})
	took := time.Since(start)
	switch {
	case err == nil:
		t.Logf("liken-ledger: wait %q took %s of its %s", what, took.Round(time.Second), bound)
	case stopped != "":
		err = fmt.Errorf("after %s of waiting: %s", took.Round(time.Second), stopped)
	default:
		err = fmt.Errorf("not within %s: %w", bound, err)
	}
	return err
}

// TestWaitEndsWhenAMachineStops: a wait on state that needs a machine running ends as soon
// as the machine stops by itself (here a kernel with no root file system, which panics and,
// with -no-reboot, powers off), says so with the console's end, and does not wait out its
// bound; a machine the test stopped itself does not end a wait.
func TestWaitEndsWhenAMachineStops(t *testing.T) {
	vmTest(t)
	rel, err := BuildRelease(releaseA)
	if err != nil {
		t.Fatal(err)
	}
	v := bootWith(t, Options{Kernel: rel.Path("vmlinuz"), Append: "console=ttyS0 panic=-1 root=/dev/nonexistent", MemoryMiB: 256})
	start := time.Now()
	err = waitUntil(t, "something that cannot come", time.Second, 10*time.Minute, func(context.Context) (bool, error) { return false, nil })
	if err == nil || !strings.Contains(err.Error(), "a machine stopped") || !strings.Contains(err.Error(), "Kernel panic") {
		t.Errorf("the wait ended with %v; want the machine's stop and its console's end", err)
	}
	if took := time.Since(start); took > 5*time.Minute {
		t.Errorf("the wait took %s after the machine stopped", took)
	}

	v.Wait(time.Minute) // seen stopped: from here on, expected so

	v2 := bootWith(t, Options{Kernel: rel.Path("vmlinuz"), Append: "console=ttyS0 panic=-1 root=/dev/nonexistent", MemoryMiB: 256})
	v2.Kill()
	if err := waitUntil(t, "a condition that holds", time.Second, time.Minute, func(context.Context) (bool, error) { return true, nil }); err != nil {
		t.Errorf("a machine the test stopped ended a wait: %v", err)
	}
}

// eventually runs fn until it succeeds, for up to two minutes: an API server inside an
// emulated machine that shares the host's cores with other tests can miss a client's
// timeout now and then, which is no failure of what the test checks. It fails the test
// with fn's last error.
func eventually(t *testing.T, what string, fn func(ctx context.Context) error) {
	t.Helper()
	var last error
	if err := waitUntil(t, what, 2*time.Second, 2*time.Minute, func(ctx context.Context) (bool, error) {
		last = fn(ctx)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%s: %v (last error: %v)", what, err, last)
	}
}
