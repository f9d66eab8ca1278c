package initd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/logfile"
)

// The machine's own logs, kept on the state partition for an operator with no shell (issue
// 30): init's lines (the console's), the kernel's messages, the agent's and k3s's output,
// each in /var/log/NAME.log, where the kubelet's node log query and its /logs/ file handler
// read them (`liken logs`). The boot before's files are kept under /var/log/liken/boots.
// Nothing here may stop a boot: a log that cannot be written is said on the console, which
// keeps every line as before.
const (
	logDir = "/var/log"
	// logMax and logRotated bound each component's file: rotated at 4 MiB, one earlier file
	// kept, so a boot takes at most 4 components x 8 MiB (LogPolicy.BootsKept's doc).
	logMax     = 4 << 20
	logRotated = 1
	// logBootsBound bounds the archives before the Cluster's bound is known (pruneLogs).
	logBootsBound = 50
	// earlyMax bounds init's lines held until the state partition is mounted.
	earlyMax = 256 << 10
)

// logSink is one component's file, which may be closed (at shutdown, before the state
// partition is unmounted) while its writers still run: a write after that is dropped, the
// console having it. The first failed write is said on the console once.
type logSink struct {
	console io.Writer
	mu      sync.Mutex
	w       *logfile.Writer
	failed  bool
}

func (l *logSink) write(p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil || l.failed {
		return
	}
	if _, err := l.w.Write(p); err != nil {
		l.failed = true
		fmt.Fprintf(l.console, "liken-init: writing %s: %v; the console still has every line\n", l.w.Path, err)
	}
}

func (l *logSink) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w != nil {
		l.w.Close()
		l.w = nil
	}
}

// initLog is init's own log: every line to the console, and to liken-init.log once the
// state partition is mounted; the lines before it are held (up to earlyMax) and written
// first. In the file each line starts with the time it was written (the console's lines
// have none), as the clock read then, so `liken logs --since` can select them.
type initLog struct {
	console io.Writer
	mu      sync.Mutex
	early   []byte
	sink    *logSink
	// now is the clock; nil means time.Now.
	now func() time.Time
}

func (l *initLog) Write(p []byte) (int, error) {
	n, err := l.console.Write(p)
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	stamped := stampLines(p, now())
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sink != nil {
		l.sink.write(stamped)
	} else if len(l.early)+len(stamped) <= earlyMax {
		l.early = append(l.early, stamped...)
	}
	return n, err
}

// stampLines puts t (RFC 3339, UTC, to the millisecond) and a space before each line of p.
func stampLines(p []byte, t time.Time) []byte {
	stamp := t.UTC().AppendFormat(nil, "2006-01-02T15:04:05.000Z07:00 ")
	out := make([]byte, 0, len(p)+len(stamp)*(1+bytes.Count(p, []byte("\n"))))
	for len(p) > 0 {
		line := p
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			line = p[:i+1]
		}
		out = append(append(out, stamp...), line...)
		p = p[len(line):]
	}
	return out
}

func (l *initLog) attach(s *logSink) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.write(l.early)
	l.early, l.sink = nil, s
}

// logs are this boot's files, once openLogs made them.
type logs struct {
	sinks map[string]*logSink
}

