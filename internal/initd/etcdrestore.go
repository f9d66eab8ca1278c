package initd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/state"
)

// etcdRestoreBound bounds a restore: k3s restores a snapshot of a few GiB in minutes.
const etcdRestoreBound = 15 * time.Minute

// resetDone is what k3s prints once a cluster reset is over (pkg/etcd; the stand-in prints
// the same).
const resetDone = "Managed etcd cluster membership has been reset"

// restoreEtcd restores a server's etcd from the snapshot spec.etcdRestore names, once per
// snapshot and request, before k3s starts (docs/reboots.md, "A way back from a lost
// quorum"): k3s run once with --cluster-reset --cluster-reset-restore-path, as k3s's docs
// give it, which exits when it is done; k3s then starts as always, on the restored etcd.
// A restore that fails is recorded with why and not tried again for the same request; k3s
// starts on etcd's data as it was (k3s moves nothing before the snapshot is restored).
func (s *system) restoreEtcd(stateDir, snapshotDir string, out io.Writer, run func(ctx context.Context, args []string, out io.Writer) error) {
	want := s.machine.Spec.EtcdRestore
	if s.machine.Spec.Role != v1alpha1.RoleServer || want == nil {
		return
	}
	last, err := state.LoadEtcdRestore(stateDir)
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: etcd restore: %v; not restoring\n", err)
		return
	}
	if state.EtcdRestoreDone(last, want) {
		return
	}
	rec := v1alpha1.EtcdRestoreStatus{Snapshot: want.Snapshot, Request: want.Request}
	path := filepath.Join(snapshotDir, want.Snapshot)
	start := time.Now()
	fmt.Fprintf(s.log, "liken-init: restoring etcd from snapshot %s (spec.etcdRestore): what the cluster wrote after it is lost\n", want.Snapshot)
	var err2 error
	if strings.ContainsAny(want.Snapshot, "/") || want.Snapshot == "." || want.Snapshot == ".." {
		err2 = fmt.Errorf("%q is not a file name in the snapshot directory", want.Snapshot)
	} else if _, err := os.Stat(path); err != nil {
		err2 = fmt.Errorf("no snapshot %s on this server: %w", want.Snapshot, err)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), etcdRestoreBound)
		var buf bytes.Buffer
		err2 = run(ctx, []string{"server", "--config", k3s.DefaultPaths.Config, "--cluster-reset", "--cluster-reset-restore-path=" + path}, io.MultiWriter(out, &buf))
		cancel()
		if err2 == nil && !strings.Contains(buf.String(), resetDone) {
			err2 = fmt.Errorf("k3s exited without saying the reset was done (%q)", resetDone)
		}
	}
	rec.At = metav1.Now()
	if err2 != nil {
		rec.Error = err2.Error()
		fmt.Fprintf(s.log, "liken-init: etcd restore from %s FAILED: %v; k3s starts on etcd's data as it was\n", want.Snapshot, err2)
	} else {
		fmt.Fprintf(s.log, "liken-init: etcd restored from snapshot %s in %s\n", want.Snapshot, time.Since(start).Round(time.Millisecond))
	}
	if err := state.SaveEtcdRestore(stateDir, rec); err != nil {
		fmt.Fprintf(s.log, "liken-init: recording the etcd restore: %v (it may be done again at the next boot)\n", err)
	}
}

// runK3sOnce runs k3s with args until it exits, as restoreEtcd's one-shot run.
func (s *system) runK3sOnce(ctx context.Context, args []string, out io.Writer) error {
	cmd := exec.CommandContext(ctx, "/usr/bin/k3s", args...)
	cmd.Env = k3sEnv(s.cmd, s.machine.Spec.Role, s.version)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("k3s %s: %w", strings.Join(args, " "), err)
	}
	return nil
}
