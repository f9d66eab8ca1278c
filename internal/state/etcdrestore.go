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

// LoadEtcdRestore returns the last restore, nil when there was none.
func LoadEtcdRestore(dir string) (*v1alpha1.EtcdRestoreStatus, error) {
	b, err := os.ReadFile(filepath.Join(dir, EtcdRestoreFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := &v1alpha1.EtcdRestoreStatus{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", EtcdRestoreFile, err)
	}
	return r, nil
}

// SaveEtcdRestore records a restore, whole or not at all.
func SaveEtcdRestore(dir string, r v1alpha1.EtcdRestoreStatus) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, EtcdRestoreFile), b, 0o600)
}

// EtcdRestoreDone says whether want (spec.etcdRestore) was already carried out, or tried:
// the last restore was for the same snapshot and request.
func EtcdRestoreDone(last *v1alpha1.EtcdRestoreStatus, want *v1alpha1.EtcdRestore) bool {
	return want == nil || last != nil && last.Snapshot == want.Snapshot && last.Request == want.Request
}
