package release

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/test/report"
)

const version = "2026.07.20-001"

// testRelease writes a channel with one release of two files and returns its directory and
// the release's pin.
func testRelease(t *testing.T, mutate func(d *apirelease.Document, files map[string][]byte)) (string, string) {
	t.Helper()
	files := map[string][]byte{
		"vmlinuz":         bytes.Repeat([]byte("kernel-"), 50_000),
		"rootfs.squashfs": bytes.Repeat([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 300_000),
	}
	d := &apirelease.Document{Schema: apirelease.Schema, Version: version, Created: time.Unix(1785000000, 0).UTC()}
	for _, n := range []string{"rootfs.squashfs", "vmlinuz"} {
		sum := sha256.Sum256(files[n])
		role := apirelease.RoleRootfs
		if n == "vmlinuz" {
			role = apirelease.RoleKernel
		}
		d.Files = append(d.Files, apirelease.File{Name: n, Size: int64(len(files[n])), SHA256: hex.EncodeToString(sum[:]), Role: role})
	}
	if mutate != nil {
		mutate(d, files)
	}
	dir := t.TempDir()
	rel := filepath.Join(dir, version)
	os.MkdirAll(rel, 0o755)
	// Encoded without validation: the refusals below need invalid documents served.
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(rel, apirelease.DocumentName), b, 0o644)
	for n, c := range files {
		os.WriteFile(filepath.Join(rel, n), c, 0o644)
	}
	return dir, apirelease.Digest(b)
}

// fault makes the test server misbehave for one path.
type fault struct {
	status     int    // answer with this status
	failTimes  int32  // only for the first N requests
	cutAfter   int    // close the connection after this many body bytes (first request only)
	stallAfter int    // stop sending after this many bytes (first request only)
	redirect   bool   // redirect to itself forever
	redirectTo string // redirect to this URL
	silent     bool   // never answer
	trickle    bool   // send one byte every 50ms, for ever
}

type server struct {
	*httptest.Server
	mu       sync.Mutex
	faults   map[string]*fault
	requests map[string]*atomic.Int32
	ranges   atomic.Int32
}