// openLogs keeps the boot before's files in an archive and opens this boot's: init's (its
// lines so far first), and the kernel's, copied from /dev/kmsg from the ring buffer's start.
// Run once the state partition is mounted.
func (s *system) openLogs() {
	archive, err := logfile.ArchiveBoot(logDir, logfile.Components, logBootsBound)
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: keeping the last boot's logs: %v\n", err)
	}
	s.logs = &logs{sinks: map[string]*logSink{}}
	for _, name := range logfile.Components {
		w, err := logfile.Open(filepath.Join(logDir, name+".log"), logMax, logRotated)
		if err != nil {
			fmt.Fprintf(s.log, "liken-init: %v; its lines go to the console only\n", err)
			continue
		}
		s.logs.sinks[name] = &logSink{console: os.Stdout, w: w}
	}
	if il, ok := s.log.(*initLog); ok && s.logs.sinks[logfile.Init] != nil {
		il.attach(s.logs.sinks[logfile.Init])
	}
	if archive != "" {
		fmt.Fprintf(s.log, "liken-init: logs in %s; the boot before's in %s\n", logDir, archive)
	} else {
		fmt.Fprintf(s.log, "liken-init: logs in %s\n", logDir)
	}
	if k := s.logs.sinks[logfile.Kernel]; k != nil {
		go func() {
			if err := copyKmsg("/dev/kmsg", k); err != nil {
				fmt.Fprintf(s.log, "liken-init: the kernel's messages stop going to %s: %v\n", logfile.Kernel+".log", err)
			}
		}()
	}
}

// pruneLogs removes the oldest boots' logs beyond the Cluster's bound, known once the
// machine's manifest is read.
func (s *system) pruneLogs() error {
	keep := v1alpha1.DefaultLogBootsKept
	if s.cluster != nil {
		keep = s.cluster.Spec.LogBootsKept()
	}
	if err := logfile.Prune(logDir, keep); err != nil {
		fmt.Fprintf(s.log, "liken-init: %v\n", err)
	}
	return nil
}

// closeLogs closes the files, before the state partition is unmounted; what is written
// after goes to the console only.
func (s *system) closeLogs() {
	if s.logs == nil {
		return
	}
	for _, l := range s.logs.sinks {
		l.close()
	}
}

// output is what a process under the supervisor writes to: a pipe init reads for the whole
// boot (restarts share it), each line going to the console, as before, and to
// /var/log/NAME.log. Lines are copied whole, so the console never shows half a line of one
// process beside another's. Without the file, the console itself.
func (s *system) output(name string) *os.File {
	sink := s.logs.sink(name)
	if sink == nil {
		return os.Stdout
	}
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: a pipe for %s's output: %v; it goes to the console only\n", name, err)
		return os.Stdout
	}
	go copyLines(r, os.Stdout, sink)
	return w
}

func (l *logs) sink(name string) *logSink {
	if l == nil {
		return nil
	}
	return l.sinks[name]
}

// copyLines copies r to console and sink a line at a time (a line longer than the buffer in
// pieces), until r ends.
func copyLines(r io.Reader, console io.Writer, sink *logSink) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			console.Write(line)
			sink.write(line)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// copyKmsg copies the kernel's messages from path (/dev/kmsg: one record per read, from the
// ring buffer's oldest) to sink as dmesg prints them: "[seconds.micros] message". Records
// overwritten before they were read (EPIPE) are skipped, as dmesg does.
func copyKmsg(path string, sink *logSink) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 16<<10)
	for {
		n, err := f.Read(buf)
		if errors.Is(err, syscall.EPIPE) {
			continue
		}
		if err != nil {
			return err
		}
		if line, ok := kmsgLine(buf[:n]); ok {
			sink.write(line)
		}
	}
}

// kmsgLine formats one /dev/kmsg record ("PRI,SEQ,MICROS,FLAGS[,...];MESSAGE\n" followed by
// " KEY=VALUE" continuation lines, left out) as a dmesg line.
func kmsgLine(rec []byte) ([]byte, bool) {
	header, msg, ok := bytes.Cut(rec, []byte(";"))
	if !ok {
		return nil, false
	}
	fields := bytes.Split(header, []byte(","))
	if len(fields) < 3 {
		return nil, false
	}
	us, err := strconv.ParseUint(string(fields[2]), 10, 64)
	if err != nil {
		return nil, false
	}
	msg, _, _ = bytes.Cut(msg, []byte("\n"))
	return fmt.Appendf(nil, "[%5d.%06d] %s\n", us/1_000_000, us%1_000_000, msg), true
}
