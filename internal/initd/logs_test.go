package initd

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"liken.dev/liken/internal/logfile"
	"liken.dev/liken/internal/syncbuf"
)

func TestKmsgLine(t *testing.T) {
	for _, tt := range []struct {
		rec, want string
		ok        bool
	}{
		{"6,339,5140900,-;NET: Registered protocol family 10\n", "[    5.140900] NET: Registered protocol family 10\n", true},
		{"4,1200,123456789012,c,caller=T1;virtio_net virtio0 eth0: renamed\n SUBSYSTEM=net\n DEVICE=n2\n", "[123456.789012] virtio_net virtio0 eth0: renamed\n", true},
		{"6,1,0,-;\n", "[    0.000000] \n", true},
		{"no header", "", false},
		{"6,1;short header\n", "", false},
		{"6,1,x,-;bad time\n", "", false},
	} {
		got, ok := kmsgLine([]byte(tt.rec))
		if ok != tt.ok || string(got) != tt.want {
			t.Errorf("kmsgLine(%q) = %q, %v; want %q, %v", tt.rec, got, ok, tt.want, tt.ok)
		}
	}
}

func openSink(t *testing.T, console io.Writer) (*logSink, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.log")
	w, err := logfile.Open(path, 1<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	return &logSink{console: console, w: w}, path
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestInitLogHoldsEarlyLines: init's lines before the state partition is mounted reach its
// file first once it opens; every line reaches the console; a line after the file closed
// (the shutdown's last) reaches the console only.
func TestInitLogHoldsEarlyLines(t *testing.T) {
	var console syncbuf.Buffer
	at := time.Date(2026, 12, 6, 20, 52, 15, 123456789, time.UTC)
	l := &initLog{console: &console, now: func() time.Time { return at }}
	io.WriteString(l, "liken-init: system stage\n")
	io.WriteString(l, "liken-init: mounting\n")
	sink, path := openSink(t, &console)
	l.attach(sink)
	io.WriteString(l, "liken-init: logs open\n")
	sink.close()
	io.WriteString(l, "liken-init: shutdown clean\n")
	stamp := "2026-12-06T20:52:15.123Z "
	if got, want := readFile(t, path), stamp+"liken-init: system stage\n"+stamp+"liken-init: mounting\n"+stamp+"liken-init: logs open\n"; got != want {
		t.Errorf("init's log file holds %q; want %q", got, want)
	}
	if got := console.String(); strings.Count(got, "\n") != 4 || !strings.HasSuffix(got, "shutdown clean\n") || strings.Contains(got, stamp) {
		t.Errorf("the console has %q; want all four lines", got)
	}
}

// TestCopyLinesWholeLines: two processes' output copied to one console at once never
// interleaves within a line, and each file gets its own process's lines; a line longer than
// the copy's buffer arrives whole in the file, in pieces.
func TestCopyLinesWholeLines(t *testing.T) {
	var console syncbuf.Buffer
	long := strings.Repeat("x", 200<<10) + "\n"
	var wg sync.WaitGroup
	paths := map[string]string{}
	for _, name := range []string{"a", "b"} {
		sink, path := openSink(t, &console)
		paths[name] = path
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { copyLines(r, &console, sink); close(done) }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				io.WriteString(w, name+" line "+strings.Repeat(name, 100)+"\n")
			}
			if name == "a" {
				io.WriteString(w, long)
			}
			w.Close()
			<-done
		}()
	}
	wg.Wait()
	for _, line := range strings.SplitAfter(console.String(), "\n") {
		if line == "" || line == long || strings.HasPrefix(line, strings.Repeat("x", 10)) {
			continue
		}
		if line != "a line "+strings.Repeat("a", 100)+"\n" && line != "b line "+strings.Repeat("b", 100)+"\n" {
			t.Fatalf("a line on the console mixes the processes' output: %.120q", line)
		}
	}
	a := readFile(t, paths["a"])
	if strings.Count(a, "a line ") != 500 || strings.Contains(a, "b line") || !strings.HasSuffix(a, long) {
		t.Errorf("a's file: %d of its lines, b's lines %v, the long line at the end %v", strings.Count(a, "a line "), strings.Contains(a, "b line"), strings.HasSuffix(a, long))
	}
	if b := readFile(t, paths["b"]); strings.Count(b, "b line ") != 500 || strings.Contains(b, "a line") {
		t.Errorf("b's file: %d of its lines, a's lines %v", strings.Count(b, "b line "), strings.Contains(b, "a line"))
	}
}

// TestLogSinkFailsOnce: a file that cannot be written is said on the console once, and the
// writes after it are dropped rather than failing the process whose output it is.
func TestLogSinkFailsOnce(t *testing.T) {
	var console bytes.Buffer
	sink, _ := openSink(t, &console)
	sink.w.Close() // as a failed disk would: every write fails
	sink.write([]byte("one\n"))
	sink.write([]byte("two\n"))
	if got := console.String(); strings.Count(got, "liken-init: writing") != 1 || !strings.Contains(got, "the console still has every line") {
		t.Errorf("the console says %q; want the failure once", got)
	}
}

func TestStampLines(t *testing.T) {
	at := time.Date(2026, 12, 6, 1, 2, 3, 0, time.FixedZone("x", 3600))
	for in, want := range map[string]string{
		"one\n":      "2026-12-06T00:02:03.000Z one\n",
		"one\ntwo\n": "2026-12-06T00:02:03.000Z one\n2026-12-06T00:02:03.000Z two\n",
		"no newline": "2026-12-06T00:02:03.000Z no newline",
		"":           "",
	} {
		if got := string(stampLines([]byte(in), at)); got != want {
			t.Errorf("stampLines(%q) = %q; want %q", in, got, want)
		}
	}
}
