package standin

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/test/apiserver"
)

// testEtcd is a real etcd, one member named srv-1, on dataDir.
type testEtcd struct {
	url, peer string
	cmd       *exec.Cmd
}

func startEtcd(t *testing.T, dataDir, peer string) *testEtcd {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d", apiserver.FreePort())
	e := &testEtcd{url: url, peer: peer}
	e.cmd = exec.Command(filepath.Join(apiserver.ToolsDir(), "etcd"), "--name=srv-1", "--data-dir="+dataDir,
		"--listen-client-urls="+url, "--advertise-client-urls="+url, "--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=srv-1="+peer, "--listen-metrics-urls=", "--log-level=warn")
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.stop)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if _, err := e.get("/health-probe"); err == nil {
			return e
		} else if time.Now().After(deadline) {
			t.Fatalf("etcd did not answer: %v", err)
		}
	}
}

func (e *testEtcd) stop() {
	if e.cmd.Process != nil && e.cmd.ProcessState == nil {
		e.cmd.Process.Kill()
		e.cmd.Wait()
	}
}

func (e *testEtcd) call(op string, body map[string]string) (*http.Response, error) {
	enc := map[string]string{}
	for k, v := range body {
		enc[k] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	b, _ := json.Marshal(enc)
	return http.Post(e.url+"/v3/kv/"+op, "application/json", strings.NewReader(string(b)))
}

func (e *testEtcd) put(t *testing.T, key string) {
	t.Helper()
	resp, err := e.call("put", map[string]string{"key": key, "value": "x"})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("put %s: %v %v", key, err, resp)
	}
	resp.Body.Close()
}

// get says whether key exists.
func (e *testEtcd) get(key string) (bool, error) {
	resp, err := e.call("range", map[string]string{"key": key})
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("range: %s", resp.Status)
	}
	var r struct {
		Count string `json:"count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return false, err
	}
	return r.Count != "" && r.Count != "0", nil
}

// TestClusterResetRestoresASnapshot: a real etcd's snapshot, restored by a cluster reset as
// k3s's (etcd's own restore, run as etcdutl), holds what was written before the snapshot and
// not what was written after; etcd's data before the reset is kept aside; the reset flag
// refuses a second reset until a normal start; a missing snapshot is refused as k3s says it,
// the data untouched.
func TestClusterResetRestoresASnapshot(t *testing.T) {
	if err := apiserver.EnsureTools(t.Context()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "server", "db", "etcd")
	peer := fmt.Sprintf("http://127.0.0.1:%d", apiserver.FreePort())
	e := startEtcd(t, data, peer)
	e.put(t, "/registry/before-the-snapshot")
	snaps := filepath.Join(dir, "server", "db", "snapshots")
	s, err := SaveSnapshot(t.Context(), SnapshotOptions{EtcdURL: e.url, Dir: snaps, Name: k3s.SnapshotName, Node: "srv-1", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	e.put(t, "/registry/after-the-snapshot")
	e.stop()

	opts := ResetOptions{DataDir: dir, Node: "srv-1", PeerURL: peer, Etcd: filepath.Join(apiserver.ToolsDir(), "etcd"), Now: time.Unix(1796700000, 0)}
	var log strings.Builder
	missing := opts
	missing.RestorePath = filepath.Join(snaps, "no-such-snapshot")
	if err := ClusterReset(t.Context(), missing, &log); err == nil || !strings.Contains(err.Error(), "etcd: snapshot path does not exist") {
		t.Errorf("a reset from a missing snapshot: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "server", "db", ResetFlagFile)); err == nil {
		t.Error("a refused reset wrote the reset flag")
	}

	opts.RestorePath = s.Path
	start := time.Now()
	if err := ClusterReset(t.Context(), opts, &log); err != nil {
		t.Fatalf("reset: %v\n%s", err, log.String())
	}
	took := time.Since(start)
	if !strings.Contains(log.String(), ResetDone) {
		t.Errorf("the reset did not say it is done as k3s does: %q", log.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "server", "db", "etcd-old-1796700000", "member")); err != nil {
		t.Errorf("etcd's data before the reset was not kept aside: %v", err)
	}
	if err := ClusterReset(t.Context(), opts, &log); err == nil || !strings.Contains(err.Error(), "cluster-reset was successfully performed") {
		t.Errorf("a second reset before a normal start: %v", err)
	}

	e = startEtcd(t, data, peer)
	for key, want := range map[string]bool{"/registry/before-the-snapshot": true, "/registry/after-the-snapshot": false} {
		if got, err := e.get(key); err != nil || got != want {
			t.Errorf("after the restore, %s exists: %v (%v); want %v", key, got, err, want)
		}
	}
	t.Logf("restored a %d-byte snapshot in %s", s.Size, took.Round(time.Millisecond))
}
