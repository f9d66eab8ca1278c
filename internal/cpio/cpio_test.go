package cpio

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestArchive writes an archive and extracts it with GNU cpio.
func TestArchive(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, e := range []Entry{
		{Name: "etc", Mode: ModeDir | 0o755},
		{Name: "etc/hello", Mode: ModeRegular | 0o644, Data: []byte("hi\n")},
		{Name: "init", Mode: ModeRegular | 0o755, Data: []byte("#!x")},
		{Name: "link", Mode: ModeSymlink | 0o777, Data: []byte("init")},
		{Name: "dev", Mode: ModeDir | 0o755},
		{Name: "dev/console", Mode: ModeChar | 0o600, RdevMajor: 5, RdevMinor: 1},
	} {
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if len(b)%4 != 0 || !bytes.HasPrefix(b, []byte("070701")) || !bytes.Contains(b, []byte("TRAILER!!!")) {
		t.Fatalf("not a newc archive")
	}
	// GNU cpio (hack/deps.sh installs it) must read what the kernel will read.
	dir := t.TempDir()
	cmd := exec.Command("cpio", "-i", "--no-absolute-filenames", "--quiet")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(b)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -i: %v %s", err, out)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "etc", "hello"))
	if string(got) != "hi\n" {
		t.Errorf("etc/hello = %q", got)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "link")); l != "init" {
		t.Errorf("link → %q", l)
	}
	// Same entries, same bytes.
	var again bytes.Buffer
	w2 := NewWriter(&again)
	w2.Write(Entry{Name: "etc", Mode: ModeDir | 0o755})
	w2.Close()
	var again2 bytes.Buffer
	w3 := NewWriter(&again2)
	w3.Write(Entry{Name: "etc", Mode: ModeDir | 0o755})
	w3.Close()
	if !bytes.Equal(again.Bytes(), again2.Bytes()) {
		t.Error("two archives of the same entries differ")
	}
}
