package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/internal/release"
	"liken.dev/liken/test/report"
	"liken.dev/liken/test/vmtest"
)

// runGoTestsInVM builds pkg's tests as a static binary and runs those matching run as PID 1
// of a machine booted with the release's Debian kernel and the modules named (and what they
// need), through test/vmtest. It returns the console, and fails the test unless the tests
// ran and passed.
func runGoTestsInVM(t *testing.T, pkg, run string, modules ...string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	source := filepath.Join(filepath.Dir(file), "..", "..")
	dir := t.TempDir()
	bin := filepath.Join(dir, "tests")
	cmd := exec.Command("go", "test", "-c", "-o", bin, pkg)
	cmd.Dir = source
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s's tests: %v\n%s", pkg, err, out)
	}
	cache, _ := os.UserCacheDir()
	deb, err := release.FindKernelDeb("", filepath.Join(cache, "liken", "kernel"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := release.UnpackKernelDeb(deb, filepath.Join(dir, "kernel"))
	if err != nil {
		t.Fatal(err)
	}
	init, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	initrd, err := release.Initramfs(k, init, modules, map[string][]byte{"etc/liken/kernel-release": []byte(k.Version + "\n")})
	if err != nil {
		t.Fatal(err)
	}
	initrdPath := filepath.Join(dir, "initrd.img")
	if err := os.WriteFile(initrdPath, initrd, 0o644); err != nil {
		t.Fatal(err)
	}
	// After "--" the kernel gives the words to init: the test binary's flags.
	v := bootWith(t, Options{Kernel: k.Vmlinuz(), Initrd: initrdPath, MemoryMiB: 512,
		Append: "console=ttyS0 panic=-1 -- -test.v -test.run=" + run})
	expect(t, v, vmtest.ExitMarker, 5*time.Minute)
	if _, err := v.Wait(30 * time.Second); err != nil {
		t.Errorf("after the tests: %v", err)
	}
	console := v.Console()
	if !strings.Contains(console, vmtest.ExitMarker+"0") {
		t.Errorf("%s's tests failed in the VM:\n%s", pkg, console)
	}
	return console
}

// TestNetworkPortsInVM runs internal/host/network's bond and VLAN tests, which this host's
// kernel may not run (no bonding, no 802.1Q), with the release's kernel: an active-backup
// bond fails over when its active member loses its link; VLAN 100 reaches its own peer and
// not VLAN 200's.
func TestNetworkPortsInVM(t *testing.T) {
	vmTest(t)
	start := time.Now()
	console := runGoTestsInVM(t, "./internal/host/network/", "^(TestBondFailsOver|TestVLANCarriesItsOwnTraffic)$",
		"bonding", "8021q", "veth", "bridge")
	for _, name := range []string{"TestBondFailsOver", "TestVLANCarriesItsOwnTraffic"} {
		if !strings.Contains(console, "--- PASS: "+name) {
			t.Errorf("%s did not pass in the VM (a skip is a failure here)", name)
		}
	}
	if line := consoleLine(console, "active member "); line != "" {
		report.Line("bond and VLAN tests in a VM with the release's kernel (%s): %s", time.Since(start).Round(time.Second), line)
	}
}
