// Package sysctl applies kernel parameters through /proc/sys the way every liken host
// change works: Spec → Apply → Status, remembering each key's original value the first time
// liken writes it, and writing that value back when the key leaves the spec.
package sysctl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Host is /proc/sys, or a directory standing in for it in tests.
type Host struct {
	Root string
}

// Default is the real /proc/sys.
var Default = Host{Root: "/proc/sys"}

// Result is what one Apply did.
type Result struct {
	// Set are the keys written (or already at their value).
	Set []string
	// Restored are the keys that left the spec and got their original value back.
	Restored []string
	// Failed holds the keys that could not be read or written, with why. Others still apply.
	Failed map[string]error
}

// Apply makes the kernel match desired. originals maps each key liken has changed to its
// value before liken's first write; Apply updates it in place (the caller persists it).
func (h Host) Apply(desired map[string]string, originals map[string]string) Result {
	res := Result{Failed: map[string]error{}}
	for _, k := range sortedKeys(desired) {
		want := desired[k]
		cur, err := h.Read(k)
		if err != nil {
			res.Failed[k] = err
			continue
		}
		if _, known := originals[k]; !known {
			originals[k] = cur
		}
		if normalize(cur) != normalize(want) {
			if err := h.Write(k, want); err != nil {
				res.Failed[k] = err
				continue
			}
		}
		res.Set = append(res.Set, k)
	}
	for _, k := range sortedKeys(originals) {
		if _, still := desired[k]; still {
			continue
		}
		if err := h.Write(k, originals[k]); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				delete(originals, k) // the key is gone (an interface removed, say): nothing to restore
				continue
			}
			res.Failed[k] = fmt.Errorf("restoring original value: %w", err)
			continue
		}
		delete(originals, k)
		res.Restored = append(res.Restored, k)
	}
	return res
}

// Read returns a key's current value, whitespace-trimmed.
func (h Host) Read(key string) (string, error) {
	p, err := h.path(key)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("reading sysctl %s: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Write sets a key.
func (h Host) Write(key, value string) error {
	p, err := h.path(key)
	if err != nil {
		return err
	}
	// O_WRONLY without O_CREATE: a key the kernel does not have is an error, never a new file.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("writing sysctl %s: %w", key, err)
	}
	_, werr := f.WriteString(value)
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("writing sysctl %s=%q: %w", key, value, werr)
	}
	if cerr != nil {
		return fmt.Errorf("writing sysctl %s=%q: %w", key, value, cerr)
	}
	return nil
}

// path maps a key to its file. Dots separate components unless the key uses slashes (as
// sysctl(8) allows, for interface names containing dots such as net/ipv4/conf/eth0.20/...).
func (h Host) path(key string) (string, error) {
	rel := key
	if !strings.Contains(key, "/") {
		rel = strings.ReplaceAll(key, ".", "/")
	}
	clean := filepath.Clean(rel)
	if key == "" || filepath.IsAbs(clean) || clean == "." || strings.HasPrefix(clean, "..") {
		return "", fmt.Errorf("sysctl %q: not a kernel parameter name", key)
	}
	return filepath.Join(h.Root, clean), nil
}

// normalize compares multi-field values (such as net.ipv4.tcp_rmem) by their fields, as the
// kernel prints them tab-separated whatever was written.
func normalize(v string) string { return strings.Join(strings.Fields(v), " ") }

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Merge returns the effective sysctls: cluster-wide, then the machine's own on top.
func Merge[V ~string](cluster, machine map[string]V) map[string]string {
	out := map[string]string{}
	for k, v := range cluster {
		out[k] = string(v)
	}
	for k, v := range machine {
		out[k] = string(v)
	}
	return out
}
