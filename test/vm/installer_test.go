package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/installer"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/test/report"
)

// TestInstallerBootsFromCD (issue 29 item 1, the installer's boot): the test release's
// installer image, in the CD drive of a machine whose disk is empty, boots through the
// firmware's El Torito EFI entry into liken's GRUB, which finds the image by its manifest,
// mounts the release's slot image and boots its kernel and initramfs in install mode. The
// install mode itself is not built yet: the initramfs says so, and the disk is left as it was.
func TestInstallerBootsFromCD(t *testing.T) {
	vmTest(t)
	rel, err := BuildRelease(releaseA)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := manifest.Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(dir, "identity"), OutDir: dir, StandInNodeCredentials: true})
	if err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "installer.iso")
	start := time.Now()
	m, err := installer.Build(installer.Options{Release: rel.Dir, Layers: []string{res.Layers["server"], res.Layers["agent"]}, Out: iso})
	if err != nil {
		t.Fatal(err)
	}
	built := time.Since(start)
	st, err := os.Stat(iso)
	if err != nil {
		t.Fatal(err)
	}
	// An empty disk, which nothing may write.
	empty := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(empty, make([]byte, 64<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	v := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: empty}}, CDROM: iso})
	grub := expect(t, v, "liken-installer: booting the installer of release "+m.Version, 180*time.Second)
	expect(t, v, "liken-init: initramfs stage at", 120*time.Second)
	initramfs := expect(t, v, "this is liken's installer image: its install mode is not built yet", 60*time.Second)
	v.Kill()
	if b, _ := os.ReadFile(empty); !bytes.Equal(b, make([]byte, 64<<20)) {
		t.Error("the installer's boot wrote to the disk")
	}
	report.Line("installer image (ISO 9660 + El Torito EFI + GPT for USB) of release %s and two layers: %d bytes, built in %s; booted as a CD (TCG): GRUB %s, the initramfs in install mode %s from QEMU's start",
		m.Version, st.Size(), built.Round(100*time.Millisecond), grub.Round(100*time.Millisecond), initramfs.Round(100*time.Millisecond))
}
