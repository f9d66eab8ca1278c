package standin

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestMountAsTheKubeletAsks runs the stand-in's mount and umount with the arguments the
// kubelet's mount-utils gives mount(8) and umount(8) (MakeMountArgs): a tmpfs with size and
// mode for a pod's token volume, a read-only bind of it, and umount of each, then umount of
// what is no longer mounted, which must say "not mounted" as the kubelet expects.
func TestMountAsTheKubeletAsks(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounts: needs root")
	}
	dir := t.TempDir()
	vol, ro := filepath.Join(dir, "vol"), filepath.Join(dir, "ro")
	os.Mkdir(vol, 0o755)
	os.Mkdir(ro, 0o755)
	run := func(argv ...string) (int, string) {
		var stderr bytes.Buffer
		code, ok := MountMain(argv[0], argv[1:], &stderr)
		if !ok {
			t.Fatalf("MountMain did not take %s", argv[0])
		}
		return code, stderr.String()
	}
	if code, out := run("mount", "-t", "tmpfs", "-o", "size=1m,mode=0750", "tmpfs", vol); code != 0 {
		t.Fatalf("mount tmpfs: %d %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(ro, syscall.MNT_DETACH); syscall.Unmount(vol, syscall.MNT_DETACH) })
	info, _ := os.ReadFile("/proc/self/mountinfo")
	if !strings.Contains(string(info), " "+vol+" ") || !strings.Contains(string(info), "size=1024k,mode=750") {
		t.Errorf("no tmpfs of 1 MiB, mode 750 on %s in mountinfo:\n%s", vol, info)
	}
	if err := os.WriteFile(filepath.Join(vol, "token"), []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := run("mount", "-o", "bind,ro", vol, ro); code != 0 {
		t.Fatalf("mount -o bind,ro: %d %s", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(ro, "token")); string(b) != "t" {
		t.Errorf("the bind does not show the volume: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(ro, "x"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
		t.Errorf("writing through the read-only bind: %v, want EROFS", err)
	}
	for _, target := range []string{ro, vol} {
		if code, out := run("umount", target); code != 0 {
			t.Errorf("umount %s: %d %s", target, code, out)
		}
	}
	if code, out := run("umount", vol); code == 0 || !strings.Contains(out, "not mounted") {
		t.Errorf("umount of what is not mounted: %d %q, want a failure saying \"not mounted\"", code, out)
	}
	if code, out := run("mount", "--frobnicate", vol); code == 0 || !strings.Contains(out, "--frobnicate") {
		t.Errorf("an unknown option: %d %q", code, out)
	}
}
