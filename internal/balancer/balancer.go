// Package balancer is a TCP load balancer with health checks: it proxies each connection to
// the server it used last while that one is healthy, else the next healthy one, with a
// default server as the last resort; it dials every server each interval, and a server
// found down is marked failed and every connection through it closed, so that clients
// reconnect through another at once rather than waiting for TCP to give up. The k3s
// stand-in's agent load balancer is one (as k3s's agent has), and so is the API endpoint of
// a lab with several servers (as k3s's docs ask of a fixed registration address).
package balancer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// Balancer proxies connections on Listen to its servers (host:port each).
type Balancer struct {
	Listen string
	// Default is the last resort, tried when no server is known or every one failed.
	Default    string
	CheckEvery time.Duration // default 1 s
	// Name starts its log lines ("agent load balancer").
	Name string
	Log  io.Writer
	// Changed is called with the servers whenever SetServers changes them.
	Changed func(servers []string)
	// Check says whether a server answers; nil, a TCP connection to it. A port forwarded
	// by something that accepts for a server that is down (QEMU's user network does) needs
	// a check that reaches the server itself.
	Check func(ctx context.Context, server string) error

	mu      sync.Mutex
	servers []string
	failed  map[string]bool       // by address: the last check or dial failed
	active  string                // the server the last connection went to
	conns   map[string][]net.Conn // open upstream connections, by server
	said    map[string]bool       // a failure said once, until the server is back
}

func (b *Balancer) init() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failed == nil {
		b.failed, b.conns, b.said = map[string]bool{}, map[string][]net.Conn{}, map[string]bool{}
	}
	if b.CheckEvery == 0 {
		b.CheckEvery = time.Second
	}
	if b.Log == nil {
		b.Log = io.Discard
	}
}

// Serve listens and proxies until ctx ends; it returns once listening (or failing to).
func (b *Balancer) Serve(ctx context.Context) error {
	b.init()
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", b.Listen)
	if err != nil {
		return fmt.Errorf("the %s on %s: %w", b.Name, b.Listen, err)
	}
	go func() { <-ctx.Done(); l.Close() }()
	go b.checkLoop(ctx)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go b.proxy(ctx, c)
		}
	}()
	return nil
}

// Servers are the servers known, in the order given.
func (b *Balancer) Servers() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.servers)
}

// SetServers takes the servers' addresses (host:port).
func (b *Balancer) SetServers(servers []string) {
	b.init()
	b.mu.Lock()
	changed := !slices.Equal(b.servers, servers)
	b.servers = slices.Clone(servers)
	b.mu.Unlock()
	if changed {
		fmt.Fprintf(b.Log, "%s: servers %v\n", b.Name, servers)
		if b.Changed != nil {
			b.Changed(slices.Clone(servers))
		}
	}
}

// order is the servers to try: the active one, the other healthy ones, the failed ones, and
// the default server last when it is not among them.
func (b *Balancer) order() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var healthy, failed []string
	for _, s := range b.servers {
		if b.failed[s] {
			failed = append(failed, s)
		} else if s == b.active {
			healthy = append([]string{s}, healthy...)
		} else {
			healthy = append(healthy, s)
		}
	}
	out := append(healthy, failed...)
	if b.Default != "" && !slices.Contains(out, b.Default) {
		out = append(out, b.Default)
	}
	return out
}

func (b *Balancer) proxy(ctx context.Context, c net.Conn) {
	defer c.Close()
	var up net.Conn
	var server string
	var errs []error
	for _, s := range b.order() {
		d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second} // k3s's dialer
		u, err := d.DialContext(ctx, "tcp", s)
		if err != nil {
			b.markFailed(s, err)
			errs = append(errs, err)
			continue
		}
		up, server = u, s
		break
	}
	if up == nil {
		fmt.Fprintf(b.Log, "%s: all servers failed: %v\n", b.Name, errors.Join(errs...))
		return
	}
	b.track(server, up)
	defer b.untrack(server, up)
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() { io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
	up.Close()
}

func closeWrite(c net.Conn) {
	if t, ok := c.(*net.TCPConn); ok {
		t.CloseWrite()
	}
}

func (b *Balancer) track(server string, c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conns[server] = append(b.conns[server], c)
	if b.active != server {
		b.active = server
		fmt.Fprintf(b.Log, "%s: connecting through %s\n", b.Name, server)
	}
}

func (b *Balancer) untrack(server string, c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conns[server] = slices.DeleteFunc(b.conns[server], func(x net.Conn) bool { return x == c })
}

// markFailed marks a server failed and closes every connection through it (k3s closes a
// failed server's connections to force the clients over to another).
func (b *Balancer) markFailed(server string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failed[server] = true
	for _, c := range b.conns[server] {
		c.Close()
	}
	delete(b.conns, server)
	if !b.said[server] {
		b.said[server] = true
		fmt.Fprintf(b.Log, "%s: server %s failed (%v); its connections closed\n", b.Name, server, err)
	}
}

func (b *Balancer) check(ctx context.Context, server string) error {
	ctx, cancel := context.WithTimeout(ctx, max(b.CheckEvery, 5*time.Second))
	defer cancel()
	if b.Check != nil {
		return b.Check(ctx, server)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", server)
	if err == nil {
		c.Close()
	}
	return err
}

// TLSCheck is a Check that completes a TLS handshake with the server (any certificate):
// proof that the server itself answers, not only whatever forwards its port.
func TLSCheck(ctx context.Context, server string) error {
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a liveness probe: nothing is sent
	c, err := d.DialContext(ctx, "tcp", server)
	if err == nil {
		c.Close()
	}
	return err
}

// checkLoop dials every known server each CheckEvery and marks it failed or healthy.
func (b *Balancer) checkLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(b.CheckEvery):
		}
		servers := b.order()
		var wg sync.WaitGroup
		for _, s := range servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := b.check(ctx, s); err != nil {
					b.markFailed(s, err)
					return
				}
				b.mu.Lock()
				if b.failed[s] {
					delete(b.failed, s)
					delete(b.said, s)
					fmt.Fprintf(b.Log, "%s: server %s healthy again\n", b.Name, s)
				}
				b.mu.Unlock()
			}()
		}
		wg.Wait()
	}
}
