package initd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/state"
)

// TestRestoreEtcdOnce: a server whose spec names a snapshot runs k3s once with k3s's reset
// flags for it, before k3s starts, and records it; the next boot with the same spec does
// not restore again, a new request does; a snapshot missing, a k3s that fails or does not
// say it reset, are recorded with why (k3s then starts as it was); an agent never restores.
func TestRestoreEtcdOnce(t *testing.T) {
	stateDir, snaps := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(snaps, "liken-s1-1796700000"), []byte("snapshot"), 0o600)
	var runs [][]string
	reply, fail := "INFO Managed etcd cluster membership has been reset, restart without --cluster-reset flag now.\n", error(nil)
	run := func(_ context.Context, args []string, out io.Writer) error {
		runs = append(runs, args)
		io.WriteString(out, reply)
		return fail
	}
	boot := func(role v1alpha1.Role, r *v1alpha1.EtcdRestore) (*v1alpha1.EtcdRestoreStatus, string) {
		t.Helper()
		var log bytes.Buffer
		s := &system{log: &log, machine: &v1alpha1.Machine{Spec: v1alpha1.MachineSpec{Role: role, EtcdRestore: r}}}
		s.restoreEtcd(stateDir, snaps, io.Discard, run)
		last, err := state.LoadEtcdRestore(stateDir)
		if err != nil {
			t.Fatal(err)
		}
		return last, log.String()
	}

	last, log := boot(v1alpha1.RoleServer, &v1alpha1.EtcdRestore{Snapshot: "liken-s1-1796700000"})
	want := []string{"server", "--config", "/etc/rancher/k3s/config.yaml", "--cluster-reset", "--cluster-reset-restore-path=" + filepath.Join(snaps, "liken-s1-1796700000")}
	if len(runs) != 1 || !slices.Equal(runs[0], want) {
		t.Fatalf("k3s ran %v; want once with %v", runs, want)
	}
	if last == nil || last.Snapshot != "liken-s1-1796700000" || last.Error != "" || last.At.IsZero() || !strings.Contains(log, "etcd restored from snapshot liken-s1-1796700000") {
		t.Errorf("recorded %+v; said %q", last, log)
	}
	boot(v1alpha1.RoleServer, &v1alpha1.EtcdRestore{Snapshot: "liken-s1-1796700000"})
	if len(runs) != 1 {
		t.Errorf("the same request restored again at the next boot")
	}
	boot(v1alpha1.RoleServer, &v1alpha1.EtcdRestore{Snapshot: "liken-s1-1796700000", Request: "again"})
	if len(runs) != 2 {
		t.Errorf("a new request did not restore")
	}

	for _, tc := range []struct {
		name, snapshot, reply string
		fail                  error
		want                  string
	}{
		{"missing", "liken-s1-1", reply, nil, "no snapshot liken-s1-1 on this server"},
		{"k3s fails", "liken-s1-1796700000", "FATA etcd: snapshot path does not exist\n", errors.New("exit status 1"), "exit status 1"},
		{"k3s silent", "liken-s1-1796700000", "", nil, "without saying the reset was done"},
	} {
		n := len(runs)
		reply, fail = tc.reply, tc.fail
		last, log := boot(v1alpha1.RoleServer, &v1alpha1.EtcdRestore{Snapshot: tc.snapshot, Request: tc.name})
		if last == nil || !strings.Contains(last.Error, tc.want) || !strings.Contains(log, "FAILED") {
			t.Errorf("%s: recorded %+v, said %q; want an error with %q", tc.name, last, log, tc.want)
		}
		boot(v1alpha1.RoleServer, &v1alpha1.EtcdRestore{Snapshot: tc.snapshot, Request: tc.name})
		if tc.name != "missing" && len(runs) != n+1 || tc.name == "missing" && len(runs) != n {
			t.Errorf("%s: k3s ran %d times for one failed request; want it tried once", tc.name, len(runs)-n)
		}
	}
	n := len(runs)
	boot(v1alpha1.RoleAgent, &v1alpha1.EtcdRestore{Snapshot: "liken-s1-1796700000", Request: "agent"})
	if len(runs) != n {
		t.Errorf("an agent ran a cluster reset")
	}
}
