package installer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/manifest"
)

// testRelease is a release directory as `liken release build --out` writes one, small: a FAT
// slot image (the installer copies it whole, never reads inside), a GRUB image, and the
// document naming both.
func testRelease(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	slot := filepath.Join(dir, "slot.img")
	for _, args := range [][]string{
		{"mkfs.vfat", "--invariant", "-n", "LIKEN-SLOT", "-C", slot, "2048"},
		{"mcopy", "-i", slot, "/etc/hostname", "::/vmlinuz"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", args[0], err, out)
		}
	}
	os.WriteFile(filepath.Join(dir, "bootx64.efi"), bytes.Repeat([]byte("GRUB"), 1000), 0o644)
	doc := &apirelease.Document{Schema: apirelease.Schema, Version: "2026.12.07-001", Created: time.Unix(1796600000, 0).UTC()}
	for _, f := range []struct {
		name string
		role apirelease.Role
	}{{"slot.img", apirelease.RoleSlot}, {"bootx64.efi", apirelease.RoleBootloader}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		doc.Files = append(doc.Files, apirelease.File{Name: f.name, Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:]), Role: f.role})
	}
	b, err := doc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, apirelease.DocumentName), b, 0o644)
	return dir
}

func exampleLayers(t *testing.T) []string {
	t.Helper()
	docs, err := manifest.Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(out, "identity"), OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	return []string{res.Layers["server"], res.Layers["agent"]}
}

// TestInstallerImageLayout: the image is an ISO 9660 volume (xorriso lists its files, and
// its manifest names the release and layers with their digests), its El Torito catalog
// boots the EFI image by EFI, and its GPT (for a USB stick) names the same FAT image as an
// EFI system partition, holding GRUB at the removable-media path. Two builds, at different
// times from different directories, give the same bytes.
func TestInstallerImageLayout(t *testing.T) {
	rel, layers := testRelease(t), exampleLayers(t)
	out := filepath.Join(t.TempDir(), "installer.iso")
	m, err := Build(Options{Release: rel, Layers: layers, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != "2026.12.07-001" || len(m.Layers) != 2 || m.Layers[0].Name != "agent.layer" || !strings.HasPrefix(m.Layers[1].Digest, "sha256:") {
		t.Errorf("manifest %+v", m)
	}

	files, err := exec.Command("xorriso", "-indev", out, "-find", "/", "-type", "f").CombinedOutput()
	if err != nil {
		t.Fatalf("xorriso -find: %v %s", err, files)
	}
	for _, want := range []string{ManifestPath, ConfigPath, BootImage, ReleaseDir + "/release.json", ReleaseDir + "/slot.img", ReleaseDir + "/bootx64.efi", LayersDir + "/server.layer", LayersDir + "/agent.layer"} {
		if !strings.Contains(string(files), "'/"+want+"'") {
			t.Errorf("the ISO 9660 volume lacks /%s:\n%s", want, files)
		}
	}
	x := t.TempDir()
	if b, err := exec.Command("xorriso", "-osirrox", "on", "-indev", out, "-extract", "/"+ManifestPath, filepath.Join(x, "m.json"),
		"-extract", "/"+ReleaseDir+"/slot.img", filepath.Join(x, "slot.img")).CombinedOutput(); err != nil {
		t.Fatalf("xorriso -extract: %v %s", err, b)
	}
	var got Manifest
	if b, _ := os.ReadFile(filepath.Join(x, "m.json")); json.Unmarshal(b, &got) != nil || got.Pin != m.Pin || len(got.Layers) != 2 {
		t.Errorf("the image's manifest: %+v", got)
	}
	want, _ := os.ReadFile(filepath.Join(rel, "slot.img"))
	if b, _ := os.ReadFile(filepath.Join(x, "slot.img")); !bytes.Equal(b, want) {
		t.Error("the image's slot.img differs from the release's")
	}

	torito, err := exec.Command("xorriso", "-indev", out, "-report_el_torito", "plain").CombinedOutput()
	if err != nil || !strings.Contains(string(torito), "UEFI") || !strings.Contains(string(torito), "/"+BootImage) {
		t.Errorf("El Torito does not boot %s by UEFI: %v\n%s", BootImage, err, torito)
	}

	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := disk.ReadTable(f)
	f.Close()
	if err != nil {
		t.Fatalf("the image's GPT: %v", err)
	}
	var esp *disk.Entry
	for i, e := range tb.Entries {
		if e.Type == disk.MustGUID("C12A7328-F81F-11D2-BA4B-00A0C93EC93B") { // EFI system partition
			esp = &tb.Entries[i]
		}
	}
	if esp == nil {
		t.Fatalf("the image's GPT has no EFI system partition: %+v", tb.Entries)
	}
	img, _ := os.ReadFile(out)
	off, size := esp.Offset(tb.SectorSize), esp.Size(tb.SectorSize)
	part := filepath.Join(x, "esp.img")
	os.WriteFile(part, img[off:off+size], 0o644)
	if ls, err := exec.Command("mdir", "-i", part, "::/"+filepath.Dir(bootloader.EFIBinary)).CombinedOutput(); err != nil || !strings.Contains(string(ls), "BOOTX64  EFI") {
		t.Errorf("the EFI system partition does not hold GRUB at %s: %v\n%s", bootloader.EFIBinary, err, ls)
	}

	time.Sleep(1100 * time.Millisecond) // another second: file times must not leak in
	out2 := filepath.Join(t.TempDir(), "again.iso")
	if _, err := Build(Options{Release: rel, Layers: layers, Out: out2}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out2)
	if sa, sb := sha256.Sum256(img), sha256.Sum256(a); sa != sb {
		t.Errorf("two builds differ: sha256 %x and %x", sa, sb)
	}
	t.Logf("installer image: %d bytes (a test release of %d bytes and two layers)", len(img), len(want))
}

// TestInstallerRefuses: a release whose file is not the one its document names, and no
// layer, are refused before an image is written.
func TestInstallerRefuses(t *testing.T) {
	rel, layers := testRelease(t), exampleLayers(t)
	out := filepath.Join(t.TempDir(), "installer.iso")
	if _, err := Build(Options{Release: rel, Out: out}); err == nil || !strings.Contains(err.Error(), "no deployment layer") {
		t.Errorf("no layer: %v", err)
	}
	os.WriteFile(filepath.Join(rel, "bootx64.efi"), []byte("another GRUB"), 0o644)
	if _, err := Build(Options{Release: rel, Layers: layers, Out: out}); err == nil || !strings.Contains(err.Error(), "is not the file its release document names") {
		t.Errorf("a changed GRUB image: %v", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("an image was written for a refused build")
	}
}
