// Package installer makes a release's installer image (issue 29): one file that boots as a
// CD-ROM or a BMC's virtual media (ISO 9660 with an El Torito EFI boot image) and, written to
// a USB stick, as a disk (its GPT names the same EFI boot image as an EFI system
// partition). It carries liken's GRUB, the release (its document, slot image and GRUB image,
// each checked against the document before it goes in) and the deployment layers.
//
// Booted, GRUB finds the image by its manifest (ManifestPath), mounts the slot image and
// boots its kernel and initramfs with liken.install=1. The install mode of liken's init,
// which would install the machine from the image, is not built yet: today the initramfs
// stops there, saying so. Nothing exposes the image to users until it is.
package installer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/release"
)

// Paths in the image.
const (
	// VolumeID is the ISO 9660 volume's name, which the install mode looks for.
	VolumeID = "LIKEN_INSTALL"
	// ManifestPath says what the image holds; GRUB finds the image by it.
	ManifestPath = "liken/installer.json"
	ReleaseDir   = "liken/release"
	LayersDir    = "liken/layers"
	ConfigPath   = "liken/grub.cfg"
	// BootImage is the FAT image El Torito boots and the GPT's EFI system partition.
	BootImage = "boot/efi.img"
)

// Manifest is what the image holds, for the install mode and for people.
type Manifest struct {
	Schema string `json:"schema"`
	// Version and Pin are the release's: its version and the digest of its release.json.
	Version string `json:"version"`
	Pin     string `json:"pin"`
	// Layers are the deployment layers, by file name, with their digests.
	Layers []Layer `json:"layers"`
}

// Layer is one deployment layer in the image.
type Layer struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// Schema is the manifest's.
const Schema = "liken.dev/installer/v1"

// Options say what to put in the image.
type Options struct {
	// Release is a release directory (`liken release build --out`'s): release.json, the
	// slot image and GRUB's image.
	Release string
	// Layers are deployment layer files (`liken layer`'s).
	Layers []string
	// Out is the image to write; Work a directory for the steps (a temporary one if empty).
	Out, Work string
}

// embeddedConfig is the installer GRUB's own: find the image by its manifest, on a CD (ISO
// 9660) or a USB disk (the same ISO 9660 at the disk's start), and read its grub.cfg.
const embeddedConfig = `search --no-floppy --file /` + ManifestPath + ` --set=root
set prefix=($root)/liken
configfile ($root)/` + ConfigPath + `
`

// config boots the release's kernel and initramfs from the slot image, in install mode.
const config = bootloader.ConsoleSelect + `set timeout=0
echo "liken-installer: booting the installer of release $liken_version"
loopback slot /` + ReleaseDir + `/` + "slot.img" + `
if linux (slot)/vmlinuz liken.install=1 $console_args panic=5 apparmor=0; then
  if initrd (slot)/initramfs.img; then
    boot
  fi
fi
echo "liken-installer: the release's kernel could not be loaded; powering off in 30 seconds"
sleep 30
halt
`

