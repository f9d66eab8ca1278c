package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"liken.dev/liken/internal/atomicfile"
)

// A cluster reset, as `k3s server --cluster-reset [--cluster-reset-restore-path=PATH]` does
// it to a server's etcd (docs.k3s.io, "etcd-snapshot": Restoring a Cluster from a Snapshot;
// "backup-restore": the reset flag): the etcd data directory is moved aside to
// server/db/etcd-old-<unix time>, the snapshot restored into a new one as a cluster of this
// member alone, server/db/reset-flag written so that a second reset is refused until k3s has
// started normally once, and k3s exits after saying "Managed etcd cluster membership has been
// reset, restart without --cluster-reset flag now." The next start, without the flag, runs
// the restored etcd and removes the reset flag. Everything written after the snapshot is lost.
//
// The member restored gets a new name, as k3s forces one at a reset (the node's name and 8
// new hex digits, in server/db/etcd/name). A reset without a snapshot restores the member's
// own database (server/db/etcd/member/snap/db, its hash not checked: etcd writes none into
// it), which keeps every key and makes the member a cluster of itself, as k3s's reset does
// with etcd's --force-new-cluster; the other servers join it again.
const (
	// ResetFlagFile is under server/db.
	ResetFlagFile = "reset-flag"
	// ResetDone is the line k3s prints when the reset is over (pkg/etcd), which the
	// stand-in prints too.
	ResetDone = "Managed etcd cluster membership has been reset, restart without --cluster-reset flag now."
)

// ResetOptions say what to reset: a server's data directory (server/db/etcd holds etcd's),
// its node's name and etcd member's peer URL, the snapshot to restore (none: membership
// only), and the etcd binary, run as etcdutl to restore it.
type ResetOptions struct {
	DataDir, Node, PeerURL string
	RestorePath            string
	Etcd                   string
	Now                    time.Time
}

// ClusterReset resets the server's etcd (see above). A failed restore leaves the etcd data
// directory as it was.
func ClusterReset(ctx context.Context, o ResetOptions, log io.Writer) error {
	db := filepath.Join(o.DataDir, "server", "db")
	flag := filepath.Join(db, ResetFlagFile)
	if _, err := os.Stat(flag); err == nil {
		return fmt.Errorf("cluster-reset was successfully performed, please remove the cluster-reset flag and start k3s normally; to reset again, first delete %s", flag)
	}
	if err := os.MkdirAll(db, 0o700); err != nil {
		return err
	}
	data := filepath.Join(db, "etcd")
	restore, skipHash := o.RestorePath, false
	if restore == "" {
		restore, skipHash = filepath.Join(data, "member", "snap", "db"), true
		if _, err := os.Stat(restore); err != nil {
			restore = "" // no member here yet: nothing to reset
		}
	} else if _, err := os.Stat(restore); err != nil {
		return fmt.Errorf("etcd: snapshot path does not exist: %s", restore)
	}
	if restore != "" {
		// The database is copied first when it is the member's own: the restore's data
		// directory replaces the one it is in.
		if skipHash {
			cp := filepath.Join(db, "etcd-reset.db")
			if err := copyFile(restore, cp); err != nil {
				return fmt.Errorf("copying etcd's database for the reset: %w", err)
			}
			defer os.Remove(cp)
			restore = cp
		}
		name := newMemberName(o.Node)
		restoring := filepath.Join(db, "etcd-restoring")
		if err := os.RemoveAll(restoring); err != nil { // a restore a power cut ended
			return err
		}
		// etcd's own restore (etcdutl snapshot restore), checking the snapshot's hash. The
		// revision is bumped and compacted, as etcd's docs ask for a restore that a
		// kube-apiserver reads: its watchers never see a revision go back.
		args := []string{"snapshot", "restore", restore, "--data-dir=" + restoring,
			"--name=" + name, "--initial-advertise-peer-urls=" + o.PeerURL, "--initial-cluster=" + name + "=" + o.PeerURL,
			"--bump-revision=1000000000", "--mark-compacted"}
		if skipHash {
			args = append(args, "--skip-hash-check")
		}
		cmd := exec.CommandContext(ctx, o.Etcd, args...)
		cmd.Args[0] = "etcdutl"
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(restoring)
			return fmt.Errorf("restoring etcd from %s: %w: %s", restore, err, lastLines(string(out), 5))
		}
		if _, err := os.Stat(data); err == nil {
			old := filepath.Join(db, "etcd-old-"+strconv.FormatInt(o.Now.Unix(), 10))
			if err := os.Rename(data, old); err != nil {
				return fmt.Errorf("moving etcd's data aside: %w", err)
			}
			fmt.Fprintf(log, "k3s-standin: etcd's data before the reset kept in %s\n", old)
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := atomicfile.Write(filepath.Join(restoring, "name"), []byte(name+"\n"), 0o600); err != nil {
			return err
		}
		if err := os.Rename(restoring, data); err != nil {
			return fmt.Errorf("putting the restored etcd in place: %w", err)
		}
		if o.RestorePath != "" {
			fmt.Fprintf(log, "k3s-standin: etcd restored from %s as member %s\n", o.RestorePath, name)
		} else {
			fmt.Fprintf(log, "k3s-standin: etcd's membership reset: member %s alone, its data kept\n", name)
		}
	}
	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		return err
	}
	fmt.Fprintln(log, "k3s-standin: "+ResetDone)
	return nil
}

// clusterReset is `server --cluster-reset`: the reset, for this config's server, then exit.
func (c *Config) clusterReset(ctx context.Context, getenv func(string) string, log io.Writer) error {
	bin := getenv("LIKEN_STANDIN_CONTROL_PLANE")
	if bin == "" {
		return errors.New("--cluster-reset: this stand-in runs no etcd (LIKEN_STANDIN_CONTROL_PLANE unset)")
	}
	cp, err := c.controlPlane(bin, log)
	if err != nil {
		return err
	}
	cp.defaults()
	m := cp.etcdMember()
	return ClusterReset(ctx, ResetOptions{DataDir: cp.DataDir, Node: cp.NodeName, PeerURL: m.peerURL(),
		RestorePath: c.restorePath, Etcd: filepath.Join(bin, "etcd"), Now: time.Now()}, log)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}

// lastLines is the last n lines of s, for an error that quotes a tool's output.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
