package standin

import (
	"strings"
	"testing"
	"time"
)

func TestParseFaults(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    faults
		wantErr string
	}{
		{in: "", want: faults{}},
		{in: "never-ready", want: faults{neverReady: true}},
		{in: "slow-start=25s", want: faults{slowStart: 25 * time.Second}},
		// A machine's own fault and its release's, joined by init.
		{in: "slow-start=25s,pods-not-ready", want: faults{slowStart: 25 * time.Second, podsNotReady: true}},
		{in: "crash-after=1m, late-boot-id=40s", want: faults{crashAfter: time.Minute, lateBootID: 40 * time.Second}},
		{in: "slow-start=soon", wantErr: `fault slow-start: "soon" is not a positive duration`},
		{in: "crash-after=-1s", wantErr: "not a positive duration"},
		{in: "never-ready=1s", wantErr: "takes no value"},
		{in: "pods-not-ready,melt", wantErr: `unknown fault "melt"`},
	} {
		got, err := parseFaults(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseFaults(%q): error %v; want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseFaults(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