// Build writes the installer image and returns its manifest. The image is reproducible:
// the same release and layers give the same bytes (file times are the release's).
func Build(o Options) (*Manifest, error) {
	docBytes, err := os.ReadFile(filepath.Join(o.Release, apirelease.DocumentName))
	if err != nil {
		return nil, fmt.Errorf("reading the release: %w", err)
	}
	doc, err := apirelease.Decode(docBytes)
	if err != nil {
		return nil, fmt.Errorf("the release's %s: %w", apirelease.DocumentName, err)
	}
	m := &Manifest{Schema: Schema, Version: doc.Version, Pin: apirelease.Digest(docBytes)}
	if len(o.Layers) == 0 {
		return nil, errors.New("no deployment layer: the installer finds each machine's Machine in one")
	}
	work := o.Work
	if work == "" {
		if work, err = os.MkdirTemp("", "liken-installer-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(work)
	}
	tree := filepath.Join(work, "tree")
	if err := os.RemoveAll(tree); err != nil {
		return nil, err
	}
	// The release's files, each checked against its document as it is copied.
	if err := copyFile(filepath.Join(o.Release, apirelease.DocumentName), filepath.Join(tree, ReleaseDir, apirelease.DocumentName), "", 0); err != nil {
		return nil, err
	}
	for _, role := range []apirelease.Role{apirelease.RoleSlot, apirelease.RoleBootloader} {
		f := doc.File(role)
		if f == nil {
			return nil, fmt.Errorf("release %s has no %s file", doc.Version, role)
		}
		if err := copyFile(filepath.Join(o.Release, f.Name), filepath.Join(tree, ReleaseDir, f.Name), f.SHA256, f.Size); err != nil {
			return nil, fmt.Errorf("release %s: %w", doc.Version, err)
		}
	}
	if f := doc.File(apirelease.RoleSlot); f.Name != "slot.img" {
		return nil, fmt.Errorf("release %s names its slot image %s; the installer's GRUB boots slot.img", doc.Version, f.Name)
	}
	seen := map[string]bool{}
	for _, p := range o.Layers {
		name := filepath.Base(p)
		if seen[name] {
			return nil, fmt.Errorf("two layers named %s", name)
		}
		seen[name] = true
		lf, size, err := layer.Open(p, layer.DefaultLimits)
		if err != nil {
			return nil, err
		}
		data := make([]byte, size)
		_, err = io.ReadFull(lf, data)
		lf.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		if _, _, err := layer.Read(bytes.NewReader(data), layer.DefaultLimits); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		sum := sha256.Sum256(data)
		m.Layers = append(m.Layers, Layer{Name: name, Digest: "sha256:" + hex.EncodeToString(sum[:])})
		if err := writeFile(filepath.Join(tree, LayersDir, name), data); err != nil {
			return nil, err
		}
	}
	sort.Slice(m.Layers, func(i, j int) bool { return m.Layers[i].Name < m.Layers[j].Name })
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(tree, ManifestPath), append(mb, '\n')); err != nil {
		return nil, err
	}
	cfg := "set liken_version=" + doc.Version + "\n" + config
	if err := writeFile(filepath.Join(tree, ConfigPath), []byte(cfg)); err != nil {
		return nil, err
	}
	epoch := doc.Created
	if err := bootImage(work, filepath.Join(tree, BootImage), epoch); err != nil {
		return nil, err
	}
	// Every file and directory at the release's time, so the image does not depend on when
	// it was built.
	if err := filepath.Walk(tree, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, epoch, epoch)
	}); err != nil {
		return nil, err
	}
	// Written beside Out and renamed once whole: no half-written image under its name.
	tmp := o.Out + ".partial"
	if err := iso(tree, tmp, epoch); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, o.Out); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	return m, nil
}

// bootImage makes the FAT image firmware boots: GRUB at the removable-media path.
func bootImage(work, img string, epoch time.Time) error {
	efi := filepath.Join(work, "BOOTX64.EFI")
	if err := bootloader.BuildEFIWith(efi, work, embeddedConfig, "/liken", "iso9660", "loopback"); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(img), 0o755); err != nil {
		return err
	}
	os.Remove(img)
	env := append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", epoch.Unix()))
	for _, args := range [][]string{
		{"mkfs.vfat", "--invariant", "-n", "LIKEN-BOOT", "-C", img, "4096"},
		{"mmd", "-i", img, "::/EFI", "::/EFI/BOOT"},
		{"mcopy", "-i", img, efi, "::/" + bootloader.EFIBinary},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = env
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", args[0], err, b)
		}
	}
	return nil
}

// iso writes tree as a hybrid image: ISO 9660 (Rock Ridge and Joliet names) whose El Torito
// catalog boots BootImage by EFI, and, for a USB stick, a GPT whose second partition is the
// same FAT image as an EFI system partition. Every file's time is epoch.
func iso(tree, out string, epoch time.Time) error {
	stamp := epoch.UTC().Format("2006010215040500")
	args := []string{"-as", "mkisofs", "-quiet", "-iso-level", "3", "-R", "-J", "-V", VolumeID,
		"-e", BootImage, "-no-emul-boot",
		"-append_partition", "2", "0xef", filepath.Join(tree, BootImage), "-appended_part_as_gpt",
		"--modification-date=" + stamp, "-o", out, tree}
	os.Remove(out)
	cmd := exec.Command("xorriso", args...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", epoch.Unix()))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("xorriso (Debian package xorriso): %w: %s", err, b)
	}
	return nil
}

// copyFile copies src to dst (release.CopyFileSum: synced, hashed as it is read), checking
// it is the file its release document names when sha is given.
func copyFile(src, dst, sha string, size int64) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	got, err := release.CopyFileSum(src, dst)
	if err != nil {
		return err
	}
	if sha == "" {
		return nil
	}
	st, err := os.Stat(dst)
	if err != nil {
		return err
	}
	if got != sha || st.Size() != size {
		return fmt.Errorf("%s is not the file its release document names (%d bytes, sha256:%s; the document says %d bytes, sha256:%s)",
			filepath.Base(src), st.Size(), got, size, sha)
	}
	return nil
}

func writeFile(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o644)
}
