package lab

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/internal/qemu"
)

// running is a real process a test started, and whether it has ended.
type running struct {
	pid  int
	done <-chan struct{}
}

func (r running) ended(within time.Duration) bool {
	select {
	case <-r.done:
		return true
	case <-time.After(within):
		return false
	}
}

// startAs starts a long-running process the way the lab starts QEMU and the channel server
// (State.start: tagged, its own session). The test's cleanup stops whatever is left.
func startAs(t *testing.T, s *State, name string, args ...string) running {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	done, err := s.start(name, cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Kill(s.Dir, 0) })
	return running{cmd.Process.Pid, done}
}

// startUntagged starts a process the lab did not start: the user's own, or one the system
// gave a PID the lab once recorded.
func startUntagged(t *testing.T) running {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	return running{cmd.Process.Pid, done}
}

func writeState(t *testing.T, s *State) {
	t.Helper()
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.save(); err != nil {
		t.Fatal(err)
	}
}

// TestDownStopsEveryProcess: down stops every process the lab started, found by its tag, in
// whatever state the lab is (its directory removed, lab.json naming other PIDs, a process
// that ignores SIGTERM, a child the lab never saw), and touches no other process: neither one
// whose PID lab.json records, nor one of another lab whose directory starts the same.
func TestDownStopsEveryProcess(t *testing.T) {
	t.Run("its directory removed", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "lab")
		st := &State{Dir: dir}
		writeState(t, st)
		server := startAs(t, st, "lab-server-1", "sleep", "600")
		// A process that starts its own: the child carries the tag without being recorded.
		channel := startAs(t, st, "channel server", "sh", "-c", "sleep 600 & wait")
		other := startAs(t, &State{Dir: dir + "-2"}, "lab-server-1", "sleep", "600")
		mine := startUntagged(t)
		waitFor(t, func() bool {
			l, _ := Leftovers(dir)
			return len(l) == 3 && slices.ContainsFunc(l, func(p Proc) bool { return p.Name == "channel server" && p.Command == "sleep" })
		}, "the channel server's child to start sleep")
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}

		var out bytes.Buffer
		if err := Down(dir, &out); err != nil {
			t.Fatalf("down with the lab's directory gone: %v\n%s", err, &out)
		}
		if !server.ended(2*time.Second) || !channel.ended(2*time.Second) {
			t.Errorf("down left the lab's processes running:\n%s", &out)
		}
		if left, err := Leftovers(dir); err != nil || len(left) > 0 {
			t.Errorf("after down, Leftovers = %v, %v (the channel server's child?)", left, err)
		}
		for _, want := range []string{"stopping lab-server-1 (sleep, pid ", "stopping channel server (sh, pid ", "stopping channel server (sleep, pid ", dir + " was already gone"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("down did not say %q:\n%s", want, &out)
			}
		}
		if other.ended(0) || mine.ended(0) {
			t.Errorf("down stopped a process that is not its lab's (another lab's: %v, untagged: %v)", other.ended(0), mine.ended(0))
		}
	})

	t.Run("lab.json naming other processes", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "lab")
		// The PIDs recorded are now other programs': down must not take them for the lab's.
		mine, other := startUntagged(t), startAs(t, &State{Dir: dir + "-2"}, "channel server", "sleep", "600")
		st := &State{Dir: dir, ChannelPID: other.pid, Machines: []Machine{{Name: "lab-server-1", PID: mine.pid}}}
		writeState(t, st)
		agent := startAs(t, st, "lab-agent-1", "sleep", "600") // started, never recorded
		if st.Alive(mine.pid) || st.Alive(other.pid) || !st.Alive(agent.pid) {
			t.Errorf("Alive: untagged %v, another lab's %v, the lab's %v; want false, false, true", st.Alive(mine.pid), st.Alive(other.pid), st.Alive(agent.pid))
		}
		if got := st.Running(); len(got) != 1 || got["lab-agent-1"] != agent.pid {
			t.Errorf("Running = %v; want only lab-agent-1 (pid %d)", got, agent.pid)
		}

		var out bytes.Buffer
		if err := Down(dir, &out); err != nil {
			t.Fatalf("down: %v\n%s", err, &out)
		}
		if !agent.ended(2 * time.Second) {
			t.Errorf("down left lab-agent-1 running:\n%s", &out)
		}
		if mine.ended(0) || other.ended(0) {
			t.Errorf("down stopped a process lab.json named but the lab did not start (untagged: %v, another lab's: %v)", mine.ended(0), other.ended(0))
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("down left %s (%v)", dir, err)
		}
	})

	t.Run("SIGTERM ignored", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "lab")
		st := &State{Dir: dir}
		stubborn := startAs(t, st, "lab-server-1", "sh", "-c", `trap "" TERM; sleep 600 & wait`)
		waitFor(t, func() bool { l, _ := Leftovers(dir); return len(l) == 2 }, "the child to start")
		start := time.Now()
		found, err := Kill(dir, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(found) != 2 || !stubborn.ended(2*time.Second) {
			t.Errorf("Kill found %v and the process ended: %v; want sh and its sleep, ended", found, stubborn.ended(0))
		}
		if took := time.Since(start); took < 300*time.Millisecond {
			t.Errorf("Kill took %s: SIGKILL before the grace ran out", took)
		}
		if left, _ := Leftovers(dir); len(left) > 0 {
			t.Errorf("after SIGKILL, still running: %v", left)
		}
	})

	t.Run("nothing there", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644)
		if err := Down(dir, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "no lab in") {
			t.Errorf("down in a directory that is no lab's: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err != nil {
			t.Errorf("down touched a directory that is no lab's: %v", err)
		}
	})
}