func newServer(t *testing.T, dir string) *server {
	s := &server{faults: map[string]*fault{}, requests: map[string]*atomic.Int32{}}
	files := http.FileServer(http.Dir(dir))
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		f := s.faults[r.URL.Path]
		c := s.requests[r.URL.Path]
		if c == nil {
			c = &atomic.Int32{}
			s.requests[r.URL.Path] = c
		}
		s.mu.Unlock()
		n := c.Add(1)
		if r.Header.Get("Range") != "" {
			s.ranges.Add(1)
		}
		if f != nil {
			switch {
			case f.silent:
				<-r.Context().Done()
				return
			case f.trickle:
				w.Header().Set("Content-Length", "100000000")
				w.WriteHeader(http.StatusOK)
				for r.Context().Err() == nil {
					w.Write([]byte{0})
					w.(http.Flusher).Flush()
					time.Sleep(50 * time.Millisecond)
				}
				return
			case f.redirect:
				http.Redirect(w, r, r.URL.Path, http.StatusFound)
				return
			case f.redirectTo != "":
				http.Redirect(w, r, f.redirectTo, http.StatusFound)
				return
			case f.status != 0 && (f.failTimes == 0 || n <= f.failTimes):
				http.Error(w, "injected", f.status)
				return
			case (f.cutAfter > 0 || f.stallAfter > 0) && n == 1:
				b, _ := os.ReadFile(filepath.Join(dir, r.URL.Path))
				w.Header().Set("Content-Length", fmt.Sprint(len(b)))
				w.WriteHeader(http.StatusOK)
				if f.cutAfter > 0 {
					w.Write(b[:f.cutAfter])
					w.(http.Flusher).Flush()
					conn, _, _ := w.(http.Hijacker).Hijack()
					conn.Close()
					return
				}
				w.Write(b[:f.stallAfter])
				w.(http.Flusher).Flush()
				<-r.Context().Done()
				return
			}
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) inject(path string, f *fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults["/"+version+"/"+path] = f
}

func fetcher() *Fetcher {
	return &Fetcher{Retries: 3, Backoff: 10 * time.Millisecond, StallTimeout: 300 * time.Millisecond}
}

func fetchAll(ctx context.Context, f *Fetcher, channel, pin, out string) error {
	_, err := f.Release(ctx, channel, version, pin, func(file apirelease.File) (Target, error) {
		return FileTarget{Path: filepath.Join(out, file.Name)}, nil
	})
	return err
}

func TestFetchGood(t *testing.T) {
	dir, pin := testRelease(t, nil)
	srv := newServer(t, dir)
	tlsSrv := httptest.NewTLSServer(http.FileServer(http.Dir(dir)))
	defer tlsSrv.Close()
	for name, channel := range map[string]string{"http": srv.URL, "https": tlsSrv.URL, "file": "file://" + dir} {
		t.Run(name, func(t *testing.T) {
			out := t.TempDir()
			var reports atomic.Int32
			f := fetcher()
			if name == "https" {
				f.Client = tlsSrv.Client() // trusts the test server's certificate
			}
			f.Progress = func(Progress) { reports.Add(1) }
			if err := fetchAll(t.Context(), f, channel, pin, out); err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{"vmlinuz", "rootfs.squashfs"} {
				got, _ := os.ReadFile(filepath.Join(out, n))
				want, _ := os.ReadFile(filepath.Join(dir, version, n))
				if !bytes.Equal(got, want) {
					t.Errorf("%s differs", n)
				}
			}
			if reports.Load() == 0 {
				t.Error("no progress reported")
			}
			entries, _ := os.ReadDir(out)
			if len(entries) != 2 {
				t.Errorf("target directory holds %d entries, want the 2 files", len(entries))
			}
		})
	}
}

func TestFetchResumesAfterCutAndStall(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault *fault
	}{
		{"connection cut mid-file", &fault{cutAfter: 1_000_000}},
		{"stall mid-file", &fault{stallAfter: 700_000}},
		{"transient 500", &fault{status: 500, failTimes: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, pin := testRelease(t, nil)
			srv := newServer(t, dir)
			srv.inject("rootfs.squashfs", tc.fault)
			out := t.TempDir()
			if err := fetchAll(t.Context(), fetcher(), srv.URL, pin, out); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(filepath.Join(out, "rootfs.squashfs"))
			want, _ := os.ReadFile(filepath.Join(dir, version, "rootfs.squashfs"))
			if !bytes.Equal(got, want) {
				t.Fatal("resumed file differs")
			}
			if tc.fault.status == 0 && srv.ranges.Load() == 0 {
				t.Error("the fetch did not resume with a Range request")
			}
		})
	}
}

