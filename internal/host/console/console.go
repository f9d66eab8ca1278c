// Package console writes init's lines on every console the kernel was given, not only on
// /dev/console. The kernel prints its own messages on each console its command line names
// (GRUB gives console=tty0, the screen, and console=ttyS0, the first serial port, where
// there is one), but /dev/console, where init's output goes, is only the last one named.
// Without this, a machine with a screen and a serial port shows the kernel's messages on
// the screen and none of liken's.
package console

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ActiveFile lists the kernel's consoles, such as "tty0 ttyS0"; the last is the one
// /dev/console is (Documentation/ABI/testing/sysfs-tty, "active").
const ActiveFile = "/sys/class/tty/console/active"

// Writer writes to /dev/console (primary) and a copy to every other console the kernel
// has. Only primary's errors are returned. A console that takes no line within
// StallTimeout (a screen whose output an operator stopped with Scroll Lock, a serial port
// whose flow control holds it) is given up for the rest of the boot, and primary says so:
// init never waits on it again.
type Writer struct {
	primary io.Writer

	mu     sync.Mutex
	others map[string]*os.File
	names  []string
}

// StallTimeout bounds the wait for a console to take a line: at 115200 baud a tty's
// buffer drains in a third of a second.
const StallTimeout = 2 * time.Second

// New writes to primary until Find opens the other consoles.
func New(primary io.Writer) *Writer {
	return &Writer{primary: primary, others: map[string]*os.File{}}
}

// Find opens, under dev, the consoles that active (ActiveFile's text) names besides the
// last, which primary is. It may be called again (once /sys is mounted, say); a console is
// opened once. A console whose device does not open is left out. It returns every console
// init's lines now go to, /dev/console's last.
func (w *Writer) Find(active, dev string) []string {
	names := strings.Fields(active)
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, name := range names {
		if i == len(names)-1 || w.others[name] != nil || strings.ContainsAny(name, "/.") {
			continue
		}
		// No controlling terminal for PID 1. Go opens a tty non-blocking, through its
		// poller, so a write can have a deadline.
		f, err := os.OpenFile(filepath.Join(dev, name), os.O_WRONLY|unix.O_NOCTTY, 0)
		if err != nil {
			continue
		}
		w.others[name] = f
		w.names = append(w.names, name)
	}
	out := append([]string{}, w.names...)
	if len(names) > 0 {
		out = append(out, names[len(names)-1])
	}
	return out
}

// FindActive is Find with the running kernel's consoles, under /dev.
func (w *Writer) FindActive() []string {
	b, err := os.ReadFile(ActiveFile)
	if err != nil {
		return nil
	}
	return w.Find(string(b), "/dev")
}

func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.primary.Write(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	kept := w.names[:0]
	for _, name := range w.names {
		f := w.others[name]
		f.SetWriteDeadline(time.Now().Add(StallTimeout)) // a regular file (a test's) has none
		if _, werr := f.Write(p); errors.Is(werr, os.ErrDeadlineExceeded) {
			fmt.Fprintf(w.primary, "liken-init: console %s took no line for %s; init's lines go on without it this boot\n", name, StallTimeout)
			f.Close()
			delete(w.others, name)
			continue
		}
		kept = append(kept, name)
	}
	w.names = kept
	return n, err
}
