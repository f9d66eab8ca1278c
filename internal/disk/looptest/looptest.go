// Package looptest gives host tests real block devices: image files attached as loop
// devices. Run as root (as CI runs the suite), a test that cannot attach one fails: a skip
// there would hide that the proof did not run. Only LIKEN_TEST_SKIP_LOOP=1, set on purpose,
// turns those tests into skips; as another user they skip, since loop devices need root.
package looptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// SkipEnv, set to 1, skips the tests that need loop devices even as root.
const SkipEnv = "LIKEN_TEST_SKIP_LOOP"

// Require skips t unless it can attach loop devices and mount (root), and checks that the
// tools it names are on PATH (hack/deps.sh installs them): a missing tool fails as root.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	if os.Getenv(SkipEnv) == "1" {
		t.Skipf("%s=1: loop-device tests are skipped", SkipEnv)
	}
	if os.Getuid() != 0 {
		t.Skipf("attaches loop devices and mounts: needs root (CI runs as root; %s=1 skips there)", SkipEnv)
	}
	for _, tool := range append([]string{"losetup"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (hack/deps.sh installs it; %s=1 skips these tests)", tool, err, SkipEnv)
		}
	}
}

// Image makes a sparse image file of size bytes in a temporary directory.
func Image(t testing.TB, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	return img
}

// Attach attaches img as a loop device of sector-byte sectors (0: the default, 512) with
// partition scanning; the cleanup unmounts what is mounted from it and detaches it.
func Attach(t testing.TB, img string, sector int) string {
	t.Helper()
	Require(t)
	args := []string{"--find", "--show", "--partscan"}
	if sector > 0 {
		args = append(args, "--sector-size", strconv.Itoa(sector))
	}
	out, err := exec.Command("losetup", append(args, img)...).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		UnmountFrom(dev)
		exec.Command("losetup", "-d", dev).Run()
	})
	return dev
}

// UnmountFrom unmounts every mount of dev and of its partitions (detaching one that stays
// busy), the last mounted first, as a shutdown would.
func UnmountFrom(dev string) {
	b, _ := os.ReadFile("/proc/self/mounts")
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- { // the last mounted first
		f := strings.Fields(lines[i])
		if len(f) > 1 && (f[0] == dev || strings.HasPrefix(f[0], dev+"p")) {
			if unix.Unmount(f[1], 0) != nil {
				unix.Unmount(f[1], unix.MNT_DETACH)
			}
		}
	}
}
