package balancer

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"liken.dev/liken/internal/syncbuf"
)

// backend is a server that says its name to every connection and keeps it open, as a
// server's API port does; stop closes the port but not the connections (a machine that lost
// its power sends no reset).
type backend struct {
	name string
	addr string
	l    net.Listener
	mu   sync.Mutex
	held []net.Conn
}

func newBackend(t *testing.T, name, addr string) *backend {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, addr: l.Addr().String(), l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.held = append(b.held, c)
			b.mu.Unlock()
			c.Write([]byte(name + "\n"))
		}
	}()
	t.Cleanup(b.close)
	return b
}

func (b *backend) stop() { b.l.Close() }

func (b *backend) close() {
	b.l.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.held {
		c.Close()
	}
}

// TestBalancerFailsOver: the balancer connects through its default server until it has
// servers; when the server in use goes down its connections are closed (the client sees
// them end within the checks' interval, not TCP's timeout) and new ones go to a healthy
// server, which stays in use when the first comes back; the default server is the last
// resort.
func TestBalancerFailsOver(t *testing.T) {
	a, b := newBackend(t, "A", ""), newBackend(t, "B", "")
	var log syncbuf.Buffer
	lb := &Balancer{Listen: "127.0.0.1:" + strconv.Itoa(freeTCPPort(t)), Default: a.addr, CheckEvery: 100 * time.Millisecond, Name: "test", Log: &log}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := lb.Serve(ctx); err != nil {
		t.Fatal(err)
	}
	dial := func() (string, net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", lb.Listen)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		name, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("reading through the load balancer: %v\n%s", err, log.String())
		}
		return strings.TrimSpace(name), c
	}
	if name, c := dial(); name != "A" {
		t.Errorf("before any servers are known the connection went to %s; want A, the default", name)
	} else {
		c.Close()
	}
	lb.SetServers([]string{a.addr, b.addr})
	name, held := dial()
	if name != "A" {
		t.Errorf("the connection went to %s; want A, the server in use", name)
	}
	// A goes down: the connection through it ends within the checks, new ones go to B.
	a.stop()
	start := time.Now()
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("the connection through the failed server: %v; want it closed by the load balancer", err)
	} else {
		t.Logf("the connection through the failed server closed %s after it went down", time.Since(start).Round(time.Millisecond))
	}
	if name, c := dial(); name != "B" {
		t.Errorf("with A down the connection went to %s; want B", name)
	} else {
		c.Close()
	}
	// A back: B stays in use.
	a2 := newBackend(t, "A", a.addr)
	for deadline := time.Now().Add(5 * time.Second); strings.Count(log.String(), "healthy again") == 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if name, c := dial(); name != "B" {
		t.Errorf("with A back the connection went to %s; want B, the server in use", name)
	} else {
		c.Close()
	}
	// B down and the Endpoints naming B alone: the default server, A, is the last resort.
	lb.SetServers([]string{b.addr})
	b.close()
	if name, c := dial(); name != "A" {
		t.Errorf("with B down the connection went to %s; want A, the default server", name)
	} else {
		c.Close()
	}
	a2.close()
	if !strings.Contains(log.String(), "failed") {
		t.Errorf("the load balancer did not say a server failed:\n%s", log.String())
	}
}

func freeTCPPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestTLSCheck: a port that accepts and closes, as QEMU's user network does for a machine
// whose server is down, fails the check; a TLS server passes it.
func TestTLSCheck(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := TLSCheck(t.Context(), l.Addr().String()); err == nil {
		t.Error("a port that accepts and closes passed the check")
	}
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	if err := TLSCheck(t.Context(), srv.Listener.Addr().String()); err != nil {
		t.Errorf("a TLS server failed the check: %v", err)
	}
}
