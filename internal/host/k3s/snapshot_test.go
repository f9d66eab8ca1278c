package k3s

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSaveSnapshotThroughK3s: liken asks k3s's command line for the snapshot and finds the
// file it wrote, by k3s's naming, in k3s's directory; a failing command's words are in the
// error; a snapshot of another node or from before the command is not taken for it. The
// command is a shell script standing in for k3s (the stand-in's own command is
// internal/standin's TestSaveSnapshot, against a real etcd).
func TestSaveSnapshotThroughK3s(t *testing.T) {
	data := t.TempDir()
	dir := SnapshotDir(data)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Older, and another node's: neither is the one asked for.
	for _, n := range []string{"liken-srv-1-1000000000", "liken-srv-2-" + strconv.FormatInt(time.Now().Unix()+5, 10)} {
		os.WriteFile(filepath.Join(dir, n), []byte("old"), 0o600)
	}
	k3s := filepath.Join(t.TempDir(), "k3s")
	script := `#!/bin/sh
echo "$@" >> ` + filepath.Join(data, "calls") + `
[ "$2" = save ] || exit 0
[ "$4" = liken ] || { echo "unexpected name $4" >&2; exit 1; }
head -c 8192 /dev/zero > ` + dir + `/$4-srv-1-$(date +%s)
`
	if err := os.WriteFile(k3s, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := SaveSnapshot(context.Background(), k3s, data, "srv-1", SnapshotName)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.Name, "liken-srv-1-") || s.Name == "liken-srv-1-1000000000" || s.Size != 8192 || s.Path != filepath.Join(dir, s.Name) {
		t.Errorf("SaveSnapshot = %+v", s)
	}
	if err := PruneSnapshots(context.Background(), k3s, SnapshotName); err != nil {
		t.Fatal(err)
	}
	calls, _ := os.ReadFile(filepath.Join(data, "calls"))
	if string(calls) != "etcd-snapshot save --name liken\netcd-snapshot prune --name liken\n" {
		t.Errorf("k3s was run with:\n%s", calls)
	}
	if _, err := SaveSnapshot(context.Background(), k3s, data, "srv-1", "../x"); err == nil || !strings.Contains(err.Error(), "unexpected name ../x") {
		t.Errorf("a failing command: %v; want its words in the error", err)
	}
}