// TestStartedIsFound: a process is found by its tag as soon as start returns (the kernel
// shows a new program's environment a moment after the exec Start waits for), so a failure
// right after a start still stops it.
func TestStartedIsFound(t *testing.T) {
	st := &State{Dir: filepath.Join(t.TempDir(), "lab")}
	for range 30 {
		p := startAs(t, st, "lab-server-1", "sleep", "600")
		if !st.Alive(p.pid) {
			t.Fatalf("pid %d, just started, is not found by its tag", p.pid)
		}
	}
}

// TestUpFailureStopsEveryProcess: up's failure path stops every process the lab started,
// recorded or not, and removes the directory, keeping up's error.
func TestUpFailureStopsEveryProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lab")
	st := &State{Dir: dir}
	writeState(t, st)
	recorded := startAs(t, st, "lab-server-1", "sleep", "600")
	st.Machines = []Machine{{Name: "lab-server-1", PID: recorded.pid}}
	// Started just as up failed, before it was recorded.
	unrecorded := startAs(t, st, "lab-agent-1", "sleep", "600")
	mine := startUntagged(t)
	failed := errors.New("not every machine was Ready")
	if err := st.abandon(failed); !errors.Is(err, failed) || err.Error() != failed.Error() {
		t.Errorf("abandon = %v; want up's error alone", err)
	}
	if !recorded.ended(2*time.Second) || !unrecorded.ended(2*time.Second) {
		t.Errorf("up's failure path left processes running: recorded %v, unrecorded %v", !recorded.ended(0), !unrecorded.ended(0))
	}
	if mine.ended(0) {
		t.Errorf("up's failure path stopped a process that is not the lab's")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("up's failure path left %s (%v)", dir, err)
	}
}

// TestUpRefusesWhereALabStillRuns: a lab whose directory was removed while its processes ran
// is refused by up (a new lab there would carry the same tag), and its processes are left to
// `down`.
func TestUpRefusesWhereALabStillRuns(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lab")
	old := startAs(t, &State{Dir: dir}, "lab-server-1", "sleep", "600")
	o := Defaults
	o.Dir = dir
	if l, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		o.APIPort = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	if _, err := Up(t.Context(), o); err == nil || !strings.Contains(err.Error(), "processes of an earlier lab in "+dir+" still run (lab-server-1 (sleep, pid ") {
		t.Fatalf("up where a lab's processes still run: %v", err)
	}
	if old.ended(0) {
		t.Errorf("a refused up stopped the earlier lab's process")
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("a refused up created %s", dir)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDownStopsARealQEMU: a machine booted as up boots it (a real QEMU, a blank disk: the
// firmware finds nothing to boot) is found by its tag and stopped by down once the lab's
// directory is gone.
func TestDownStopsARealQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		// make test installs it (hack/deps.sh): missing, the proof would not run, so fail.
		t.Fatal("no qemu-system-x86_64 (Debian package qemu-system-x86; make deps installs it)")
	}
	if _, err := os.Stat(qemu.OVMFCode); err != nil {
		t.Fatal("no OVMF (Debian package ovmf; make deps installs it)")
	}
	dir := filepath.Join(t.TempDir(), "lab")
	st := &State{Dir: dir, Machines: []Machine{{Name: "lab-agent-1", Role: "agent", MAC: "52:54:00:12:34:20", MemoryMiB: 128}}}
	m := &st.Machines[0]
	m.Disk, m.Console = filepath.Join(dir, m.Name, "disk.img"), filepath.Join(dir, m.Name, "console.log")
	writeState(t, st)
	os.MkdirAll(filepath.Dir(m.Disk), 0o755)
	if err := os.WriteFile(m.Disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := st.boot(m, false, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Kill(dir, 0) })
	left, err := Leftovers(dir)
	if err != nil || len(left) != 1 || left[0].PID != m.PID || left[0].Name != m.Name || left[0].Command != "qemu-system-x86_64" {
		console, _ := os.ReadFile(m.Console)
		t.Fatalf("Leftovers = %v, %v; want lab-agent-1's QEMU, pid %d; console:\n%s", left, err, m.PID, console)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Down(dir, &out); err != nil {
		t.Fatalf("down: %v\n%s", err, &out)
	}
	if left, _ := Leftovers(dir); len(left) > 0 || st.Alive(m.PID) {
		t.Errorf("QEMU still runs after down: %v\n%s", left, &out)
	}
}
