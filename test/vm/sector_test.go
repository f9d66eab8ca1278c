package vm

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// installTarget makes the image file of a machine's disk, sizeMiB large, and returns what to
// install onto: the file (with its size for install), or, for 4096-byte sectors, a loop
// device of that sector size over it (size 0: install sizes the device), which done
// detaches. bootUEFI boots the file with the sector size its GPT was written for.
func installTarget(t *testing.T, path string, sizeMiB, sectorSize int) (target string, size int, done func()) {
	t.Helper()
	if sectorSize == 0 || sectorSize == 512 {
		return path, sizeMiB, func() {}
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, int64(sizeMiB)<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--sector-size", fmt.Sprint(sectorSize), path).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup --sector-size %d: %v: %s", sectorSize, err, out)
	}
	loop := strings.TrimSpace(string(out))
	var once sync.Once
	done = func() { once.Do(func() { exec.Command("losetup", "-d", loop).Run() }) }
	t.Cleanup(done)
	return loop, 0, done
}
