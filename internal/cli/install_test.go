package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
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
	channel := t.TempDir()
	return "file://" + channel, installableReleaseIn(t, channel, version, "")
}

// installableReleaseIn publishes such a release into channel, signed with the keys in keys
// when given, and returns its digest.
func installableReleaseIn(t *testing.T, channel, version, keys string) string {
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
	args := []string{"release", "publish", "--channel", channel, dir, "-o", "json"}
	if keys != "" {
		args = append(args, "--keys", keys)
	}
	code, out, errOut := run(t, args...)
	var pub releaseResult
	if code != exitOK || json.Unmarshal([]byte(out), &pub) != nil {
		t.Fatalf("publish: exit %d %s\n%s", code, errOut, out)
	}
	return pub.Digest
}

// TestInstallVerifiesTheChannel: `liken install` writes only a release the channel's keys
// signed, checked from the root the layer's Cluster names (or --trusted-root); a release
// put into the channel without its keys is refused, and the image it would have written
// is not left behind; a layer whose Cluster names no root is refused unless the operator
// takes the channel unsigned, which install says loudly.
func TestInstallVerifiesTheChannel(t *testing.T) {
	dir := t.TempDir()
	channel, keys := filepath.Join(dir, "channel"), filepath.Join(dir, "keys")
	code, out, errOut := run(t, "release", "keys", "init", "--channel", channel, "--keys", keys, "-o", "json")
	var init keysResult
	if code != exitOK || json.Unmarshal([]byte(out), &init) != nil {
		t.Fatalf("keys init: exit %d\n%s%s", code, out, errOut)
	}
	signed := installableReleaseIn(t, channel, "2026.08.10-001", keys)
	// One put into the channel by whoever controls it, without the keys: not signed.
	elsewhere := t.TempDir()
	other := installableReleaseIn(t, elsewhere, "2026.08.10-002", "")
	if err := os.CopyFS(filepath.Join(channel, "2026.08.10-002"), os.DirFS(filepath.Join(elsewhere, "2026.08.10-002"))); err != nil {
		t.Fatal(err)
	}
	v2 := []string{"--version", "2026.08.10-002"} // not in the channel's index
	layers := func(name, edit string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(examples, "cluster.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		src := regexp.MustCompile(`(?m)^  channelRoot: .*$`).ReplaceAllString(string(b), edit)
		d := filepath.Join(dir, name)
		machines := filepath.Join(d, "machines")
		if err := os.MkdirAll(machines, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "cluster.yaml"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := os.ReadFile(filepath.Join(examples, "server-1.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(machines, "server-1.yaml"), m, 0o644); err != nil {
			t.Fatal(err)
		}
		if code, _, errOut := run(t, "layer", "--cluster", filepath.Join(d, "cluster.yaml"), "--machines", machines, "--out", filepath.Join(d, "out")); code != exitOK {
			t.Fatalf("layer (%s): %s", name, errOut)
		}
		return filepath.Join(d, "out", "server.layer")
	}
	rooted := layers("rooted", "  channelRoot: "+init.RootDigest)
	neither := layers("neither", "")
	install := func(pin, layer string, args ...string) (int, string, string, string) {
		t.Helper()
		img := filepath.Join(t.TempDir(), "disk.img")
		code, out, errOut := run(t, append([]string{"install", "--channel", "file://" + channel, "--pin", pin, "--layer", layer, "--disk", img, "--size", "1200M", "--slot-size", "8"}, args...)...)
		return code, out, errOut, img
	}
	for _, tc := range []struct {
		name, pin, layer string
		args             []string
		code             int
		want             string
		imageLeft        bool
	}{
		{"a signed release, the root from the layer's Cluster", signed, rooted, nil, exitOK, "is what the channel's keys signed (root " + init.RootDigest, true},
		{"a release the keys never signed", other, rooted, v2, exitFailed, "release 2026.08.10-002 is not installed: ", false},
		{"a signed release, the root given", signed, neither, []string{"--trusted-root", init.RootDigest}, exitOK, "is what the channel's keys signed", true},
		{"another root given", signed, rooted, []string{"--trusted-root", "sha256:" + strings.Repeat("e", 64)}, exitFailed, "is not installed", false},
		{"a Cluster naming no root", signed, neither, nil, exitFailed, "names no spec.channelRoot and does not set spec.insecureUnsignedChannel", false},
		{"taken unsigned", other, neither, append([]string{"--insecure-unsigned"}, v2...), exitOK, "WARNING: release 2026.08.10-002 is installed unverified", true},
		{"both", signed, neither, []string{"--insecure-unsigned", "--trusted-root", init.RootDigest}, exitFailed, "not both", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut, img := install(tc.pin, tc.layer, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Errorf("exit %d, want %d and %q:\n%s%s", code, tc.code, tc.want, out, errOut)
			}
			if _, err := os.Stat(img); (err == nil) != tc.imageLeft {
				t.Errorf("the image is there: %v; want %v", err == nil, tc.imageLeft)
			}
		})
	}
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
	// The examples' Cluster names a root no key made: this test is of the layer, not of the
	// channel's signature (TestInstallVerifiesTheChannel).
	if code, out, errOut := run(t, "install", "--channel", channel, "--pin", pin, "--layer", filepath.Join(first, "server.layer"),
		"--disk", img, "--size", "1200M", "--slot-size", "8", "--insecure-unsigned"); code != exitOK {
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
