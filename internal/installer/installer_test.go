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

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/tuf"
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
		{"mcopy", "-i", slot, "/etc/os-release", "::/initramfs.img"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", args[0], err, out)
		}
	}
	os.WriteFile(filepath.Join(dir, "bootx64.efi"), bytes.Repeat([]byte("GRUB"), 1000), 0o644)
	doc := &apirelease.Document{Schema: apirelease.Schema, Version: testVersion, Created: time.Unix(1796600000, 0).UTC()}
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

const testVersion = "2026.12.07-001"

// testChannel publishes the test release into a channel signed as `liken release keys
// init` and `publish` sign one, and returns it, the release's pin and the root's digest.
func testChannel(t *testing.T) (channel, pin, root string) {
	t.Helper()
	rel := testRelease(t)
	channel = filepath.Join(t.TempDir(), "channel")
	repo := &tuf.Repo{Channel: channel, Expiry: tuf.DefaultExpiry}
	keyDir := filepath.Join(t.TempDir(), "keys")
	root, err := repo.Init(tuf.InitOptions{KeyDir: keyDir})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := tuf.LoadKeys(keyDir)
	if err != nil {
		t.Fatal(err)
	}
	if pin, err = release.Publish(channel, rel); err != nil {
		t.Fatal(err)
	}
	if err := repo.SignRelease(keys, rel); err != nil {
		t.Fatal(err)
	}
	return channel, pin, root
}

