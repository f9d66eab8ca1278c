package initd

import (
	"testing"
	"time"
)

// TestTrialKernelArguments: the trial's bounds from the kernel command line, whole seconds
// above zero; anything else leaves the default (init's ten minutes; the agent's own peer
// wait, which no --peer-wait flag then overrides).
func TestTrialKernelArguments(t *testing.T) {
	for _, tc := range []struct {
		cmd      map[string]string
		deadline time.Duration
		peerWait time.Duration
	}{
		{nil, 10 * time.Minute, 0},
		{map[string]string{"liken.trial.deadline": "540", "liken.trial.peerwait": "30"}, 9 * time.Minute, 30 * time.Second},
		{map[string]string{"liken.trial.deadline": "20m", "liken.trial.peerwait": "2m"}, 10 * time.Minute, 0},
		{map[string]string{"liken.trial.deadline": "0", "liken.trial.peerwait": "-5"}, 10 * time.Minute, 0},
	} {
		s := &system{cmd: tc.cmd}
		if got := s.trialDeadline(); got != tc.deadline {
			t.Errorf("%v: trial deadline %s; want %s", tc.cmd, got, tc.deadline)
		}
		if got := s.peerWait(); got != tc.peerWait {
			t.Errorf("%v: peer wait %s; want %s", tc.cmd, got, tc.peerWait)
		}
	}
}
