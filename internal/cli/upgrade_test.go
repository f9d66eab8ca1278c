package cli

import (
	"reflect"
	"testing"
)

// TestSettle: what `liken upgrade` reports when it wrote again after a failed try: a change
// the last try found made is reported as this command's, with the lost answer said; a write
// refused for a conflict, or never made, is not taken for one; an object that ran the
// version before any try stays "nothing changed".
func TestSettle(t *testing.T) {
	already := []versionChange{{Object: "Cluster", From: "2026.08.03-001", To: "2026.08.03-001"}}
	tests := []struct {
		name    string
		earlier map[string]versionChange
		final   []versionChange
		want    []versionChange
	}{
		{"no failed try", nil, already, already},
		{"the Cluster's write answer lost", map[string]versionChange{"Cluster": {Object: "Cluster", From: "2026.07.20-001", To: "2026.08.03-001", Pinned: true, unanswered: true}},
			already, []versionChange{{Object: "Cluster", From: "2026.07.20-001", To: "2026.08.03-001", Pinned: true, AnswerLost: true}}},
		{"a Machine written and answered before another's write failed",
			map[string]versionChange{"Machine a": {Object: "Machine a", From: "2026.07.20-001", Inherited: true, To: "2026.08.03-001", written: true}},
			[]versionChange{{Object: "Machine a", From: "2026.08.03-001", To: "2026.08.03-001"}, {Object: "Machine b", From: "2026.07.20-001", To: "2026.08.03-001"}},
			[]versionChange{{Object: "Machine a", From: "2026.07.20-001", Inherited: true, To: "2026.08.03-001"}, {Object: "Machine b", From: "2026.07.20-001", To: "2026.08.03-001"}}},
		{"an earlier try for another version", map[string]versionChange{"Cluster": {Object: "Cluster", From: "2026.07.20-001", To: "2026.09.01-001", unanswered: true}},
			already, already},
		{"nothing to change before either", map[string]versionChange{"Cluster": {Object: "Cluster", From: "2026.08.03-001", To: "2026.08.03-001", unanswered: true}},
			already, already},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := settle(tt.earlier, tt.final); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("settle:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
