package standin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/test/apiserver"
)

// TestSaveSnapshot: a real etcd's snapshot saved as k3s names it, whole (etcd's checksum
// checked, the database holding what was written before it); save prunes nothing, as
// k3s's; prune keeps the retention's newest of the name's snapshots only.
func TestSaveSnapshot(t *testing.T) {
	if err := apiserver.EnsureTools(t.Context()); err != nil {
		t.Fatal(err)
	}
	client, peer := apiserver.FreePort(), apiserver.FreePort()
	url := fmt.Sprintf("http://127.0.0.1:%d", client)
	cmd := exec.Command(filepath.Join(apiserver.ToolsDir(), "etcd"), "--name=srv-1", "--data-dir="+t.TempDir(),
		"--listen-client-urls="+url, "--advertise-client-urls="+url,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", peer), fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", peer),
		fmt.Sprintf("--initial-cluster=srv-1=http://127.0.0.1:%d", peer), "--listen-metrics-urls=", "--log-level=warn")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// A key to find in the snapshot, once etcd answers.
	put := func() error {
		body := fmt.Sprintf(`{"key":%q,"value":%q}`, base64.StdEncoding.EncodeToString([]byte("/registry/liken-marker")), base64.StdEncoding.EncodeToString([]byte("before the turn")))
		resp, err := http.Post(url+"/v3/kv/put", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("put: %s", resp.Status)
		}
		return nil
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		err := put()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not answer: %v", err)
		}
	}

	dir := filepath.Join(t.TempDir(), "server", "db", "snapshots")
	at := time.Unix(1796600000, 0)
	var kept []string
	for i := range 4 {
		s, err := SaveSnapshot(t.Context(), SnapshotOptions{EtcdURL: url, Dir: dir, Name: k3s.SnapshotName, Node: "srv-1", Retention: 3, Now: at.Add(time.Duration(i) * time.Minute)})
		if err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
		// As k3s's save, it prunes nothing; prune keeps the newest three.
		pruned, err := PruneSnapshots(dir, k3s.SnapshotName, 3)
		if err != nil {
			t.Fatalf("prune after save %d: %v", i, err)
		}
		want := fmt.Sprintf("liken-srv-1-%d", at.Add(time.Duration(i)*time.Minute).Unix())
		if s.Name != want || s.Path != filepath.Join(dir, want) {
			t.Errorf("save %d: %s at %s; want %s", i, s.Name, s.Path, want)
		}
		b, err := os.ReadFile(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(b)) != s.Size || s.Size < 4096 {
			t.Errorf("save %d: %d bytes on disk, %d reported", i, len(b), s.Size)
		}
		// The file ends with the SHA-256 of the database before it; the database holds the key.
		db, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
		if got := sha256.Sum256(db); !bytes.Equal(got[:], sum) {
			t.Errorf("save %d: the file's checksum does not match its database", i)
		}
		if !bytes.Contains(db, []byte("/registry/liken-marker")) {
			t.Errorf("save %d: the database does not hold the key written before it", i)
		}
		if i < 3 && len(pruned) != 0 || i == 3 && !slices.Equal(pruned, []string{fmt.Sprintf("liken-srv-1-%d", at.Unix())}) {
			t.Errorf("save %d with retention 3 removed %v", i, pruned)
		}
		kept = append(kept, want)
	}
	// Another name's snapshot is not counted by liken's retention, nor removed.
	other := filepath.Join(dir, "on-demand-srv-1-1796000000")
	if err := os.WriteFile(other, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := SaveSnapshot(t.Context(), SnapshotOptions{EtcdURL: url, Dir: dir, Name: k3s.SnapshotName, Node: "srv-1", Now: at.Add(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 5 {
		t.Errorf("save pruned: %d files after it; want 5 (three of liken, the new one, another name's)", len(ents))
	}
	if _, err := PruneSnapshots(dir, k3s.SnapshotName, 3); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{kept[2], kept[3], fmt.Sprintf("liken-srv-1-%d", at.Add(10*time.Minute).Unix()), "on-demand-srv-1-1796000000"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("the snapshot directory holds %v; want %v", names, want)
	}
	latest, err := k3s.LatestSnapshot(dir, k3s.SnapshotName, "srv-1", at.Add(10*time.Minute))
	if err != nil || latest.Name != want[2] {
		t.Errorf("LatestSnapshot = %+v, %v; want %s", latest, err, want[2])
	}
	if _, err := k3s.LatestSnapshot(dir, k3s.SnapshotName, "srv-1", at.Add(11*time.Minute)); err == nil {
		t.Error("LatestSnapshot found a snapshot taken before the time asked for")
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the snapshot directory: %v, %v; want mode 0700 as k3s makes it", fi.Mode(), err)
	}
}

// TestSaveSnapshotRefusesABadStream: a stream whose checksum does not match, or that ends
// early, is an error and leaves no file under the snapshot's name.
func TestSaveSnapshotRefusesABadStream(t *testing.T) {
	db := bytes.Repeat([]byte("database page "), 1000)
	sum := sha256.Sum256(db)
	bad := append([]byte(nil), sum[:]...)
	bad[0] ^= 1
	for _, tc := range []struct {
		name  string
		parts [][]byte
		want  string
	}{
		{"checksum off", [][]byte{db[:5000], db[5000:], bad}, "does not match the checksum"},
		{"cut before the checksum", [][]byte{db[:5000]}, "does not match the checksum"},
		{"empty", nil, "without its checksum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				enc := json.NewEncoder(w)
				for _, p := range tc.parts {
					enc.Encode(map[string]any{"result": map[string]any{"blob": base64.StdEncoding.EncodeToString(p)}})
				}
			}))
			defer srv.Close()
			dir := t.TempDir()
			_, err := SaveSnapshot(context.Background(), SnapshotOptions{EtcdURL: srv.URL, Dir: dir, Name: "liken", Node: "srv-1"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("SaveSnapshot = %v; want an error saying %q", err, tc.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("left in the snapshot directory: %v", ents)
			}
		})
	}
	// The good stream of the same database is taken.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"result": map[string]any{"blob": base64.StdEncoding.EncodeToString(append(append([]byte(nil), db...), sum[:]...))}})
	}))
	defer srv.Close()
	if s, err := SaveSnapshot(context.Background(), SnapshotOptions{EtcdURL: srv.URL, Dir: t.TempDir(), Name: "liken", Node: "srv-1"}); err != nil || s.Size != int64(len(db)+len(sum)) {
		t.Errorf("SaveSnapshot of a whole stream = %+v, %v", s, err)
	}
}

