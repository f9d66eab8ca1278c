package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// fakeKernelDeb builds a linux-image-shaped .deb with dpkg-deb: a vmlinuz, a config and one
// module (not a real one: depmod warns and indexes it all the same).
func fakeKernelDeb(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	pkg := filepath.Join(dir, "pkg")
	for rel, data := range map[string]string{
		"DEBIAN/control":                     "Package: linux-image-test\nVersion: 1\nArchitecture: amd64\nMaintainer: liken <t@liken.dev>\nDescription: a test kernel package\n",
		"boot/vmlinuz-1.0-test":              "a kernel\n",
		"boot/config-1.0-test":               "CONFIG_TEST=y\n",
		"lib/modules/1.0-test/kernel/foo.ko": "a module\n",
	} {
		p := filepath.Join(pkg, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(dir, "linux-image-test_1_amd64.deb")
	if out, err := exec.Command("dpkg-deb", "--build", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	return deb
}

// TestUnpackKernelDebCached: a package is unpacked once and used again while every file is
// as recorded; a damaged file or an entry whose manifest was never written is unpacked again.
func TestUnpackKernelDebCached(t *testing.T) {
	for _, tool := range []string{"dpkg-deb", "depmod"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (make deps installs it): %v", tool, err)
		}
	}
	deb, cache := fakeKernelDeb(t), t.TempDir()
	// When the entry's manifest was written (to the nanosecond): every unpack writes it last.
	written := func(k *Kernel) time.Time {
		t.Helper()
		fi, err := os.Stat(filepath.Join(k.Root, unpackedManifest))
		if err != nil {
			t.Fatal(err)
		}
		return fi.ModTime()
	}
	k, err := UnpackKernelDebCached(deb, cache)
	if err != nil {
		t.Fatal(err)
	}
	if k.Version != "1.0-test" || filepath.Dir(k.Root) != filepath.Join(cache, "unpacked") {
		t.Fatalf("unpacked kernel %q in %s", k.Version, k.Root)
	}
	if _, err := os.Stat(filepath.Join(k.ModulesDir(), "modules.dep")); err != nil {
		t.Errorf("depmod's index is missing: %v", err)
	}
	first := written(k)

	again, err := UnpackKernelDebCached(deb, cache)
	if err != nil {
		t.Fatal(err)
	}
	if again.Version != k.Version || !written(again).Equal(first) {
		t.Errorf("an unchanged entry was unpacked again (version %q)", again.Version)
	}
	if files, err := again.Resolve("foo"); err != nil || len(files) != 1 {
		t.Errorf("the reused entry's module index: %v, %v", files, err)
	}

	for _, tc := range []struct {
		name   string
		damage func(root string) error
	}{
		{"a damaged file", func(root string) error {
			return os.WriteFile(filepath.Join(root, "boot", "vmlinuz-1.0-test"), []byte("damaged\n"), 0o644)
		}},
		{"a file added", func(root string) error {
			return os.WriteFile(filepath.Join(root, "boot", "extra"), []byte("x"), 0o644)
		}},
		{"an unfinished entry", func(root string) error { return os.Remove(filepath.Join(root, unpackedManifest)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := UnpackKernelDebCached(deb, cache)
			if err != nil {
				t.Fatal(err)
			}
			before := written(k)
			if err := tc.damage(k.Root); err != nil {
				t.Fatal(err)
			}
			k, err = UnpackKernelDebCached(deb, cache)
			if err != nil {
				t.Fatal(err)
			}
			if written(k).Equal(before) {
				t.Errorf("the entry was used as it was, not unpacked again")
			}
			if b, _ := os.ReadFile(k.Vmlinuz()); string(b) != "a kernel\n" {
				t.Errorf("vmlinuz after the new unpack: %q", b)
			}
			if _, err := os.Stat(filepath.Join(k.Root, "boot", "extra")); err == nil {
				t.Errorf("a file added to the entry is still there")
			}
		})
	}
}
