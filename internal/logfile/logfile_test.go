package logfile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestWriterRotates: a write that would pass the bound goes into a new file, the old ones
// shift, only Keep of them stay, no write is split, and a reopened log appends.
func TestWriterRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "liken-agent.log")
	w, err := Open(path, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"aaaa\n", "bbbb\n", "cccc\n", "dddd\n", "eeee\n", "ffff\n", "gggg\n"} {
		if n, err := w.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("write %q: %d %v", line, n, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Two writes of 5 bytes fill a file of 10: aaaa bbbb | cccc dddd | eeee ffff | gggg.
	for file, want := range map[string]string{"liken-agent.log": "gggg\n", "liken-agent.log.1": "eeee\nffff\n", "liken-agent.log.2": "cccc\ndddd\n"} {
		if got := read(t, filepath.Join(dir, file)); got != want {
			t.Errorf("%s = %q; want %q", file, got, want)
		}
	}
	if got := names(t, dir); !slices.Equal(got, []string{"liken-agent.log", "liken-agent.log.1", "liken-agent.log.2"}) {
		t.Errorf("files %v: want the log and two rotated ones (Keep 2)", got)
	}
	// Reopened (a restarted writer): it appends, and counts what is there.
	w, err = Open(path, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("hhhh\n"))
	w.Write([]byte("iiii\n"))
	w.Close()
	if got := read(t, path); got != "iiii\n" || read(t, path+".1") != "gggg\nhhhh\n" {
		t.Errorf("after a reopen: %q and .1 %q", got, read(t, path+".1"))
	}
	// A write larger than the bound goes whole into a file of its own.
	w, _ = Open(path, 10, 2)
	big := strings.Repeat("x", 25) + "\n"
	w.Write([]byte(big))
	w.Close()
	if got := read(t, path); got != big {
		t.Errorf("a write past the bound: %q; want it whole in a new file", got)
	}
	// Keep 0: no rotated file stays.
	zero := filepath.Join(dir, "k3s.log")
	w, _ = Open(zero, 5, 0)
	w.Write([]byte("12345"))
	w.Write([]byte("678"))
	w.Close()
	if _, err := os.Stat(zero + ".1"); err == nil || read(t, zero) != "678" {
		t.Errorf("Keep 0: %q, and a .1 left: %v", read(t, zero), err == nil)
	}
	if _, err := Open(zero, 0, 1); err == nil {
		t.Errorf("a bound of 0 was accepted")
	}
}

// TestWriterConcurrent: writers at once (init's and a component's output) lose no line and
// split none, across rotations (run with -race).
func TestWriterConcurrent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "liken-init.log")
	w, err := Open(path, 4096, 100)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				fmt.Fprintf(w, "writer %d line %03d\n", g, i)
			}
		})
	}
	wg.Wait()
	w.Close()
	var all bytes.Buffer
	for _, n := range names(t, dir) {
		all.WriteString(read(t, filepath.Join(dir, n)))
	}
	lines := strings.Split(strings.TrimSuffix(all.String(), "\n"), "\n")
	if len(lines) != 2000 {
		t.Fatalf("%d lines kept; want 2000", len(lines))
	}
	seen := map[string]bool{}
	for _, l := range lines {
		if !strings.HasPrefix(l, "writer ") || len(l) != len("writer 0 line 000") {
			t.Fatalf("a split or mixed line: %q", l)
		}
		seen[l] = true
	}
	if len(seen) != 2000 {
		t.Errorf("%d distinct lines; want 2000", len(seen))
	}
	if n := len(names(t, dir)); n < 5 {
		t.Errorf("%d files: the writes did not rotate", n)
	}
}

// TestArchiveBoot: each boot moves the boot before's logs (its components' only) into an
// archive of their own, keeps the last few, and Boot finds them by how many boots ago.
func TestArchiveBoot(t *testing.T) {
	dir := t.TempDir()
	components := []string{"liken-init", "liken-agent", "k3s"}
	// Nothing yet: no archive.
	if a, err := ArchiveBoot(dir, components, 3); a != "" || err != nil {
		t.Fatalf("a first boot archived %q, %v", a, err)
	}
	other := filepath.Join(dir, "dpkg.log")
	os.WriteFile(other, []byte("someone else's"), 0o644)
	os.MkdirAll(filepath.Join(dir, "pods"), 0o755)
	for boot := 1; boot <= 5; boot++ {
		for _, c := range components {
			os.WriteFile(filepath.Join(dir, c+".log"), []byte(fmt.Sprintf("%s boot %d\n", c, boot)), 0o640)
		}
		os.WriteFile(filepath.Join(dir, "k3s.log.1"), []byte(fmt.Sprintf("k3s boot %d, rotated\n", boot)), 0o640)
		a, err := ArchiveBoot(dir, components, 3)
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(dir, BootsDir, fmt.Sprint(boot)); a != want {
			t.Errorf("boot %d archived into %s; want %s", boot, a, want)
		}
	}
	if got := names(t, filepath.Join(dir, BootsDir)); !slices.Equal(got, []string{"3", "4", "5"}) {
		t.Errorf("archives kept %v; want the last 3", got)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"dpkg.log", "liken", "pods"}) {
		t.Errorf("left in the log directory: %v; want only what others wrote", got)
	}
	for n, want := range map[int]string{1: "liken-agent boot 5\n", 3: "liken-agent boot 3\n"} {
		b, err := Boot(dir, n)
		if err != nil {
			t.Fatal(err)
		}
		if got := read(t, filepath.Join(b, "liken-agent.log")); got != want {
			t.Errorf("Boot(%d)'s agent log %q; want %q", n, got, want)
		}
	}
	if got := read(t, filepath.Join(dir, BootsDir, "5", "k3s.log.1")); got != "k3s boot 5, rotated\n" {
		t.Errorf("a rotated file was not kept with its boot: %q", got)
	}
	if _, err := Boot(dir, 4); err == nil || !strings.Contains(err.Error(), "3 boots before it are kept") {
		t.Errorf("Boot(4) with 3 kept: %v", err)
	}
	// A boot cut short while it moved files: what it left is archived by the next one.
	os.WriteFile(filepath.Join(dir, "k3s.log"), []byte("k3s of a boot cut short\n"), 0o640)
	a, err := ArchiveBoot(dir, components, 3)
	if err != nil || read(t, filepath.Join(a, "k3s.log")) != "k3s of a boot cut short\n" {
		t.Errorf("the leftover of a cut boot: %s %v", a, err)
	}
}

func TestFiles(t *testing.T) {
	entries := []string{"k3s.log.2", "liken-agent.log", "k3s.log", "k3s.log.10", "k3s.log.1", "k3s.log.x", "k3s.logs", "pods/", "k3s.log.0"}
	if got, want := Files("k3s", entries), []string{"k3s.log.10", "k3s.log.2", "k3s.log.1", "k3s.log"}; !slices.Equal(got, want) {
		t.Errorf("Files(k3s) = %v; want %v", got, want)
	}
	if got := Files("kernel", entries); len(got) != 0 {
		t.Errorf("Files(kernel) = %v; want none", got)
	}
}