func TestParseSnapshot(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("node-name: srv-2\ndata-dir: /data/k3s\netcd-snapshot-retention: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(string) string { return "" }
	for _, tc := range []struct {
		name string
		args []string
		want SnapshotOptions
		err  string
	}{
		{"k3s's defaults from the config file", []string{"save", "--config", cfg},
			SnapshotOptions{EtcdURL: "https://127.0.0.1:2379", TLSDir: "/data/k3s/server/tls/etcd", Dir: "/data/k3s/server/db/snapshots", Name: "on-demand", Node: "srv-2", Retention: 7}, ""},
		{"liken's call", []string{"save", "--name", "liken", "--config=" + cfg},
			SnapshotOptions{EtcdURL: "https://127.0.0.1:2379", TLSDir: "/data/k3s/server/tls/etcd", Dir: "/data/k3s/server/db/snapshots", Name: "liken", Node: "srv-2", Retention: 7}, ""},
		{"flags over the file, with and without etcd-", []string{"save", "-c", cfg, "--etcd-snapshot-dir", "/snap", "--snapshot-retention=2", "--node-name", "n"},
			SnapshotOptions{EtcdURL: "https://127.0.0.1:2379", TLSDir: "/data/k3s/server/tls/etcd", Dir: "/snap", Name: "on-demand", Node: "n", Retention: 2}, ""},
		{"prune, with the file's retention", []string{"prune", "--name", "liken", "-c", cfg},
			SnapshotOptions{EtcdURL: "https://127.0.0.1:2379", TLSDir: "/data/k3s/server/tls/etcd", Dir: "/data/k3s/server/db/snapshots", Name: "liken", Node: "srv-2", Retention: 7}, ""},
		{"neither save nor prune", []string{"ls"}, SnapshotOptions{}, "save and prune only"},
		{"unknown flag", []string{"save", "--s3"}, SnapshotOptions{}, "not defined: --s3"},
		{"a path for a name", []string{"save", "--config", cfg, "--name", "../x"}, SnapshotOptions{}, "want a file name"},
		{"retention not a number", []string{"save", "--config", cfg, "--snapshot-retention", "five"}, SnapshotOptions{}, "snapshot retention"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSnapshot(tc.args, env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("parseSnapshot = %+v, %v; want an error saying %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("parseSnapshot = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
