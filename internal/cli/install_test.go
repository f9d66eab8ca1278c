package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/install"
)

// installableRelease publishes into a new file:// channel a release install can write: a
// slot image and a boot loader (neither boots; install only streams and checks them). It
// returns the channel's URL and the release's digest.
func installableRelease(t *testing.T, version string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	var files []apirelease.File
	for _, f := range []struct {
		name string
		role apirelease.Role
		data string
	}{{"slot.img", apirelease.RoleSlot, strings.Repeat("slot", 4096)}, {"bootx64.efi", apirelease.RoleBootloader, "not really GRUB"}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.data), 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(f.data))
		files = append(files, apirelease.File{Name: f.name, Size: int64(len(f.data)), SHA256: hex.EncodeToString(sum[:]), Role: f.role})
	}
	d := apirelease.Document{Schema: apirelease.Schema, Version: version, Created: time.Unix(1785000000, 0).UTC(), Files: files}
	b, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, apirelease.DocumentName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	channel := t.TempDir()
	code, out, errOut := run(t, "release", "publish", "--channel", channel, dir, "-o", "json")
	var pub releaseResult
	if code != exitOK || json.Unmarshal([]byte(out), &pub) != nil {
		t.Fatalf("publish: exit %d %s\n%s", code, errOut, out)
	}
	return "file://" + channel, pub.Digest
}

// TestInstallLayerOnlyBinds: `liken install --layer-only` binds the newer layer as install
// binds a disk. A disk installed from a layer of one server, not bound, is refused a layer of
// three servers (it would carry all their private keys) until --machine names one; from then
// on the disk is that machine's: the next --layer-only keeps it so without --machine and
// refuses another machine. The disk is read back after each step.
func TestInstallLayerOnlyBinds(t *testing.T) {
	dir := t.TempDir()
	cluster := filepath.Join(examples, "cluster.yaml")
	one := filepath.Join(dir, "one")
	if err := os.MkdirAll(one, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(examples, "server-1.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(one, "server-1.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	id := filepath.Join(dir, "identity")
	first, newer := filepath.Join(dir, "first"), filepath.Join(dir, "newer")
	if code, _, errOut := run(t, "layer", "--cluster", cluster, "--machines", one, "--out", first, "--identity", id, "--new-identity"); code != exitOK {
		t.Fatalf("layer of server-1 alone: %s", errOut)
	}
	if code, _, errOut := run(t, "layer", "--cluster", cluster, "--machines", examples, "--out", newer, "--identity", id); code != exitOK {
		t.Fatalf("layer of the examples: %s", errOut)
	}
	channel, pin := installableRelease(t, "2026.07.20-001")
	img := filepath.Join(dir, "server-1.img")
	// Without --machine: the layer holds server-1's credential alone.
	if code, out, errOut := run(t, "install", "--channel", channel, "--pin", pin, "--layer", filepath.Join(first, "server.layer"),
		"--disk", img, "--size", "1200M", "--slot-size", "8"); code != exitOK {
		t.Fatalf("install: exit %d %s\n%s", code, errOut, out)
	}
	layerOnly := func(args ...string) (int, string, string) {
		return run(t, append([]string{"install", "--layer-only", "--layer", filepath.Join(newer, "server.layer"), "--disk", img}, args...)...)
	}
	holds := func(step string, machines []string, bound string) {
		t.Helper()
		idx, err := install.InstalledLayer(img)
		if err != nil {
			t.Fatalf("%s: reading the disk's layer: %v", step, err)
		}
		if strings.Join(idx.Machines, ",") != strings.Join(machines, ",") || idx.Machine != bound {
			t.Errorf("%s: the disk's layer holds the credentials of %v, bound to %q; want %v, bound to %q", step, idx.Machines, idx.Machine, machines, bound)
		}
	}
	holds("install", []string{"server-1"}, "")

	code, _, errOut := layerOnly()
	if code != exitFailed || !strings.Contains(errOut, "holds the credentials of 3 machines (server-1, server-2, server-3)") || !strings.Contains(errOut, "give --machine server-1") {
		t.Errorf("--layer-only of three servers' layer onto a disk not bound: exit %d, %s", code, errOut)
	}
	holds("refused", []string{"server-1"}, "")

	code, out, errOut := layerOnly("--machine", "server-1", "-o", "json")
	var res install.Result
	if code != exitOK || json.Unmarshal([]byte(out), &res) != nil || res.Machine != "server-1" || !strings.HasPrefix(res.LayerDigest, "sha256:") {
		t.Fatalf("--layer-only --machine server-1: exit %d %s\n%s", code, errOut, out)
	}
	holds("--machine server-1", []string{"server-1"}, "server-1")

	code, out, errOut = layerOnly()
	if code != exitOK || !strings.Contains(out, "for machine server-1") {
		t.Errorf("--layer-only onto a disk bound to server-1: exit %d %s\n%s", code, errOut, out)
	}
	holds("again", []string{"server-1"}, "server-1")

	code, _, errOut = layerOnly("--machine", "server-2")
	if code != exitFailed || !strings.Contains(errOut, "was installed for machine server-1") {
		t.Errorf("--layer-only --machine server-2 onto server-1's disk: exit %d, %s", code, errOut)
	}
	holds("another machine", []string{"server-1"}, "server-1")
}
