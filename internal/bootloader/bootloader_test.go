package bootloader

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnvRoundTripWithGrubEditenv checks the block against GRUB's own tool both ways.
func TestEnvRoundTripWithGrubEditenv(t *testing.T) {
	p := filepath.Join(t.TempDir(), "grubenv")
	if out, err := exec.Command("grub-editenv", p, "create").CombinedOutput(); err != nil {
		t.Fatalf("grub-editenv: %v %s", err, out)
	}
	if out, err := exec.Command("grub-editenv", p, "set", "default_slot=A", "trial_slot=B", "kernel_args=console=ttyS0 quiet").CombinedOutput(); err != nil {
		t.Fatalf("grub-editenv set: %v %s", err, out)
	}
	b, _ := os.ReadFile(p)
	e, err := ParseEnv(b)
	if err != nil {
		t.Fatal(err)
	}
	if e["default_slot"] != "A" || e["trial_slot"] != "B" || e["kernel_args"] != "console=ttyS0 quiet" {
		t.Errorf("parsed %v", e)
	}
	e["trial_slot"] = ""
	e["default_slot"] = "B"
	out, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != EnvSize {
		t.Fatalf("encoded %d bytes", len(out))
	}
	os.WriteFile(p, out, 0o644)
	list, err := exec.Command("grub-editenv", p, "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(list), "default_slot=B") || !strings.Contains(string(list), "trial_slot=\n") {
		t.Errorf("grub-editenv reads:\n%s", list)
	}
	if _, err := ParseEnv(out[:500]); err == nil {
		t.Errorf("a torn block parsed")
	}
	big := Env{"x": strings.Repeat("y", 2000)}
	if _, err := big.Encode(); err == nil {
		t.Errorf("an oversized block encoded")
	}
}

func TestBuildEFI(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.efi"), filepath.Join(dir, "b.efi")
	for _, p := range []string{a, b} {
		if err := BuildEFI(p, dir); err != nil {
			t.Fatal(err)
		}
	}
	x, _ := os.ReadFile(a)
	y, _ := os.ReadFile(b)
	if len(x) < 100_000 || string(x[:2]) != "MZ" {
		t.Errorf("not a PE image (%d bytes)", len(x))
	}
	if string(x) != string(y) {
		t.Errorf("two builds of the EFI image differ")
	}
}
