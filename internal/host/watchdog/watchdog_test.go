package watchdog

import (
	"liken.dev/liken/api/v1alpha1"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestInterval(t *testing.T) {
	for _, tc := range []struct{ timeout, want time.Duration }{
		{60 * time.Second, 15 * time.Second},
		{8 * time.Second, 2 * time.Second},
		{0, time.Second}, // unknown: the driver would not say
	} {
		if got := interval(tc.timeout); got != tc.want {
			t.Errorf("interval(%s) = %s, want %s", tc.timeout, got, tc.want)
		}
	}
}

// TestArmOnADeviceThatRefusesTheTimeout: when the driver takes no timeout and tells none
// (here a plain file, where every ioctl fails), the pings do not follow the timeout asked
// for, which the driver may not have; they come every second, and the note says why.
func TestArmOnADeviceThatRefusesTheTimeout(t *testing.T) {
	p := filepath.Join(t.TempDir(), "watchdog")
	os.WriteFile(p, nil, 0o600)
	d, err := Arm(p, 120*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Disarm()
	if d.Timeout != 0 || d.Note == "" || interval(d.Timeout) != time.Second {
		t.Errorf("timeout %s, note %q", d.Timeout, d.Note)
	}
	d.Disarm()
	if b, _ := os.ReadFile(p); string(b) != "V" {
		t.Errorf("Disarm wrote %q, want the magic character", b)
	}
	d.HandOver() // after Disarm: nothing more, no panic
}

func TestFeeding(t *testing.T) {
	d := &Dog{done: make(chan struct{})}
	d.fed.Store(true)
	now := time.Unix(1000, 0)
	if !d.feeding(now) {
		t.Fatal("a new watchdog is not fed")
	}
	d.PingUntil(now.Add(2 * time.Minute))
	if !d.feeding(now.Add(time.Minute)) || d.feeding(now.Add(3*time.Minute)) {
		t.Error("pings do not stop at the shutdown's deadline")
	}
	d.Starve()
	if d.feeding(now) {
		t.Error("a starved watchdog is fed")
	}
	var nilDog *Dog
	nilDog.Starve()
	nilDog.PingUntil(now)
	nilDog.HandOver()
	nilDog.Disarm()
}

// TestSoftdogIdentity: the watchdog package and the API name softdog alike.
func TestSoftdogIdentity(t *testing.T) {
	if SoftdogIdentity != v1alpha1.SoftwareWatchdog || !Software(v1alpha1.SoftwareWatchdog) {
		t.Errorf("softdog is %q here and %q in the API", SoftdogIdentity, v1alpha1.SoftwareWatchdog)
	}
}
