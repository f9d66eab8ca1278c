package standin

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
		err        bool
	}{
		{"a part", "412 (kube-apiserver) S 1 412 412 0 -1 4194560 9 0 0 0 1200 300 40 10 20 0 12 0 500 0 0", 15500 * time.Millisecond, false},
		{"a name with spaces and parentheses", "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 5 5 0 0 20 0 1 0 1 0 0", 100 * time.Millisecond, false},
		{"no name", "7 a R 1", 0, true},
		{"cut short", "7 (a) R 1 7 7 0", 0, true},
		{"not a number", "7 (a) R 1 7 7 0 -1 0 0 0 0 0 x 5 0 0 20", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statCPU(tc.stat)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("statCPU = %v, %v; want %v, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestMachineCPU(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	busy, total, err := machineCPU("cpu  100 5 50 800 40 1 4 0 30 0\ncpu0 1 2 3 4\n")
	if err != nil || busy != 160 || total != 1000 {
		t.Errorf("machineCPU = %d, %d, %v; want 160 busy of 1000", busy, total, err)
	}
	if _, _, err := machineCPU("intr 1 2 3\n"); err == nil {
		t.Error("machineCPU of a line that is not the cpu line: no error")
	}
}

// TestPartsCPU: a part that burns CPU is in the ledger with that time, from /proc while it
// runs and from its exit status once it ended, and the line names the parts, most first.
func TestPartsCPU(t *testing.T) {
	dir := t.TempDir()
	exited := make(chan error, 1)
	// A loop of about a second of CPU in the shell, then a pause while the test reads /proc.
	stopped, err := spawnPart(t.Context(), "burner", "/bin/sh", []string{"-c", `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 2`},
		nil, filepath.Join(dir, "burner.log"), io.Discard, exited)
	if err != nil {
		t.Fatal(err)
	}
	var running time.Duration
	for deadline := time.Now().Add(time.Minute); running < 200*time.Millisecond && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		running = parts.byPart()["burner"]
	}
	if running < 200*time.Millisecond {
		t.Fatalf("the running part's CPU time from /proc: %v; want at least 200ms", running)
	}
	<-stopped
	ended := parts.byPart()["burner"]
	if ended < running {
		t.Errorf("the ended part's CPU time %v is less than it was seen running (%v)", ended, running)
	}
	line := cpuLine(map[string]time.Duration{"etcd": time.Second, "kube-apiserver": 3 * time.Second, "burner": ended}, time.Second, 42, 5*time.Minute)
	if !strings.Contains(line, "kube-apiserver 3.0, ") || strings.Index(line, "kube-apiserver") > strings.Index(line, "etcd 1.0") ||
		!strings.Contains(line, "42% busy over the last 5m0s") || !strings.Contains(line, "not k3s's") {
		t.Errorf("the CPU line: %s", line)
	}
}

// TestBusiest: every process's own time counted once, summed by name, most first; the kernel's
// split from /proc/stat.
func TestBusiest(t *testing.T) {
	dir := t.TempDir()
	for pid, stat := range map[string]string{
		"1":    "1 (init) S 0 1 1 0 -1 0 0 0 0 0 100 50 900 900 20 0 1 0 1 0 0",
		"20":   "20 (runc) S 1 20 20 0 -1 0 0 0 0 0 30 10 0 0 20 0 1 0 1 0 0",
		"21":   "21 (runc) S 1 21 21 0 -1 0 0 0 0 0 30 10 0 0 20 0 1 0 1 0 0",
		"30":   "30 (a (b)) S 1 30 30 0 -1 0 0 0 0 0 500 0 0 0 20 0 1 0 1 0 0",
		"31":   "31 (idle) S 1 31 31 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0",
		"self": "not a pid",
	} {
		if err := os.MkdirAll(filepath.Join(dir, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := busiest(dir, 2), "a (b) 5.0, init 1.5"; got != want {
		t.Errorf("busiest(2) = %q; want %q", got, want)
	}
	if got, want := busiest(dir, 10), "a (b) 5.0, init 1.5, runc 0.8"; got != want {
		t.Errorf("busiest(10) = %q; want %q (a process's children are not counted twice, an idle one not at all)", got, want)
	}
	if got, want := machineSplit("cpu  100 5 50 800 40 1 4 0 30 0\n"), "user 1, system 0, irq and softirq 0, idle and iowait 8"; got != want {
		t.Errorf("machineSplit = %q; want %q", got, want)
	}
	if got := machineSplit("intr 1\n"); got != "unknown" {
		t.Errorf("machineSplit of another line = %q; want unknown", got)
	}
}