func TestFetchRefuses(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*apirelease.Document, map[string][]byte)
		fault   *fault // on rootfs.squashfs
		pin     string // overrides the right pin
		channel string // overrides the server URL
		want    string
		once    bool // refused at the first attempt, not retried
	}{
		{name: "wrong pin", pin: "sha256:" + strings.Repeat("ab", 32), want: "release.json does not match its pin"},
		{name: "no pin", pin: "-", want: "is not pinned"},
		{name: "one byte flipped", mutate: func(d *apirelease.Document, f map[string][]byte) { f["vmlinuz"][1000] ^= 1 },
			want: "vmlinuz does not match its pin: expected sha256:"},
		{name: "truncated file", mutate: func(d *apirelease.Document, f map[string][]byte) {
			f["rootfs.squashfs"] = f["rootfs.squashfs"][:2_000_000]
		}, want: "rootfs.squashfs: the server has only 2000000 of 3000000 bytes (truncated)"},
		{name: "extra bytes", mutate: func(d *apirelease.Document, f map[string][]byte) {
			f["vmlinuz"] = append(f["vmlinuz"], 'x')
		}, want: "more than the 350000 bytes"},
		{name: "size that lies", mutate: func(d *apirelease.Document, f map[string][]byte) { d.Files[1].Size = 10 }, want: "more than the 10 bytes"},
		{name: "missing file", mutate: func(d *apirelease.Document, f map[string][]byte) { delete(f, "vmlinuz") }, want: "404 Not Found"},
		{name: "duplicate file names", mutate: func(d *apirelease.Document, f map[string][]byte) {
			d.Files = append(d.Files, d.Files[0])
		}, want: `release file "rootfs.squashfs" is listed twice`},
		{name: "parent directory name", mutate: func(d *apirelease.Document, f map[string][]byte) { d.Files[0].Name = "../etc" },
			want: `name "../etc" is not a plain file name`},
		{name: "absolute name", mutate: func(d *apirelease.Document, f map[string][]byte) { d.Files[0].Name = "/etc/passwd" },
			want: `name "/etc/passwd" is not a plain file name`},
		{name: "look-alike name", mutate: func(d *apirelease.Document, f map[string][]byte) { d.Files[0].Name = "rootfs.squ\u0430shfs" },
			want: `name "rootfs.squ\u0430shfs" is not a plain file name`},
		{name: "unknown schema", mutate: func(d *apirelease.Document, f map[string][]byte) { d.Schema = "liken.dev/release/v9" },
			want: `schema "liken.dev/release/v9"`},
		{name: "server 500", fault: &fault{status: 500}, want: "giving up after 4 attempts"},
		{name: "server never answers", fault: &fault{silent: true}, want: "giving up after 4 attempts"},
		{name: "redirect loop", fault: &fault{redirect: true}, want: "stopped after 10 redirects"},
		{name: "redirect to ftp", fault: &fault{redirectTo: "ftp://example.com/rootfs.squashfs"}, want: "unsupported protocol scheme", once: true},
		{name: "redirect to a local file", fault: &fault{redirectTo: "file:///etc/passwd"}, want: "unsupported protocol scheme", once: true},
		{name: "not a channel URL", channel: "ftp://example.com", want: "only http://, https:// and file:// channels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, pin := testRelease(t, tt.mutate)
			srv := newServer(t, dir)
			if tt.fault != nil {
				srv.inject("rootfs.squashfs", tt.fault)
			}
			switch tt.pin {
			case "":
			case "-":
				pin = ""
			default:
				pin = tt.pin
			}
			channel := srv.URL
			if tt.channel != "" {
				channel = tt.channel
			}
			out := t.TempDir()
			f := fetcher()
			retries := 0
			f.Retrying = func(Retry) { retries++ }
			err := fetchAll(t.Context(), f, channel, pin, out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.want)
			}
			if tt.once && retries > 0 {
				t.Errorf("retried %d times a failure no retry can change", retries)
			}
			// Nothing of a refused file is left: no partial, no file.
			entries, _ := os.ReadDir(out)
			for _, e := range entries {
				if strings.Contains(e.Name(), "partial") {
					t.Errorf("partial file left behind: %s", e.Name())
				}
			}
		})
	}
}

