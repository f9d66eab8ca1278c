package initd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/state"
)

// TestRejoinEtcdOnce: a joining server whose spec asks to rejoin has its etcd data moved
// aside (server/db/etcd-old-<unix time>, as k3s's reset names it) before k3s starts, once
// per request, and it is recorded; a new request moves the new member's data again; the
// server that initialises the cluster refuses (it would start a new, empty cluster), an
// agent does nothing, a server without etcd data records that it had none; a power cut
// between the record and the move has the next boot make the move, and never moves the
// new member's data for the same request.
func TestRejoinEtcdOnce(t *testing.T) {
	stateDir, db := t.TempDir(), t.TempDir()
	etcd := filepath.Join(db, "etcd")
	member := func(content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(etcd, "member", "wal"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etcd, "name"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Unix(1796700000, 0)
	boot := func(role v1alpha1.Role, join string, r *v1alpha1.EtcdRejoin) (*v1alpha1.EtcdRejoinStatus, string) {
		t.Helper()
		var log bytes.Buffer
		s := &system{log: &log, join: join, machine: &v1alpha1.Machine{Spec: v1alpha1.MachineSpec{Role: role, EtcdRejoin: r}}}
		s.rejoinEtcd(stateDir, etcd, now)
		now = now.Add(time.Minute)
		last, err := state.LoadEtcdRejoin(stateDir)
		if err != nil {
			t.Fatal(err)
		}
		return last, log.String()
	}
	read := func(path string) string {
		b, _ := os.ReadFile(path)
		return string(b)
	}
	const join = "https://192.168.76.10:6443"

	member("s2-old")
	last, log := boot(v1alpha1.RoleServer, join, &v1alpha1.EtcdRejoin{Request: "1"})
	if last == nil || last.Request != "1" || last.MovedTo != "etcd-old-1796700000" || last.Error != "" || last.At.IsZero() {
		t.Fatalf("recorded %+v; said %q", last, log)
	}
	if got := read(filepath.Join(db, "etcd-old-1796700000", "name")); got != "s2-old" {
		t.Errorf("the old member's data is not in etcd-old-1796700000 (name %q)", got)
	}
	if _, err := os.Stat(etcd); !os.IsNotExist(err) || !strings.Contains(log, "k3s joins the cluster through "+join) {
		t.Errorf("etcd's data is still in place (%v), or init did not say so: %q", err, log)
	}

	// k3s joined: the new member's data must stand the next boots with the same request.
	member("s2-new")
	boot(v1alpha1.RoleServer, join, &v1alpha1.EtcdRejoin{Request: "1"})
	if got := read(filepath.Join(etcd, "name")); got != "s2-new" {
		t.Fatalf("the same request moved the new member's data aside")
	}
	// A new request rejoins again.
	last, _ = boot(v1alpha1.RoleServer, join, &v1alpha1.EtcdRejoin{Request: "2"})
	if last.Request != "2" || last.MovedTo != "etcd-old-1796700120" || read(filepath.Join(db, "etcd-old-1796700120", "name")) != "s2-new" {
		t.Errorf("a new request: recorded %+v", last)
	}

	// No data: nothing to move, recorded.
	last, log = boot(v1alpha1.RoleServer, join, &v1alpha1.EtcdRejoin{Request: "3"})
	if last.Request != "3" || last.MovedTo != "" || last.Error != "" || !strings.Contains(log, "has no etcd data") {
		t.Errorf("no data: recorded %+v, said %q", last, log)
	}

	// The server that initialises the cluster refuses, and keeps its data.
	member("s1")
	last, log = boot(v1alpha1.RoleServer, "", &v1alpha1.EtcdRejoin{Request: "4"})
	if !strings.Contains(last.Error, "initialises the cluster") || !strings.Contains(log, "REFUSED") || read(filepath.Join(etcd, "name")) != "s1" {
		t.Errorf("the initialising server: recorded %+v, said %q", last, log)
	}
	// An agent does nothing at all.
	last, _ = boot(v1alpha1.RoleAgent, join, &v1alpha1.EtcdRejoin{Request: "5"})
	if last.Request != "4" || read(filepath.Join(etcd, "name")) != "s1" {
		t.Errorf("an agent acted on spec.etcdRejoin: recorded %+v", last)
	}

	// A power cut after the record and before the move: the next boot moves.
	if err := state.SaveEtcdRejoin(stateDir, v1alpha1.EtcdRejoinStatus{Request: "6", MovedTo: "etcd-old-42"}); err != nil {
		t.Fatal(err)
	}
	_, log = boot(v1alpha1.RoleServer, join, &v1alpha1.EtcdRejoin{Request: "6"})
	if read(filepath.Join(db, "etcd-old-42", "name")) != "s1" || !strings.Contains(log, "did not make it; moving now") {
		t.Errorf("after a cut between the record and the move, the next boot did not move the data: %q", log)
	}
	member("s1-new")
	boot(v1alpha1.RoleServer, join, &v1alpha1.EtcdRejoin{Request: "6"})
	if read(filepath.Join(etcd, "name")) != "s1-new" {
		t.Errorf("the boot after the completed move moved the new member's data")
	}
}
