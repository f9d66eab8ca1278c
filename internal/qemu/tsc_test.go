package qemu

import (
	"strings"
	"testing"
)

// TestHostTSCkHz: on x86-64 the counter's rate measured twice agrees within 1% (the margin
// Linux's refinement corrects), is a plausible CPU clock, and reaches a TCG machine's kernel
// arguments; elsewhere there is no reading and the arguments keep tsc=reliable alone. Under
// KVM they get nothing.
func TestHostTSCkHz(t *testing.T) {
	a, b := HostTSCkHz(), hostTSCkHz()
	args := InstallArgs(false, "quiet")
	switch {
	case !haveTSC:
		if a != 0 || args != "tsc=reliable quiet" {
			t.Errorf("with no counter to read: rate %d kHz, arguments %q; want 0 and tsc=reliable alone", a, args)
		}
	case a < 200_000 || a > 10_000_000:
		t.Errorf("host TSC measured at %d kHz; want between 200 MHz and 10 GHz", a)
	case (a-b)*100 > a || (b-a)*100 > a:
		t.Errorf("two measurements of the host TSC differ by more than 1%%: %d and %d kHz", a, b)
	case !strings.HasPrefix(args, "tsc=reliable tsc_early_khz=") || !strings.HasSuffix(args, " quiet"):
		t.Errorf("InstallArgs under TCG = %q", args)
	}
	if got := InstallArgs(true, "quiet"); got != "quiet" {
		t.Errorf("InstallArgs under KVM = %q; want the arguments alone", got)
	}
	t.Logf("host TSC: %d kHz, then %d kHz", a, b)
}
