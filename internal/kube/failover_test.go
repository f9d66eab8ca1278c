package kube

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"liken.dev/liken/internal/pki"
)

// TestFailover: a client whose URL names one server reaches the first of its addresses that
// answers, each server checked against the name every API server's certificate carries:
// the first while it is up, the second once it is down.
func TestFailover(t *testing.T) {
	ca, err := pki.NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	server := func(name string) *httptest.Server {
		// Each server's certificate names kubernetes and its own address only, as a k3s
		// server's names its own addresses and not the others'.
		p, err := ca.ServingCert(name, []string{APIServerName}, []net.IP{net.ParseIP("127.0.0.1")}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(name)) }))
		s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		s.StartTLS()
		t.Cleanup(s.Close)
		return s
	}
	a, b := server("a"), server("b")
	cfg := &rest.Config{Host: "https://192.0.2.1:6443", TLSClientConfig: rest.TLSClientConfig{CAData: ca.CertPEM()}, Timeout: 5 * time.Second}
	Failover(cfg, []string{a.Listener.Addr().String(), b.Listener.Addr().String()})
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	get := func() string {
		t.Helper()
		resp, err := client.Get(cfg.Host + "/version")
		if err != nil {
			t.Fatalf("through the failover: %v", err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 8)
		n, _ := resp.Body.Read(buf)
		return string(buf[:n])
	}
	if got := get(); got != "a" {
		t.Errorf("with both up the answer came from %q; want a, the first", got)
	}
	a.Close()
	client.CloseIdleConnections()
	if got := get(); got != "b" {
		t.Errorf("with the first down the answer came from %q; want b", got)
	}
	b.Close()
	client.CloseIdleConnections()
	if _, err := client.Get(cfg.Host + "/version"); err == nil {
		t.Error("with every server down a request was answered")
	}
}
