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
)

// The releases the VM tests build: A is installed, B is the upgrade.
const (
	releaseA = "2026.11.29-001"
	releaseB = "2026.11.29-002"
)

// channelServer publishes releases into a channel directory and serves it over real HTTP
// on the host, where the guest reaches it at 10.0.2.2. It counts slot image requests per
// version and can slow them down, as a slow network would.
type channelServer struct {
	dir      string
	guestURL string
	pins     map[string]string

	mu   sync.Mutex
	gets map[string]int
	// rate limits slot image bytes per second; 0 serves at full speed.
	rate atomic.Int64
}

func newChannelServer(t *testing.T, versions ...string) *channelServer {
	t.Helper()
	c := &channelServer{dir: filepath.Join(t.TempDir(), "channel"), pins: map[string]string{}, gets: map[string]int{}}
	for _, v := range versions {
		rel, err := BuildRelease(v)
		if err != nil {
			t.Fatal(err)
		}
		if c.pins[v], err = release.Publish(c.dir, rel.Dir); err != nil {
			t.Fatal(err)
		}
	}
	files := http.FileServer(http.Dir(c.dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, isSlot := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/"), "/slot.img")
		if isSlot {
			c.mu.Lock()
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