// exampleLayers are the examples' server and agent layers, their Cluster trusting root.
func exampleLayers(t *testing.T, root string) []string {
	t.Helper()
	docs, err := manifest.Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if d.Object.GetKind() == "Cluster" {
			unstructured.SetNestedField(d.Object.Object, root, "spec", "channelRoot")
		}
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
	channel, pin, root := testChannel(t)
	layers := exampleLayers(t, root)
	out := filepath.Join(t.TempDir(), "installer.iso")
	net := t.TempDir()
	o := Options{Channel: "file://" + channel, Pin: pin, Layers: layers, KernelArgs: "console=ttyS1,9600", Out: out, Netboot: net}
	m, err := Build(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != testVersion || m.Pin != pin || !m.Signed || len(m.Layers) != 2 || m.Layers[0].Name != "agent.layer" || !strings.HasPrefix(m.Layers[1].Digest, "sha256:") {
		t.Errorf("manifest %+v", m)
	}

	files, err := exec.Command("xorriso", "-indev", out, "-find", "/", "-type", "f").CombinedOutput()
	if err != nil {
		t.Fatalf("xorriso -find: %v %s", err, files)
	}
	rd := ChannelDir + "/" + testVersion
	for _, want := range []string{ManifestPath, ConfigPath, BootImage, rd + "/release.json", rd + "/slot.img", rd + "/bootx64.efi", LayersDir + "/server.layer", LayersDir + "/agent.layer",
		ChannelDir + "/metadata/1.root.json", ChannelDir + "/metadata/timestamp.json"} {
		if !strings.Contains(string(files), "'/"+want+"'") {
			t.Errorf("the ISO 9660 volume lacks /%s:\n%s", want, files)
		}
	}
	x := t.TempDir()
	if b, err := exec.Command("xorriso", "-osirrox", "on", "-indev", out, "-extract", "/"+ManifestPath, filepath.Join(x, "m.json"),
		"-extract", "/"+rd+"/slot.img", filepath.Join(x, "slot.img"), "-extract", "/"+ConfigPath, filepath.Join(x, "grub.cfg"),
		"-extract", "/"+ChannelDir, filepath.Join(x, "channel")).CombinedOutput(); err != nil {
		t.Fatalf("xorriso -extract: %v %s", err, b)
	}
	var got Manifest
	if b, _ := os.ReadFile(filepath.Join(x, "m.json")); json.Unmarshal(b, &got) != nil || got.Pin != m.Pin || len(got.Layers) != 2 {
		t.Errorf("the image's manifest: %+v", got)
	}
	want, _ := os.ReadFile(filepath.Join(channel, testVersion, "slot.img"))
	if b, _ := os.ReadFile(filepath.Join(x, "slot.img")); !bytes.Equal(b, want) {
		t.Error("the image's slot.img differs from the release's")
	}
	if cfg, _ := os.ReadFile(filepath.Join(x, "grub.cfg")); !strings.Contains(string(cfg), "set liken_slot=/"+rd+"/slot.img\n") || !strings.Contains(string(cfg), `set liken_args="console=ttyS1,9600"`) {
		t.Errorf("the installer's grub.cfg:\n%s", cfg)
	}
	// The image's copy of the channel verifies offline as the channel does, from the same
	// root: what the install mode checks before it writes a disk.
	if err := tuf.VerifyRelease(t.Context(), nil, "file://"+filepath.Join(x, "channel"), root, testVersion, pin, ""); err != nil {
		t.Errorf("the image's copy of the channel does not verify: %v", err)
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

	// The network boot: the release's kernel and initramfs (as in its slot image), the
	// installer's files as an initrd under /installer, GRUB holding their digests and the
	// manifest's, and an iPXE script.
	slotImg := filepath.Join(x, "slot.img")
	for _, name := range []string{NetbootKernel, NetbootInitramfs} {
		want, err := exec.Command("mtype", "-i", slotImg, "::/"+name).Output()
		got, _ := os.ReadFile(filepath.Join(net, name))
		if name == NetbootInitramfs {
			// Padded with zeros to 4 bytes: the archive after it must start on a boundary.
			if len(got)%4 != 0 || len(got)-len(want) > 3 || !bytes.Equal(got[len(got)-(len(got)-len(want)):], make([]byte, len(got)-len(want))) {
				t.Errorf("%s (%d bytes) is not the slot image's (%d bytes) padded to 4 bytes", name, len(got), len(want))
			}
			got = got[:min(len(got), len(want))]
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not the slot image's: %v", name, err)
		}
	}
	list, err := exec.Command("cpio", "-t", "-F", filepath.Join(net, NetbootArchive)).CombinedOutput()
	if err != nil || !strings.Contains(string(list), "installer/"+ManifestPath+"\n") || !strings.Contains(string(list), "installer/"+rd+"/slot.img\n") || strings.Contains(string(list), BootImage) {
		t.Errorf("the installer archive: %v\n%s", err, list)
	}
	efi, _ := os.ReadFile(filepath.Join(net, NetbootEFI))
	kernel, _ := os.ReadFile(filepath.Join(net, NetbootKernel))
	ks := sha256.Sum256(kernel)
	mb, _ := os.ReadFile(filepath.Join(x, "m.json"))
	ms := sha256.Sum256(mb)
	if !bytes.Contains(efi, []byte(hex.EncodeToString(ks[:])+"  "+NetbootKernel+"\n")) || !bytes.Contains(efi, []byte("set liken_manifest=sha256:"+hex.EncodeToString(ms[:]))) {
		t.Error("the network GRUB does not hold the kernel's and the manifest's digests")
	}
	if ipxe, _ := os.ReadFile(filepath.Join(net, NetbootIPXE)); !strings.HasPrefix(string(ipxe), "#!ipxe\n") || !strings.Contains(string(ipxe), "initrd "+NetbootArchive+"\n") {
		t.Errorf("the iPXE script:\n%s", ipxe)
	}

	time.Sleep(1100 * time.Millisecond) // another second: file times must not leak in
	out2 := filepath.Join(t.TempDir(), "again.iso")
	o.Out, o.Netboot = out2, t.TempDir()
	if _, err := Build(t.Context(), o); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out2)
	if sa, sb := sha256.Sum256(img), sha256.Sum256(a); sa != sb {
		t.Errorf("two builds differ: sha256 %x and %x", sa, sb)
	}
	for _, name := range []string{NetbootEFI, NetbootArchive, NetbootIPXE} {
		a, _ := os.ReadFile(filepath.Join(net, name))
		b, _ := os.ReadFile(filepath.Join(o.Netboot, name))
		if !bytes.Equal(a, b) {
			t.Errorf("two builds' %s differ", name)
		}
	}
	t.Logf("installer image: %d bytes (a test release of %d bytes and two layers)", len(img), len(want))
}

// TestInstallerRefuses: no layer, layers of two clusters, a release the channel's keys did
// not sign and a file that is not the one its document names are refused before an image is
// written.
func TestInstallerRefuses(t *testing.T) {
	channel, pin, root := testChannel(t)
	layers := exampleLayers(t, root)
	out := filepath.Join(t.TempDir(), "installer.iso")
	build := func(layers []string) error {
		_, err := Build(t.Context(), Options{Channel: "file://" + channel, Pin: pin, Layers: layers, Out: out})
		return err
	}
	if err := build(nil); err == nil || !strings.Contains(err.Error(), "no deployment layer") {
		t.Errorf("no layer: %v", err)
	}
	if err := build([]string{layers[0], exampleLayers(t, root)[1]}); err == nil || !strings.Contains(err.Error(), "is a layer of another cluster") {
		t.Errorf("two clusters' layers: %v", err)
	}
	_, _, otherRoot := testChannel(t)
	if err := build(exampleLayers(t, otherRoot)); err == nil || !strings.Contains(err.Error(), "is not put in the installer") {
		t.Errorf("a Cluster trusting another channel's root: %v", err)
	}
	os.WriteFile(filepath.Join(channel, testVersion, "bootx64.efi"), bytes.Repeat([]byte("BURG"), 1000), 0o644) // its size, other bytes
	if err := build(layers); err == nil || !strings.Contains(err.Error(), "bootx64.efi does not match its pin") {
		t.Errorf("a changed GRUB image: %v", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("an image was written for a refused build")
	}
}
