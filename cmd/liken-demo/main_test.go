package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemoAnswers: the demo says which pod and node answered, looks names up, and fetches
// another server's answer.
func TestDemoAnswers(t *testing.T) {
	env := map[string]string{"POD_NAME": "web-1", "NODE_NAME": "lab-agent-1"}
	srv := httptest.NewServer(handler(func(k string) string { return env[k] }))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		path, want string
		code       int
	}{
		{"/", "liken-demo: pod web-1 on node lab-agent-1\n", 200},
		{"/healthz", "ok\n", 200},
		{"/lookup?name=localhost", "127.0.0.1", 200},
		{"/get?url=" + url.QueryEscape(srv.URL+"/"), "pod web-1 on node lab-agent-1", 200},
		{"/get?url=" + url.QueryEscape("http://127.0.0.1:1/"), "connection refused", 502},
		{"/nothing", "404 page not found", 404},
	} {
		if code, body := get(tc.path); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %q, want %d with %q", tc.path, code, body, tc.code, tc.want)
		}
	}
}

// TestDemoFetchesWithItsToken: /get with token=serviceaccount sends the pod's token as a
// bearer token, and with insecure=1 fetches from an HTTPS server whose certificate it
// cannot verify; without insecure=1 it refuses that server.
func TestDemoFetchesWithItsToken(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("pod-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	scraped := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer pod-token" {
			http.Error(w, "Unauthorized: got "+r.Header.Get("Authorization"), http.StatusUnauthorized)
			return
		}
		io.WriteString(w, "liken_agent_status_writes_total 7\n")
	}))
	defer scraped.Close()
	env := map[string]string{"DEMO_TOKEN_FILE": tokenFile}
	srv := httptest.NewServer(handler(func(k string) string { return env[k] }))
	defer srv.Close()
	for _, tc := range []struct {
		query, want string
		code        int
	}{
		{"&token=serviceaccount&insecure=1", "liken_agent_status_writes_total 7", 200},
		{"&insecure=1", "Unauthorized: got \n", 401},
		{"&token=serviceaccount", "certificate", 502},
	} {
		resp, err := http.Get(srv.URL + "/get?url=" + url.QueryEscape(scraped.URL+"/metrics") + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.want) {
			t.Errorf("/get%s: %d %q; want %d with %q", tc.query, resp.StatusCode, b, tc.code, tc.want)
		}
	}
}

// TestDemoServesThroughItsDrain: after SIGTERM (its context's end) the demo answers for its
// drain delay, then closes its listener and returns.
func TestDemoServesThroughItsDrain(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String() + "/"
	ctx, stop := context.WithCancel(t.Context())
	const drain = 2 * time.Second
	var log strings.Builder
	served := make(chan error, 1)
	go func() { served <- serve(ctx, l, handler(func(string) string { return "x" }), drain, &log) }()
	answers := func() bool {
		c := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	if !answers() {
		t.Fatal("the demo does not answer before SIGTERM")
	}
	stopped := time.Now()
	stop()
	for time.Since(stopped) < drain-500*time.Millisecond {
		if !answers() {
			t.Fatalf("the demo stopped answering %s after SIGTERM; its drain is %s", time.Since(stopped), drain)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(drain + 10*time.Second):
		t.Fatal("the demo did not stop after its drain")
	}
	if time.Since(stopped) < drain {
		t.Errorf("the demo stopped %s after SIGTERM, before its drain of %s", time.Since(stopped), drain)
	}
	if answers() {
		t.Error("the demo still answers after it stopped")
	}
	if !strings.Contains(log.String(), "serving 2s more") {
		t.Errorf("the demo did not say it drains: %q", log.String())
	}
}
