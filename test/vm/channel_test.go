package vm

import (
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/tuf"
)

// The releases the VM tests build: A is installed, B is the upgrade.
const (
	releaseA = "2026.11.29-001"
	releaseB = "2026.11.29-002"
)

// channelServer publishes releases into a signed channel directory and serves it over real
// HTTP on the host, where the guest reaches it at 10.0.2.2. It counts slot image requests
// per version and can slow them down, as a slow network would. The channel is signed as
// `liken release keys init` and `publish` sign one (issue 31): the Clusters the tests join
// name its root, so every release a machine writes here is checked against its signatures
// first.
type channelServer struct {
	dir      string
	guestURL string
	pins     map[string]string
	// root is the digest of the channel's first root (the Cluster's spec.channelRoot).
	root string

	mu   sync.Mutex
	gets map[string]int
	// timestampsBefore is, for each version, how many times timestamp.json was fetched
	// before its slot image was first requested: the machine's signature check comes first.
	timestamps       int
	timestampsBefore map[string]int
	// rate limits slot image bytes per second; 0 serves at full speed.
	rate atomic.Int64
}

func newChannelServer(t *testing.T, versions ...string) *channelServer {
	t.Helper()
	c := &channelServer{dir: filepath.Join(t.TempDir(), "channel"), pins: map[string]string{}, gets: map[string]int{}, timestampsBefore: map[string]int{}}
	repo := &tuf.Repo{Channel: c.dir, Expiry: tuf.DefaultExpiry}
	keyDir := filepath.Join(t.TempDir(), "keys")
	var err error
	if c.root, err = repo.Init(tuf.InitOptions{KeyDir: keyDir}); err != nil {
		t.Fatal(err)
	}
	keys, err := tuf.LoadKeys(keyDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions {
		rel, err := BuildRelease(v)
		if err != nil {
			t.Fatal(err)
		}
		if c.pins[v], err = release.Publish(c.dir, rel.Dir); err != nil {
			t.Fatal(err)
		}
		if err := repo.SignRelease(keys, rel.Dir); err != nil {
			t.Fatal(err)
		}
	}
	files := http.FileServer(http.Dir(c.dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, isSlot := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/slot.img")
		if r.URL.Path == "/"+tuf.MetadataDir+"/timestamp.json" {
			c.mu.Lock()
			c.timestamps++
			c.mu.Unlock()
		}
		if isSlot {
			c.mu.Lock()
			if c.gets[v] == 0 {
				c.timestampsBefore[v] = c.timestamps
			}
			c.gets[v]++
			c.mu.Unlock()
			if rate := c.rate.Load(); rate > 0 {
				w = &slowWriter{ResponseWriter: w, rate: rate}
			}
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	c.guestURL = "http://10.0.2.2:" + port + "/"
	return c
}

// checkedBefore is how many times the channel's timestamp was fetched before the slot image
// of version was first requested.
func (c *channelServer) checkedBefore(version string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timestampsBefore[version]
}

// slotGets is how many times the slot image of version was requested.
func (c *channelServer) slotGets(version string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets[version]
}

type slowWriter struct {
	http.ResponseWriter
	rate int64
}

func (w *slowWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), 64<<10)
		m, err := w.ResponseWriter.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
		time.Sleep(time.Duration(int64(k) * int64(time.Second) / w.rate))
	}
	return n, nil
}
