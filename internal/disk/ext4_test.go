package disk

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/internal/disk/looptest"
)

// TestExt4Clean reads the superblock of a real ext4 image: clean when made, not clean
// while mounted (a copy taken then is what a power cut leaves), clean once unmounted.
func TestExt4Clean(t *testing.T) {
	looptest.Require(t, "mkfs.ext4")
	dir := t.TempDir()
	img := filepath.Join(dir, "state.img")
	if out, err := exec.Command("truncate", "-s", "64M", img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v %s", err, out)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	if clean, why, err := Ext4Clean(img, 0); err != nil || !clean {
		t.Fatalf("a new file system: clean %v (%s) %v", clean, why, err)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -o loop: %v %s", err, out)
	}
	os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644)
	exec.Command("sync").Run()
	cut := filepath.Join(dir, "cut.img")
	if out, err := exec.Command("cp", "--sparse=always", img, cut).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v %s", err, out)
	}
	if clean, why, err := Ext4Clean(cut, 0); err != nil || clean || !strings.Contains(why, "journal needs recovery") {
		t.Errorf("a copy taken while mounted: clean %v (%s) %v", clean, why, err)
	}
	if clean, why, err := Ext4Clean(img, 0); err != nil || !clean {
		t.Errorf("after umount: clean %v (%s) %v", clean, why, err)
	}
	if _, _, err := Ext4Clean(filepath.Join(dir, "mnt"), 0); err == nil {
		t.Error("a directory read as a superblock")
	}
}