func TestMalformedDocument(t *testing.T) {
	for name, doc := range map[string]string{
		"not JSON":      "{",
		"bad image":     `{"schema":"liken.dev/release/v1","version":"2026.07.20-001","created":"2026-07-20T00:00:00Z","components":{"kernel":{},"k3s":{},"liken":{},"images":[{"name":"pause","digest":"sha256:12","archive":"/p.tar"}]},"files":[{"name":"a","size":1,"sha256":"` + strings.Repeat("0", 64) + `","role":"other"}]}`,
		"no files":      `{"schema":"liken.dev/release/v1","version":"2026.07.20-001","created":"2026-07-20T00:00:00Z","components":{"kernel":{},"k3s":{},"liken":{}},"files":[]}`,
		"trailing data": `{"schema":"liken.dev/release/v1"} {}`,
		"bad version":   `{"schema":"liken.dev/release/v1","version":"latest","created":"2026-07-20T00:00:00Z","components":{"kernel":{},"k3s":{},"liken":{}},"files":[{"name":"a","size":1,"sha256":"` + strings.Repeat("0", 64) + `","role":"other"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := apirelease.Parse([]byte(doc), apirelease.Digest([]byte(doc))); err == nil {
				t.Errorf("accepted: %s", doc)
			}
		})
	}
}

// TestDocumentFromANewerLiken: fields this liken does not know, which a newer liken writes,
// are ignored: a machine must read the document of the release it upgrades to.
func TestDocumentFromANewerLiken(t *testing.T) {
	doc := `{"schema":"liken.dev/release/v1","version":"2026.07.20-001","created":"2026-07-20T00:00:00Z","signatures":[],` +
		`"components":{"kernel":{},"k3s":{"future":true},"liken":{}},"files":[{"name":"a","size":1,"sha256":"` + strings.Repeat("0", 64) + `","role":"other","mode":"0644"}]}`
	d, err := apirelease.Parse([]byte(doc), apirelease.Digest([]byte(doc)))
	if err != nil {
		t.Fatalf("a document with fields of a newer liken was refused: %v", err)
	}
	if d.Version != "2026.07.20-001" || len(d.Files) != 1 || d.Files[0].Name != "a" {
		t.Errorf("decoded %+v", d)
	}
}

func TestPartitionTargetRefusesDeviceInUse(t *testing.T) {
	// A regular file stands for a free device; a mounted loop device for one in use.
	img := filepath.Join(t.TempDir(), "slot.img")
	os.WriteFile(img, make([]byte, 4<<20), 0o644)
	s, err := PartitionTarget{Path: img, Size: 4 << 20}.Begin()
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte("partial"))
	if err := s.Discard(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(img)
	if !bytes.Equal(b[:7], make([]byte, 7)) {
		t.Errorf("a discarded device write was not invalidated")
	}
	if err := mountedLoopRefused(t, img); err != nil {
		t.Fatal(err)
	}
}

// TestFileChannelRefusesWhatIsNotAFile: a FIFO (or a directory) where a file:// channel has
// a release's document or file is refused at once, never read: a FIFO would block for ever.
func TestFileChannelRefusesWhatIsNotAFile(t *testing.T) {
	for _, what := range []string{"document", "file"} {
		t.Run(what, func(t *testing.T) {
			dir, pin := testRelease(t, nil)
			p := filepath.Join(dir, version, "vmlinuz")
			if what == "document" {
				p = filepath.Join(dir, version, apirelease.DocumentName)
			}
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- fetchAll(t.Context(), fetcher(), "file://"+dir, pin, t.TempDir()) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "is not a regular file") {
					t.Errorf("error = %v; want the FIFO refused as not a regular file", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("reading a FIFO in a file:// channel hangs")
			}
		})
	}
}

// TestGivingUpSaysWhy: a server that trickles a byte now and then is given up for its rate,
// one that sends nothing for its silence, and the error says which, never "context
// canceled"; the time to give up is bounded by the configured limits.
func TestGivingUpSaysWhy(t *testing.T) {
	var figures []string
	defer func() {
		if !t.Failed() {
			report.Line("download attempt given up (stall 300ms, minimum rate 1000 B/s over 500ms): %s", strings.Join(figures, ", "))
		}
	}()
	for _, tc := range []struct {
		name  string
		fault *fault
		want  string
	}{
		{"trickling", &fault{trickle: true}, "the server is too slow"},
		{"silent", &fault{silent: true}, "the server sent nothing for 300ms"},
		{"stalled", &fault{stallAfter: 1000}, "the server sent nothing for 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, pin := testRelease(t, nil)
			srv := newServer(t, dir)
			srv.inject("vmlinuz", tc.fault)
			f := fetcher()
			f.Retries, f.MinRate, f.RateWindow = 1, 1000, 500*time.Millisecond
			var first error
			var took time.Duration
			start := time.Now()
			f.Retrying = func(r Retry) {
				if first == nil {
					first, took = r.Err, time.Since(start)
				}
			}
			fetchAll(t.Context(), f, srv.URL, pin, t.TempDir())
			if first == nil || !strings.Contains(first.Error(), tc.want) || strings.Contains(first.Error(), "context canceled") {
				t.Fatalf("the first attempt failed with %v; want it to say %q", first, tc.want)
			}
			t.Logf("first attempt given up after %s: %v", took.Round(time.Millisecond), first)
			figures = append(figures, fmt.Sprintf("%s server after %s", tc.name, took.Round(10*time.Millisecond)))
		})
	}
}

// TestOverallDeadline: a server fast enough never to fall under the minimum rate still
// cannot hold a download for ever: the file's overall deadline ends it, attempts and
// pauses included, and the error says so.
func TestOverallDeadline(t *testing.T) {
	dir, pin := testRelease(t, nil)
	srv := newServer(t, dir)
	srv.inject("vmlinuz", &fault{trickle: true}) // 20 bytes a second, for ever
	f := fetcher()
	f.Retries, f.MinRate, f.RateWindow, f.Deadline = 3, 5, 200*time.Millisecond, time.Second
	start := time.Now()
	err := fetchAll(t.Context(), f, srv.URL, pin, t.TempDir())
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "gave up after 1s, the overall deadline") || strings.Contains(err.Error(), "context deadline exceeded") {
		t.Fatalf("err = %v; want it to name the overall deadline", err)
	}
	if took > 5*time.Second {
		t.Errorf("gave up after %s; the deadline is 1s", took)
	}
	t.Logf("given up after %s: %v", took.Round(time.Millisecond), err)
}

// TestDefaultDeadline: without one set, the deadline follows the size at the minimum rate
// and leaves every retry its time.
func TestDefaultDeadline(t *testing.T) {
	f := &Fetcher{}
	f.defaults() // 16 KiB/s over 30 s, a 30 s stall timeout, 5 retries from 500 ms
	for _, tc := range []struct {
		size int64
		want time.Duration
	}{
		// a minute + 2 × size/MinRate + 6 attempts × 30 s + 15.5 s of pauses
		{0, time.Minute + 180*time.Second + 15500*time.Millisecond},
		{1 << 20, time.Minute + 128*time.Second + 180*time.Second + 15500*time.Millisecond},
		{47185920, time.Minute + 5760*time.Second + 180*time.Second + 15500*time.Millisecond},
	} {
		if got := f.deadlineFor(tc.size); got != tc.want {
			t.Errorf("deadline for %d bytes = %s; want %s", tc.size, got, tc.want)
		}
	}
	f.Deadline = time.Second
	if got := f.deadlineFor(1 << 30); got != time.Second {
		t.Errorf("a set Deadline is not used: %s", got)
	}
}

// TestDeadlineDuringAPause: the deadline passing between attempts is said as the deadline,
// with the last attempt's failure, not as a bare context error.
func TestDeadlineDuringAPause(t *testing.T) {
	dir, pin := testRelease(t, nil)
	srv := newServer(t, dir)
	srv.inject("vmlinuz", &fault{status: http.StatusServiceUnavailable})
	f := fetcher()
	f.Retries, f.Backoff, f.Deadline = 3, 2*time.Second, time.Second
	err := fetchAll(t.Context(), f, srv.URL, pin, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "gave up after 1s, the overall deadline") || !strings.Contains(err.Error(), "503") || strings.Contains(err.Error(), "context deadline exceeded") {
		t.Fatalf("err = %v; want the deadline named with the last failure (503)", err)
	}
}

// TestFetchTrustsTheChannelCA: a channel served over https with a CA the system does not
// know is refused as such, and fetched once its CA is trusted (a Cluster's channelCA, as
// TrustPool reads it); what is not PEM certificates is refused, saying so.
func TestFetchTrustsTheChannelCA(t *testing.T) {
	dir, pin := testRelease(t, nil)
	srv := httptest.NewTLSServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))

	f := fetcher()
	var retries atomic.Int32
	f.Retrying = func(Retry) { retries.Add(1) }
	err := fetchAll(t.Context(), f, srv.URL, pin, t.TempDir())
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("a channel whose CA is not trusted: %v; want x509's unknown authority", err)
	}
	if n := retries.Load(); n != 0 {
		t.Errorf("a certificate no CA vouches for was tried %d more times", n)
	}
	pool, err := TrustPool(ca)
	if err != nil {
		t.Fatal(err)
	}
	f = fetcher()
	f.RootCAs = pool
	if err := fetchAll(t.Context(), f, srv.URL, pin, t.TempDir()); err != nil {
		t.Fatalf("with the channel's CA trusted: %v", err)
	}

	key := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("x")}))
	for name, bad := range map[string]string{
		"empty":      "",
		"not PEM":    "hello",
		"a key":      ca + key,
		"bad cert":   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})),
		"text after": ca + "trailing words",
	} {
		if _, err := TrustPool(bad); err == nil {
			t.Errorf("%s: TrustPool took it", name)
		}
	}
}
