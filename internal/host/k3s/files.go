package k3s

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"liken.dev/liken/internal/atomicfile"
)

// Root prefixes every path (a test's temporary directory; "/" on a machine).
type Root string

// Changed reports which rendered files differ from what is on disk.
func (r Root) Changed(out Output) ([]string, error) {
	var changed []string
	for _, p := range out.Paths() {
		old, err := os.ReadFile(r.join(p))
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		if err != nil || string(old) != string(out[p]) {
			changed = append(changed, p)
		}
	}
	return changed, nil
}

// Write replaces the files that changed, each atomically, mode 0600.
func (r Root) Write(out Output) error {
	for _, p := range out.Paths() {
		if _, err := atomicfile.WriteIfChanged(r.join(p), out[p], 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (r Root) join(p string) string {
	return filepath.Join(string(r), strings.TrimPrefix(p, "/"))
}
