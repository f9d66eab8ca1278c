package initd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/state"
)

// rejoinEtcd sets this server's etcd data aside, once per request of spec.etcdRejoin,
// before k3s starts (docs/reboots.md, "A way back from a lost quorum"): k3s's docs have the
// other servers of a restored cluster remove their etcd data and start k3s, which then joins
// through its server address as a new member. The data is moved, not removed, as k3s's own
// reset keeps it (server/db/etcd-old-<unix time>). The server that initialises the cluster
// (no join address: s.join is empty) refuses, recorded with why: without its data, k3s
// would start a new, empty cluster there.
//
// The record is written before the move, naming where the data goes: a power cut between
// the two leaves a record whose directory is missing while etcd's data is still in place,
// and the next boot moves it then. Recorded after, a cut would have the next boot move the
// new member's data aside again.
func (s *system) rejoinEtcd(stateDir, etcdDir string, now time.Time) {
	want := s.machine.Spec.EtcdRejoin
	if s.machine.Spec.Role != v1alpha1.RoleServer || want == nil {
		return
	}
	last, err := state.LoadEtcdRejoin(stateDir)
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: etcd rejoin: %v; not rejoining\n", err)
		return
	}
	_, dataErr := os.Stat(etcdDir)
	if state.EtcdRejoinDone(last, want) {
		if last.MovedTo == "" || last.Error != "" || dataErr != nil {
			return
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(etcdDir), last.MovedTo)); !errors.Is(err, os.ErrNotExist) {
			return // moved, and the new member's data is in place
		}
		fmt.Fprintf(s.log, "liken-init: etcd rejoin (spec.etcdRejoin %q): the last boot recorded the move to server/db/%s but did not make it; moving now\n", want.Request, last.MovedTo)
		s.moveEtcd(stateDir, etcdDir, *last, want.Request)
		return
	}
	rec := v1alpha1.EtcdRejoinStatus{Request: want.Request, At: metav1.NewTime(now)}
	switch {
	case s.join == "":
		rec.Error = "this server initialises the cluster (k3s cluster-init, no server address to join): without its etcd data it would start a new, empty cluster; restore it from a snapshot instead (spec.etcdRestore)"
	case errors.Is(dataErr, os.ErrNotExist):
		// Nothing to set aside: k3s joins as it would anyway.
	case dataErr != nil:
		rec.Error = fmt.Sprintf("reading etcd's data directory: %v", dataErr)
	default:
		rec.MovedTo = "etcd-old-" + strconv.FormatInt(now.Unix(), 10)
	}
	if err := state.SaveEtcdRejoin(stateDir, rec); err != nil {
		fmt.Fprintf(s.log, "liken-init: recording the etcd rejoin: %v; not rejoining at this boot\n", err)
		return
	}
	if rec.Error != "" {
		fmt.Fprintf(s.log, "liken-init: etcd rejoin (spec.etcdRejoin %q) REFUSED: %s; k3s starts on etcd's data as it was\n", want.Request, rec.Error)
		return
	}
	if rec.MovedTo == "" {
		fmt.Fprintf(s.log, "liken-init: etcd rejoin (spec.etcdRejoin %q): this server has no etcd data; k3s joins the cluster through %s as a new member\n", want.Request, s.join)
		return
	}
	s.moveEtcd(stateDir, etcdDir, rec, want.Request)
}

// moveEtcd moves etcd's data to the place rec names; a failure is recorded in place of it.
func (s *system) moveEtcd(stateDir, etcdDir string, rec v1alpha1.EtcdRejoinStatus, request string) {
	old := filepath.Join(filepath.Dir(etcdDir), rec.MovedTo)
	if err := os.Rename(etcdDir, old); err != nil {
		rec.MovedTo, rec.Error = "", fmt.Sprintf("moving etcd's data aside: %v", err)
		fmt.Fprintf(s.log, "liken-init: etcd rejoin (spec.etcdRejoin %q) FAILED: %s; k3s starts on etcd's data as it was\n", request, rec.Error)
		if err := state.SaveEtcdRejoin(stateDir, rec); err != nil {
			fmt.Fprintf(s.log, "liken-init: recording the etcd rejoin's failure: %v\n", err)
		}
		return
	}
	fmt.Fprintf(s.log, "liken-init: etcd rejoin (spec.etcdRejoin %q): this server's etcd data moved to server/db/%s; k3s joins the cluster through %s as a new member\n", request, rec.MovedTo, s.join)
}
