// Package change compares what a machine has applied with what its Cluster and Machine ask
// for, field by field through the change-class table (api/v1alpha1/classes.go), and says
// how each difference must be applied. It also defines the canonical form and hash of a
// pending change set, to which reboot approvals bind.
package change

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"liken.dev/liken/api/v1alpha1"
)

// Spec is everything a machine is asked to be: the Cluster's spec and its own Machine's.
type Spec struct {
	Cluster v1alpha1.ClusterSpec `json:"cluster"`
	Machine v1alpha1.MachineSpec `json:"machine"`
}

// Change is one field whose desired value differs from the applied one.
type Change struct {
	// Field is the class-table path, such as "machine.spec.network".
	Field string
	Class v1alpha1.ChangeClass
	// ServersOnly is copied from the class table: only servers' k3s files depend on it.
	ServersOnly bool
	// From and To are the canonical JSON of the applied and desired values; "" when absent.
	From, To string
}

// Diff returns the differences between applied and desired, one per class-table entry whose
// value differs, in table order. A field's value excludes deeper entries, so a nested entry
// with a class of its own is reported separately.
func Diff(applied, desired Spec) ([]Change, error) {
	a, err := toTree(applied)
	if err != nil {
		return nil, err
	}
	d, err := toTree(desired)
	if err != nil {
		return nil, err
	}
	var out []Change
	for _, fc := range v1alpha1.FieldClasses {
		from, err := valueAt(a, fc.Path)
		if err != nil {
			return nil, err
		}
		to, err := valueAt(d, fc.Path)
		if err != nil {
			return nil, err
		}
		if from != to {
			out = append(out, Change{Field: fc.Path, Class: fc.Class, ServersOnly: fc.ServersOnly, From: from, To: to})
		}
	}
	return out, nil
}

// toTree renders s as nested maps keyed like the class table: {"cluster": {"spec": ...},
// "machine": {"spec": ...}}.
func toTree(s Spec) (map[string]any, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding spec: %w", err)
	}
	var flat map[string]any
	if err := json.Unmarshal(b, &flat); err != nil {
		return nil, fmt.Errorf("decoding spec: %w", err)
	}
	return map[string]any{
		"cluster": map[string]any{"spec": flat["cluster"]},
		"machine": map[string]any{"spec": flat["machine"]},
	}, nil
}

// valueAt returns the canonical JSON of the value at path, without the children that have
// class-table entries of their own; "" when the value is absent or empty.
func valueAt(tree map[string]any, path string) (string, error) {
	var cur any = tree
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", nil
		}
		cur = m[p]
	}
	cur = withoutOwnedChildren(cur, path)
	if isEmpty(cur) {
		return "", nil
	}
	// encoding/json sorts map keys, which makes this canonical.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(cur); err != nil {
		return "", fmt.Errorf("encoding %s: %w", path, err)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

func withoutOwnedChildren(v any, path string) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := map[string]any{}
	for k, child := range m {
		p := path + "." + k
		if fc, ok := v1alpha1.ClassOf(p); ok && fc.Path == p {
			continue
		}
		out[k] = withoutOwnedChildren(child, p)
	}
	return out
}

func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case map[string]any:
		for _, c := range x {
			if !isEmpty(c) {
				return false
			}
		}
		return true
	case []any:
		return len(x) == 0
	case string:
		return x == ""
	}
	return false
}

// Staged reports whether a class waits for a boot (NextBoot) or a reboot (Reboot).
func Staged(c v1alpha1.ChangeClass) bool { return c == v1alpha1.NextBoot || c == v1alpha1.Reboot }

// PendingHash is the identity of a pending set, to which an approval binds. Its canonical
// form is one line per entry, sorted by field:
//
//	<field> TAB <class> TAB <from> TAB <to> LF
//
// (from and to as in status.pending; "since" is left out so the hash names the content of
// the set, not when it was first seen). The hash is "sha256:" and the lowercase hex SHA-256
// of those bytes. An empty set has the empty string as its hash.
func PendingHash(p []v1alpha1.PendingChange) string {
	if len(p) == 0 {
		return ""
	}
	s := append([]v1alpha1.PendingChange(nil), p...)
	sort.Slice(s, func(i, j int) bool { return s[i].Field < s[j].Field })
	h := sha256.New()
	for _, e := range s {
		fmt.Fprintf(h, "%s\t%s\t%s\t%s\n", e.Field, e.Class, e.From, e.To)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
