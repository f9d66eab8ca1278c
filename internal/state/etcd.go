package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/atomicfile"
)

// EtcdRestoreFile, in the state directory, is a server's last restore of etcd from a
// snapshot (spec.etcdRestore). Init alone writes it: the restore runs at boot, before k3s
// and the agent start. The agent reports it as status.etcdRestore, and init reads it to
// restore once per snapshot and request.
const EtcdRestoreFile = "etcd-restore.json"

// EtcdRejoinFile, in the state directory, is a server's last rejoin of the cluster's etcd
// without its data (spec.etcdRejoin): written by init alone, before k3s starts, reported
// by the agent as status.etcdRejoin, and read by init to rejoin once per request.
const EtcdRejoinFile = "etcd-rejoin.json"

// LoadEtcdRestore returns the last restore, nil when there was none.
func LoadEtcdRestore(dir string) (*v1alpha1.EtcdRestoreStatus, error) {
	return loadRecord[v1alpha1.EtcdRestoreStatus](dir, EtcdRestoreFile)
}

// SaveEtcdRestore records a restore, whole or not at all.
func SaveEtcdRestore(dir string, r v1alpha1.EtcdRestoreStatus) error {
	return saveRecord(dir, EtcdRestoreFile, r)
}

// EtcdRestoreDone says whether want (spec.etcdRestore) was already carried out, or tried:
// the last restore was for the same snapshot and request.
func EtcdRestoreDone(last *v1alpha1.EtcdRestoreStatus, want *v1alpha1.EtcdRestore) bool {
	return want == nil || last != nil && last.Snapshot == want.Snapshot && last.Request == want.Request
}

// LoadEtcdRejoin returns the last rejoin, nil when there was none.
func LoadEtcdRejoin(dir string) (*v1alpha1.EtcdRejoinStatus, error) {
	return loadRecord[v1alpha1.EtcdRejoinStatus](dir, EtcdRejoinFile)
}

// SaveEtcdRejoin records a rejoin, whole or not at all.
func SaveEtcdRejoin(dir string, r v1alpha1.EtcdRejoinStatus) error {
	return saveRecord(dir, EtcdRejoinFile, r)
}

// EtcdRejoinDone says whether want (spec.etcdRejoin) was already carried out, or refused:
// the last rejoin was for the same request.
func EtcdRejoinDone(last *v1alpha1.EtcdRejoinStatus, want *v1alpha1.EtcdRejoin) bool {
	return want == nil || last != nil && last.Request == want.Request
}

// loadRecord reads one of init's one-shot records, nil when there is none.
func loadRecord[T any](dir, file string) (*T, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := new(T)
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	return r, nil
}

// saveRecord writes one of init's one-shot records, whole or not at all.
func saveRecord(dir, file string, r any) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, file), b, 0o600)
}
