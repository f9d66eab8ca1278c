package k3s

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// k3s's etcd snapshots, as pkg/etcd/snapshot.go and pkg/cli/etcdsnapshot take them: `k3s
// etcd-snapshot save --name NAME` writes NAME-NODE-UNIXSECONDS (the node's name, the time
// rounded to the second) into ${data-dir}/server/db/snapshots (created 0700 when it is the
// default) and prunes nothing (the command sets the retention to 0); `k3s etcd-snapshot
// prune --name NAME` keeps the etcd-snapshot-retention newest files whose name begins with
// NAME (5 by default) and removes the others.

// SnapshotName is the name liken's snapshots begin with: one prefix for every turn, so that
// k3s's retention, which counts the files of one prefix, bounds them all (a prefix per
// release would keep five of each release for ever).
const SnapshotName = "liken"

// DefaultSnapshotRetention is k3s's etcd-snapshot-retention default.
const DefaultSnapshotRetention = 5

// SnapshotDir is k3s's default snapshot directory for a data directory.
func SnapshotDir(dataDir string) string {
	return filepath.Join(dataDir, "server", "db", "snapshots")
}

// EtcdDir is where k3s keeps the embedded etcd's data for a data directory
// (pkg/etcd: dbDir/etcd); a server without it joins the cluster as a new member.
func EtcdDir(dataDir string) string {
	return filepath.Join(dataDir, "server", "db", "etcd")
}

// SnapshotFileName is the file k3s writes for a snapshot of name taken on node at t.
func SnapshotFileName(name, node string, t time.Time) string {
	return fmt.Sprintf("%s-%s-%d", name, node, t.Round(time.Second).Unix())
}

// Snapshot is one snapshot file.
type Snapshot struct {
	Name string
	Path string
	Size int64
	// At is the time in its name (its modification time if the name has none).
	At time.Time
}

// Snapshots lists the files in dir whose name begins with prefix, oldest first, as k3s's
// retention orders them.
func Snapshots(dir, prefix string) ([]Snapshot, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Snapshot
	for _, e := range ents {
		if e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed since the directory was read
		}
		at := fi.ModTime()
		base := strings.TrimSuffix(e.Name(), ".zip")
		if ts, err := strconv.ParseInt(base[strings.LastIndexByte(base, '-')+1:], 10, 64); err == nil {
			at = time.Unix(ts, 0)
		}
		out = append(out, Snapshot{Name: e.Name(), Path: filepath.Join(dir, e.Name()), Size: fi.Size(), At: at})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].At.Equal(out[j].At) {
			return out[i].At.Before(out[j].At)
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// LatestSnapshot is the newest snapshot of name taken on node in dir, taken at since or
// later (k3s names it by the second).
func LatestSnapshot(dir, name, node string, since time.Time) (Snapshot, error) {
	all, err := Snapshots(dir, name+"-"+node+"-")
	if err != nil {
		return Snapshot{}, fmt.Errorf("listing the etcd snapshots in %s: %w", dir, err)
	}
	since = since.Truncate(time.Second)
	for i := len(all) - 1; i >= 0; i-- {
		if !all[i].At.Before(since) && all[i].Size > 0 {
			return all[i], nil
		}
	}
	return Snapshot{}, fmt.Errorf("no snapshot %s-%s-* in %s taken since %s", name, node, dir, since.UTC().Format(time.RFC3339))
}

// SaveSnapshot asks k3s (binary) for an etcd snapshot of name, as an operator's `k3s
// etcd-snapshot save --name NAME` does on a server, and returns the file it wrote for node
// into dataDir's snapshot directory.
func SaveSnapshot(ctx context.Context, binary, dataDir, node, name string) (Snapshot, error) {
	start := time.Now()
	out, err := exec.CommandContext(ctx, binary, "etcd-snapshot", "save", "--name", name).CombinedOutput()
	if err != nil {
		return Snapshot{}, fmt.Errorf("%s etcd-snapshot save: %w: %s", binary, err, lastLines(out, 3))
	}
	return LatestSnapshot(SnapshotDir(dataDir), name, node, start)
}

// PruneSnapshots asks k3s to apply its snapshot retention to the snapshots of name (`k3s
// etcd-snapshot prune --name NAME`).
func PruneSnapshots(ctx context.Context, binary, name string) error {
	if out, err := exec.CommandContext(ctx, binary, "etcd-snapshot", "prune", "--name", name).CombinedOutput(); err != nil {
		return fmt.Errorf("%s etcd-snapshot prune: %w: %s", binary, err, lastLines(out, 3))
	}
	return nil
}

// lastLines is the last n lines of out, on one line.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}
