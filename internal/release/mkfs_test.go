package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"liken.dev/liken/internal/host/datadisk"
)

// TestMkfsToolsRunInTheImageAlone stages the mkfs tools as the root image has them and runs
// each, chrooted into the stage (nothing but what was staged), on an image file; e2fsck and
// fsck.fat on the host then find the file systems clean.
func TestMkfsToolsRunInTheImageAlone(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chroot: needs root")
	}
	stage := t.TempDir()
	if err := stageMkfsTools(stage, stager(stage)); err != nil {
		t.Fatal(err)
	}
	v, _ := os.ReadFile(filepath.Join(stage, datadisk.ToolsDir, "versions"))
	if !strings.Contains(string(v), "e2fsprogs") || !strings.Contains(string(v), "dosfstools") {
		t.Errorf("versions: %s", v)
	}
	tools := datadisk.ImageTools()
	for _, tc := range []struct {
		argv  []string
		check []string
	}{
		{append(tools.Mke2fs, "-q", "-F", "-t", "ext4", "-L", "data", "/disk.img"), []string{"e2fsck", "-fn"}},
		{append(tools.MkfsFat, "-n", "DATA", "/disk.img"), []string{"fsck.fat", "-n"}},
	} {
		img := filepath.Join(stage, "disk.img")
		os.Remove(img)
		os.WriteFile(img, nil, 0o644)
		if err := os.Truncate(img, 64<<20); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: stage}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/nonexistent"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v in the stage alone: %v: %s", tc.argv, err, out)
		}
		if out, err := exec.Command(tc.check[0], append(tc.check[1:], img)...).CombinedOutput(); err != nil {
			t.Errorf("%v after %s: %v: %s", tc.check, filepath.Base(tc.argv[len(tools.Mke2fs)-1]), err, out)
		}
	}
}
