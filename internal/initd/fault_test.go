package initd

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"liken.dev/liken/internal/initramfs"
)

// TestFaultsOnlyInTestBuilds builds liken-init as a normal release and as a release for
// tests: only the test build holds the fault injection (a normal release cannot panic or
// hang on a kernel argument, however it is typed).
func TestFaultsOnlyInTestBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds liken-init twice")
	}
	dir := t.TempDir()
	const marker = "test fault: kernel panic"
	for _, tc := range []struct {
		name string
		tags []string
		want bool
	}{
		{"normal", nil, false},
		{"test", []string{"-tags", initramfs.TestBuildTag}, true},
	} {
		out := filepath.Join(dir, tc.name)
		args := append(append([]string{"build"}, tc.tags...), "-o", out, "liken.dev/liken/cmd/liken-init")
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build (%s): %v\n%s", tc.name, err, b)
		}
		bin, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if got := bytes.Contains(bin, []byte(marker)); got != tc.want {
			t.Errorf("%s build holds the fault injection: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestStandInFaults: a machine's own stand-in fault applies to every boot; a release's only
// to a boot of that release, which is how a VM test plays a release that breaks something
// while the same disk's other slot does not.
func TestStandInFaults(t *testing.T) {
	for _, tc := range []struct {
		cmdline, version, want string
	}{
		{"liken.slot=A", "2026.11.29-001", ""},
		{"liken.test.k3s-fault=slow-start=25s", "2026.11.29-001", "slow-start=25s"},
		{"liken.test.k3s-fault=slow-start=25s liken.test.k3s-fault-release=2026.11.29-002:pods-not-ready", "2026.11.29-001", "slow-start=25s"},
		{"liken.test.k3s-fault=slow-start=25s liken.test.k3s-fault-release=2026.11.29-002:pods-not-ready", "2026.11.29-002", "slow-start=25s,pods-not-ready"},
		{"liken.test.k3s-fault-release=2026.11.29-002:pods-not-ready", "2026.11.29-002", "pods-not-ready"},
		{"liken.test.k3s-fault-release=2026.11.29-002", "2026.11.29-002", ""}, // no fault named
	} {
		if got := standInFaults(initramfs.ParseCmdline(tc.cmdline), tc.version); got != tc.want {
			t.Errorf("standInFaults(%q, %s) = %q; want %q", tc.cmdline, tc.version, got, tc.want)
		}
	}
}
