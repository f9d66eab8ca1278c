package qemu

import (
	"runtime"
	"strings"
	"testing"
)

// TestHostTSCkHz: the counter's rate measured twice agrees within 1% (the margin Linux's
// refinement corrects), is a plausible CPU clock, and reaches the install arguments.
func TestHostTSCkHz(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the time stamp counter is read on x86-64 only")
	}
	a := HostTSCkHz()
	HostTSCkHz2 := measureAgain(t)
	if a < 200_000 || a > 10_000_000 {
		t.Fatalf("host TSC measured at %d kHz; want between 200 MHz and 10 GHz", a)
	}
	if d := a - HostTSCkHz2; d*100 > a || -d*100 > a {
		t.Errorf("two measurements of the host TSC differ by more than 1%%: %d and %d kHz", a, HostTSCkHz2)
	}
	if got := InstallArgs(false, "quiet"); !strings.Contains(got, "tsc=reliable tsc_early_khz=") || !strings.HasSuffix(got, " quiet") {
		t.Errorf("InstallArgs under TCG = %q", got)
	}
	if got := InstallArgs(true, "quiet"); got != "quiet" {
		t.Errorf("InstallArgs under KVM = %q; want the arguments alone", got)
	}
	t.Logf("host TSC: %d kHz, then %d kHz", a, HostTSCkHz2)
}

func measureAgain(t *testing.T) int64 {
	t.Helper()
	c0 := rdtsc()
	c1 := rdtsc()
	if c1 < c0 {
		t.Fatalf("the counter went back: %d then %d", c0, c1)
	}
	return hostTSCkHz()
}
