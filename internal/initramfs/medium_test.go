package initramfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestISOVolume reads the volume name of an ISO 9660 image as xorriso writes the installer
// image's, and none from a file that is not one.
func TestISOVolume(t *testing.T) {
	if _, err := exec.LookPath("xorriso"); err != nil {
		t.Fatal("xorriso (Debian package xorriso) is missing: hack/deps.sh installs it")
	}
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "liken"), 0o755)
	os.WriteFile(filepath.Join(tree, "liken", "installer.json"), []byte("{}"), 0o644)
	iso := filepath.Join(dir, "i.iso")
	if out, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", InstallerVolume, "-o", iso, tree).CombinedOutput(); err != nil {
		t.Fatalf("xorriso: %v %s", err, out)
	}
	if got := isoVolume(iso); got != InstallerVolume {
		t.Errorf("the ISO's volume: %q", got)
	}
	other := filepath.Join(dir, "zeros")
	os.WriteFile(other, make([]byte, 64<<10), 0o644)
	if got := isoVolume(other); got != "" {
		t.Errorf("a file of zeros has volume %q", got)
	}
	if got := isoVolume(filepath.Join(dir, "missing")); got != "" {
		t.Errorf("a missing device has volume %q", got)
	}
}
