package initd

import "testing"

func TestParseStat(t *testing.T) {
	for _, tt := range []struct {
		line, name string
		state      byte
		kthread    bool
	}{
		{"1234 (k3s-standin) S 1 1234 1234 0 -1 4194560 120 0 0 0", "k3s-standin", 'S', false},
		{"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0", "kthreadd", 'S', true},
		{"77 (a (weird) name) Z 1 77 77 0 -1 4194564 0 0 0 0", "a (weird) name", 'Z', false},
	} {
		name, st, ok := parseStat(tt.line)
		if !ok || name != tt.name || st.state != tt.state || (st.flags&pfKthread != 0) != tt.kthread {
			t.Errorf("parseStat(%q) = %q %+v %v", tt.line, name, st, ok)
		}
	}
}
