package change

import (
	"encoding/json"
	"fmt"
	"strings"

	"liken.dev/liken/api/v1alpha1"
)

// Keep returns desired with the fields whose class keep accepts taken from applied instead:
// the spec a machine has in effect after applying what it can apply now. For example, with
// keep = Staged, Live and RestartK3s fields come from desired and NextBoot and Reboot fields
// stay as this boot runs them.
func Keep(applied, desired Spec, keep func(v1alpha1.FieldClass) bool) (Spec, error) {
	a, err := toTree(applied)
	if err != nil {
		return Spec{}, err
	}
	d, err := toTree(desired)
	if err != nil {
		return Spec{}, err
	}
	for _, fc := range v1alpha1.FieldClasses {
		if !keep(fc) {
			continue
		}
		v, ok := lookup(a, fc.Path)
		setPath(d, fc.Path, v, ok)
	}
	var out Spec
	b, err := json.Marshal(map[string]any{"cluster": d["cluster"].(map[string]any)["spec"], "machine": d["machine"].(map[string]any)["spec"]})
	if err != nil {
		return Spec{}, fmt.Errorf("encoding merged spec: %w", err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return Spec{}, fmt.Errorf("decoding merged spec: %w", err)
	}
	return out, nil
}

func lookup(tree map[string]any, path string) (any, bool) {
	var cur any = tree
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func setPath(tree map[string]any, path string, v any, present bool) {
	parts := strings.Split(path, ".")
	cur := tree
	for _, p := range parts[:len(parts)-1] {
		next, ok := cur[p].(map[string]any)
		if !ok {
			if !present {
				return
			}
			next = map[string]any{}
			cur[p] = next
		}
		cur = next
	}
	last := parts[len(parts)-1]
	if present {
		cur[last] = v
	} else {
		delete(cur, last)
	}
}
