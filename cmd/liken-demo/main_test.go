package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
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
