// Package logfile keeps a machine's own logs on its state partition, for a machine with no
// shell (issue 30): each component writes to a file rotated by size, and at each boot the
// files of the boot before move into an archive that keeps the last few boots.
//
// The layout follows what the kubelet's node log query reads when there is no journald
// (k8s.io/kubernetes pkg/kubelet/kubelet_server_journal.go: for a query NAME it tries
// /var/log/NAME, /var/log/NAME.log and /var/log/NAME/NAME.log): this boot's files are
// DIR/NAME.log (rotated ones DIR/NAME.log.1, .2, ...), and earlier boots' are under
// DIR/liken/boots/SEQ/, which the kubelet's /logs/ file handler serves as they are.
//
// Init writes them (internal/initd logs.go); `liken logs` reads them through the API.
package logfile

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// The components' log names, each kept as DIR/NAME.log: init's lines (the console's), the
// kernel's messages, the agent's and k3s's output. k3s.log is where k3s's own service scripts
// (openrc) send its output, and what a node log query for "k3s" finds without journald.
const (
	Init   = "liken-init"
	Kernel = "kernel"
	Agent  = "liken-agent"
	K3s    = "k3s"
)

// Components are the logs init keeps, in the order they are listed to a reader.
var Components = []string{Init, Kernel, Agent, K3s}

// Writer appends to a file and rotates it once it would grow past Max bytes: NAME.log
// becomes NAME.log.1 (and .1 becomes .2, up to Keep files), and writing goes on in a new
// NAME.log. A write is never split across two files.
type Writer struct {
	Path string
	Max  int64
	Keep int

	mu   sync.Mutex
	f    *os.File
	size int64
}

// Open opens (appending) or creates path.
func Open(path string, max int64, keep int) (*Writer, error) {
	if max <= 0 || keep < 0 {
		return nil, fmt.Errorf("log %s: a size bound above 0 and a count of rotated files of at least 0 are required (got %d, %d)", path, max, keep)
	}
	w := &Writer{Path: path, Max: max, Keep: keep}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Writer) open() error {
	f, err := os.OpenFile(w.Path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("opening log %s: %w", w.Path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening log %s: %w", w.Path, err)
	}
	w.f, w.size = f, st.Size()
	return nil
}

// Write appends p, rotating first when p would take the file past Max (a write larger than
// Max goes whole into a file of its own).
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return 0, fmt.Errorf("log %s: closed", w.Path)
	}
	if w.size > 0 && w.size+int64(len(p)) > w.Max {
		if err := w.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := w.f.Write(p)
	w.size += int64(n)
	return n, err
}

// rotate shifts NAME.log.(k) to .(k+1), dropping what passes Keep, and starts a new file.
func (w *Writer) rotate() error {
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("rotating log %s: %w", w.Path, err)
	}
	w.f = nil
	if w.Keep == 0 {
		if err := os.Remove(w.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("rotating log %s: %w", w.Path, err)
		}
		return w.open()
	}
	os.Remove(fmt.Sprintf("%s.%d", w.Path, w.Keep))
	for k := w.Keep - 1; k >= 1; k-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", w.Path, k), fmt.Sprintf("%s.%d", w.Path, k+1)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("rotating log %s: %w", w.Path, err)
		}
	}
	if err := os.Rename(w.Path, w.Path+".1"); err != nil {
		return fmt.Errorf("rotating log %s: %w", w.Path, err)
	}
	return w.open()
}

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// BootsDir is where earlier boots' logs are kept, under a log directory.
const BootsDir = "liken/boots"

// ArchiveBoot moves the log files a boot before left in dir for the components names
// (NAME.log and its rotated NAME.log.N; nothing else in dir, which others write to as well)
// into a new archive DIR/liken/boots/SEQ (SEQ one more than the highest there),
// and removes the oldest archives beyond keep. Run at a boot's start, before anything
// writes: a boot cut short while it moved files leaves the rest for the next boot's archive,
// never a file in two places. It returns the new archive's path ("" when there was nothing
// to move).
func ArchiveBoot(dir string, names []string, keep int) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("reading %s: %w", dir, err)
	}
	var files []string
	for _, e := range entries {
		if e.Type().IsRegular() && isLogOf(e.Name(), names) {
			files = append(files, e.Name())
		}
	}
	boots := filepath.Join(dir, BootsDir)
	seqs, err := archives(boots)
	if err != nil {
		return "", err
	}
	archive := ""
	if len(files) > 0 {
		next := 1
		if len(seqs) > 0 {
			next = seqs[len(seqs)-1] + 1
		}
		archive = filepath.Join(boots, strconv.Itoa(next))
		if err := os.MkdirAll(archive, 0o750); err != nil {
			return "", fmt.Errorf("making %s: %w", archive, err)
		}
		for _, f := range files {
			if err := os.Rename(filepath.Join(dir, f), filepath.Join(archive, f)); err != nil {
				return "", fmt.Errorf("keeping %s of the boot before: %w", f, err)
			}
		}
		seqs = append(seqs, next)
	}
	return archive, prune(boots, seqs, keep)
}

// Prune removes the oldest archives under dir beyond keep (a bound read later in the boot
// than ArchiveBoot runs, such as the Cluster's).
func Prune(dir string, keep int) error {
	boots := filepath.Join(dir, BootsDir)
	seqs, err := archives(boots)
	if err != nil {
		return err
	}
	return prune(boots, seqs, keep)
}

func prune(boots string, seqs []int, keep int) error {
	for len(seqs) > keep {
		if err := os.RemoveAll(filepath.Join(boots, strconv.Itoa(seqs[0]))); err != nil {
			return fmt.Errorf("removing the logs of an old boot: %w", err)
		}
		seqs = seqs[1:]
	}
	return nil
}

// Boot is the archive of the boot n boots before this one (n >= 1), or an error naming the
// boots kept.
func Boot(dir string, n int) (string, error) {
	seqs, err := archives(filepath.Join(dir, BootsDir))
	if err != nil {
		return "", err
	}
	if n < 1 || n > len(seqs) {
		return "", fmt.Errorf("no logs of the boot %d before this one: %d boots before it are kept", n, len(seqs))
	}
	return filepath.Join(dir, BootsDir, strconv.Itoa(seqs[len(seqs)-n])), nil
}

// archives are the archive sequence numbers under boots, in order.
func archives(boots string) ([]int, error) {
	entries, err := os.ReadDir(boots)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", boots, err)
	}
	var seqs []int
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && e.IsDir() && n > 0 {
			seqs = append(seqs, n)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// Files are component name's files among entries (the file names of one directory) in the
// order they were written: the rotated ones, NAME.log.N, the oldest (highest N) first, then
// NAME.log.
func Files(name string, entries []string) []string {
	rotated := map[int]string{}
	var current []string
	for _, e := range entries {
		if e == name+".log" {
			current = []string{e}
		} else if rest, ok := strings.CutPrefix(e, name+".log."); ok {
			if k, err := strconv.Atoi(rest); err == nil && k > 0 {
				rotated[k] = e
			}
		}
	}
	var out []string
	for _, k := range slices.Backward(slices.Sorted(maps.Keys(rotated))) {
		out = append(out, rotated[k])
	}
	return append(out, current...)
}

// isLogOf is whether file is NAME.log or NAME.log.N for one of names.
func isLogOf(file string, names []string) bool {
	return slices.ContainsFunc(names, func(n string) bool { return len(Files(n, []string{file})) > 0 })
}
