package initd

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestMachineIDLasts: the first boot makes a machine ID in systemd's form; every later boot
// reads the same one; a damaged one is made again.
func TestMachineIDLasts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "var/lib/liken/machine-id")
	id, made, err := machineID(p)
	if err != nil || !made {
		t.Fatalf("first boot: %q made %v: %v", id, made, err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}$`).MatchString(id) {
		t.Errorf("machine ID %q is not a version 4 ID in 32 hex digits", id)
	}
	again, made, err := machineID(p)
	if err != nil || made || again != id {
		t.Fatalf("second boot: %q made %v: %v, want %q kept", again, made, err, id)
	}
	os.Chmod(p, 0o644)
	os.WriteFile(p, []byte("torn"), 0o644)
	fresh, made, err := machineID(p)
	if err != nil || !made || fresh == id || len(fresh) != 32 {
		t.Fatalf("damaged: %q made %v: %v", fresh, made, err)
	}
}

func TestWriteHosts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	if err := writeHosts(p, "node-1"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	for _, want := range []string{"127.0.0.1\tlocalhost\n", "::1\tlocalhost", "127.0.1.1\tnode-1\n"} {
		if !regexp.MustCompile(regexp.QuoteMeta(want)).Match(b) {
			t.Errorf("/etc/hosts lacks %q:\n%s", want, b)
		}
	}
}
