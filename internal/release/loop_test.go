package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// mountedLoopRefused attaches img to a loop device, mounts it, and checks PartitionTarget
// refuses it. Needs root, loop devices and mkfs.ext4 (the host tier).
func mountedLoopRefused(t *testing.T, img string) error {
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Fatalf("losetup (the host tier runs as root): %v", err)
	}
	dev := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", dev).Run()
	mnt := filepath.Join(t.TempDir(), "mnt")
	os.MkdirAll(mnt, 0o755)
	if out, err := exec.Command("mount", dev, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	defer exec.Command("umount", mnt).Run()
	_, err = PartitionTarget{Path: dev, Size: 4 << 20}.Begin()
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a mounted device was opened for writing: %v", err)
	}
	return nil
}
