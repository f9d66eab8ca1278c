package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "f")
	if err := Write(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	if string(b) != "two" || st.Mode().Perm() != 0o600 {
		t.Errorf("content %q mode %v, want two 0600", b, st.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestWriteIfChanged(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	for i, tc := range []struct {
		data  string
		perm  os.FileMode
		wrote bool
	}{{"a", 0o644, true}, {"a", 0o644, false}, {"b", 0o644, true}, {"b", 0o600, true}, {"b", 0o600, false}} {
		wrote, err := WriteIfChanged(p, []byte(tc.data), tc.perm)
		if err != nil {
			t.Fatal(err)
		}
		if wrote != tc.wrote {
			t.Errorf("step %d: wrote = %v, want %v", i, wrote, tc.wrote)
		}
	}
}

func TestSymlinkReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "current")
	for _, target := range []string{"a", "b"} {
		if err := Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if got, err := os.Readlink(p); err != nil || got != target {
			t.Fatalf("current -> %q (%v), want %q", got, err, target)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left beside the link: %v", entries)
	}
}
