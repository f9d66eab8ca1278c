package console

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWritesEveryConsole: a line goes to /dev/console (primary) and to each other console
// the kernel lists, the last listed being /dev/console's own, which is not opened twice; a
// console whose device is missing is left out; a second Find opens nothing twice.
func TestWritesEveryConsole(t *testing.T) {
	dev := t.TempDir()
	for _, name := range []string{"tty1", "ttyS1", "ttyS0"} {
		os.WriteFile(filepath.Join(dev, name), nil, 0o600)
	}
	var primary bytes.Buffer
	w := New(&primary)
	w.Write([]byte("before\n")) // before Find: /dev/console only
	got := w.Find("ttyS1 tty1 ttyS2 ttyS0\n", dev)
	if want := []string{"ttyS1", "tty1", "ttyS0"}; !slices.Equal(got, want) {
		t.Errorf("Find = %v, want %v (ttyS2 has no device)", got, want)
	}
	w.Find("ttyS1 tty1 ttyS0", dev)
	if _, err := w.Write([]byte("liken-init: k3s started\n")); err != nil {
		t.Fatal(err)
	}
	if primary.String() != "before\nliken-init: k3s started\n" {
		t.Errorf("/dev/console got %q", primary.String())
	}
	for name, want := range map[string]string{"tty1": "liken-init: k3s started\n", "ttyS1": "liken-init: k3s started\n", "ttyS0": ""} {
		if b, _ := os.ReadFile(filepath.Join(dev, name)); string(b) != want {
			t.Errorf("%s got %q, want %q", name, b, want)
		}
	}
}

// TestOneConsole: a kernel with one console (/dev/console's) has nothing to copy to; no
// list at all (no /sys) leaves /dev/console alone.
func TestOneConsole(t *testing.T) {
	var primary bytes.Buffer
	w := New(&primary)
	if got := w.Find("ttyS0\n", t.TempDir()); !slices.Equal(got, []string{"ttyS0"}) {
		t.Errorf("Find = %v", got)
	}
	if got := w.Find("", t.TempDir()); len(got) != 0 {
		t.Errorf("Find of nothing = %v", got)
	}
	w.Write([]byte("x\n"))
	if primary.String() != "x\n" {
		t.Errorf("primary got %q", primary.String())
	}
}

// TestAStalledConsoleIsGivenUp: a console that takes nothing (here a pipe nobody reads, as
// a screen stopped with Scroll Lock) holds a line for StallTimeout at most, is then left
// out for good, and /dev/console says so; /dev/console has every line.
func TestAStalledConsoleIsGivenUp(t *testing.T) {
	dev := t.TempDir()
	fifo := filepath.Join(dev, "tty1")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(fifo, os.O_RDONLY|unix.O_NONBLOCK, 0) // never read
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var primary bytes.Buffer
	w := New(&primary)
	if got := w.Find("tty1 ttyS0", dev); !slices.Equal(got, []string{"tty1", "ttyS0"}) {
		t.Fatalf("Find = %v", got)
	}
	big := bytes.Repeat([]byte("x"), 1<<20) // more than a pipe holds
	start := time.Now()
	w.Write(big)
	if took := time.Since(start); took < StallTimeout || took > StallTimeout+5*time.Second {
		t.Errorf("the stalled write took %s; want about %s", took, StallTimeout)
	}
	if !strings.Contains(primary.String(), "console tty1 took no line for 2s") {
		t.Errorf("/dev/console does not say tty1 was given up: %q", primary.String()[len(big):])
	}
	start = time.Now()
	w.Write([]byte("after\n"))
	if took := time.Since(start); took > time.Second {
		t.Errorf("a write after tty1 was given up took %s", took)
	}
	if !strings.HasSuffix(primary.String(), "after\n") {
		t.Errorf("/dev/console lost a line after the stall")
	}
}
