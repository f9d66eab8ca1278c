package supervisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a k3s-like process: with LIKEN_TEST_HELPER=k3s it starts a
// shim-like child in a session of its own (as containerd does for its shims), writes both
// PIDs to a file and waits for a signal.
func TestMain(m *testing.M) {
	switch os.Getenv("LIKEN_TEST_HELPER") {
	case "k3s":
		shim := exec.Command(os.Args[0])
		shim.Env = append(os.Environ(), "LIKEN_TEST_HELPER=shim")
		shim.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := shim.Start(); err != nil {
			os.Exit(3)
		}
		f, _ := os.OpenFile(os.Getenv("LIKEN_TEST_PIDS"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		fmt.Fprintf(f, "%d %d\n", os.Getpid(), shim.Process.Pid)
		f.Close()
		select {}
	case "shim":
		time.Sleep(time.Minute)
		os.Exit(0)
	case "crash":
		os.Exit(7)
	}
	os.Exit(m.Run())
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func readPIDs(t *testing.T, path string, lines int) [][2]int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(path)
		ls := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(ls) >= lines && ls[0] != "" {
			var out [][2]int
			for _, l := range ls {
				f := strings.Fields(l)
				a, _ := strconv.Atoi(f[0])
				b, _ := strconv.Atoi(f[1])
				out = append(out, [2]int{a, b})
			}
			return out
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the k3s-like process did not report %d starts", lines)
	return nil
}

func TestRestartKeepsShims(t *testing.T) {
	pids := filepath.Join(t.TempDir(), "pids")
	p := New(Spec{Name: "k3s", Path: os.Args[0], Env: append(os.Environ(), "LIKEN_TEST_HELPER=k3s", "LIKEN_TEST_PIDS="+pids),
		RestartDelay: 100 * time.Millisecond, StopTimeout: 5 * time.Second}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	first := readPIDs(t, pids, 1)[0]

	sock := filepath.Join(t.TempDir(), "init.sock")
	srv := &Server{Processes: map[string]*Process{"k3s": p}}
	go srv.Serve(ctx, sock)
	waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
	if err := (Client{Socket: sock}).RestartK3s(ctx); err != nil {
		t.Fatal(err)
	}
	second := readPIDs(t, pids, 2)[1]
	if second[0] == first[0] {
		t.Fatalf("k3s was not restarted (pid %d)", first[0])
	}
	if alive(first[0]) {
		t.Errorf("the old k3s process %d still runs", first[0])
	}
	if !alive(first[1]) {
		t.Errorf("the shim %d of the old k3s died with the restart; containers would have stopped", first[1])
	}
	time.Sleep(300 * time.Millisecond) // longer than RestartDelay: a double start would show
	if n := p.Starts(); n != 2 {
		t.Errorf("started %d times, want 2 (one start, one restart)", n)
	}
	if _, err := (Client{Socket: sock}).Restart(ctx, "nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("restart of an unknown process: %v", err)
	}
	cancel()
	<-done
	if alive(second[0]) {
		t.Errorf("k3s still runs after the supervisor stopped")
	}
	for _, s := range []int{first[1], second[1]} {
		syscall.Kill(s, syscall.SIGKILL)
	}
}

func TestCrashIsRestarted(t *testing.T) {
	p := New(Spec{Name: "crash", Path: os.Args[0], Env: append(os.Environ(), "LIKEN_TEST_HELPER=crash"), RestartDelay: 50 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	waitFor(t, func() bool { return p.Starts() >= 3 })
	cancel()
	<-done
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
