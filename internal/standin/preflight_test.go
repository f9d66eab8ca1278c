package standin

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/host/preflight"
)

// TestDataDirAsK3s: the stand-in's data directory is laid out as k3s's, so the same PATH
// wiring decides: through liken's links each iptables name reaches a program; without them
// it reaches the detection script, which needs a shell.
func TestDataDirAsK3s(t *testing.T) {
	dataDir := t.TempDir()
	hash, err := unpackDataDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unpackDataDir(dataDir); err != nil {
		t.Fatalf("unpacking again (the next boot): %v", err)
	}
	if target, err := os.Readlink(filepath.Join(dataDir, "data", "current")); err != nil || target != hash {
		t.Fatalf("data/current -> %q (%v), want %q", target, err, hash)
	}
	links := t.TempDir()
	for name, target := range k3s.IptablesLinks(dataDir) {
		if err := os.Symlink(target, filepath.Join(links, name)); err != nil {
			t.Fatal(err)
		}
	}
	with := k3s.ProcessPATH(dataDir, hash, links+":/usr/bin", false)
	if err := (preflight.Host{PATH: with}).Iptables(); err != nil {
		t.Errorf("with liken's links: %v", err)
	}
	without := k3s.ProcessPATH(dataDir, hash, "/usr/bin", false)
	if err := (preflight.Host{PATH: without}).Iptables(); !errors.Is(err, preflight.ErrScript) {
		t.Errorf("without liken's links: %v, want %v", err, preflight.ErrScript)
	}
	for _, role := range []string{"k3s-server", "k3s-agent"} {
		if _, err := os.Stat(filepath.Join(dataDir, "data", hash, "bin", role)); err != nil {
			t.Errorf("bin/%s: %v", role, err)
		}
	}
}

func TestIptablesMainSaysItIsAStandIn(t *testing.T) {
	var out strings.Builder
	if code, ok := IptablesMain("/usr/libexec/liken/iptables/iptables-save", &out); !ok || code == 0 {
		t.Fatalf("run as iptables-save: code %d, handled %v", code, ok)
	}
	if _, ok := IptablesMain("/usr/bin/k3s", &out); ok {
		t.Fatal("run as k3s: taken for iptables")
	}
}

func TestSwapCheck(t *testing.T) {
	for _, tc := range []struct {
		on   bool
		args any
		ok   bool
	}{
		{false, nil, true},
		{true, nil, false},
		{true, []any{"max-pods=50"}, false},
		{true, []any{"fail-swap-on=false"}, true},
	} {
		c := &Config{Values: map[string]any{}}
		if tc.args != nil {
			c.Values["kubelet-arg"] = tc.args
		}
		if err := c.swapCheck(tc.on, io.Discard); (err == nil) != tc.ok {
			t.Errorf("swap on %v, kubelet-arg %v: %v", tc.on, tc.args, err)
		}
	}
}
