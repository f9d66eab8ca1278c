// Package installer makes a release's installer image and runs its install mode.
//
// The image (Build, `liken installer build`) is one file that boots as a CD-ROM or a BMC's
// virtual media (ISO 9660 with an El Torito EFI boot image) and, written to a USB stick, as
// a disk (its GPT names the same EFI boot image as an EFI system partition). It carries
// liken's GRUB, a copy of the channel holding the one release (its document, slot image and
// GRUB image, each checked as an install checks them, and the channel's signed metadata
// that vouched for it) and the deployment layers.
//
// Booted, GRUB finds the image by its manifest (ManifestPath), mounts the slot image and
// boots its kernel and initramfs with liken.install=PATH; the initramfs mounts the image and
// the slot in it (internal/initramfs), and the booted system's init runs the install mode
// (Run): it finds the machine's Machine in the layers, chooses the disk and installs it as
// `liken install` does, from the copy of the channel.
package installer

import (
	"bytes"
	"context"
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
	"strings"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/initramfs"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/tuf"
)

// Paths in the image.
const (
	// VolumeID is the ISO 9660 volume's name, which the install mode looks for.
	VolumeID = initramfs.InstallerVolume
	// ManifestPath says what the image holds; GRUB finds the image by it.
	ManifestPath = "liken/installer.json"
	// ChannelDir is a copy of the channel with the one release (ChannelDir/VERSION/) and
	// the signed metadata that vouched for it (ChannelDir/metadata/, when the channel is
	// signed): the install mode installs from it as from the channel itself.
	ChannelDir = "liken/channel"
	LayersDir  = "liken/layers"
	ConfigPath = "liken/grub.cfg"
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
	// Signed says the copy of the channel carries its signed metadata, so the install mode
	// checks the release against the root the layers' Cluster trusts; else the release was
	// taken unsigned, on the Cluster's or the builder's word (Unsigned says whose).
	Signed   bool   `json:"signed"`
	Unsigned string `json:"unsigned,omitempty"`
	// KernelArgs are given to the installer's own boot and written into the installed
	// boot loader's environment (install's --kernel-args).
	KernelArgs string `json:"kernelArgs,omitempty"`
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
	// Channel and Pin are the release, as `liken install` takes them; Version its version
	// (empty: looked up in the channel's index).
	Channel, Pin, Version string
	// InsecureUnsigned takes the channel unsigned whatever the layers' Cluster says, as
	// install's flag does (the machines are then installed unverified too). There is no
	// trusted root to give instead: the machines check against their Cluster's.
	InsecureUnsigned bool
	// Layers are deployment layer files (`liken layer`'s), all of one cluster.
	Layers []string
	// KernelArgs are extra kernel arguments: for the installer's boot, and for every boot of
	// the machines it installs.
	KernelArgs string
	// Out is the image to write; Netboot a directory for the same installer's network boot
	// (its files: NetbootEFI and the others); at least one. Work is a directory for the
	// steps (a temporary one if empty).
	Out, Netboot, Work string
	Fetcher            *release.Fetcher
	Log                io.Writer
}

// embeddedConfig is the installer GRUB's own: find the image by its manifest, on a CD (ISO
// 9660) or a USB disk (the same ISO 9660 at the disk's start), and read its grub.cfg.
const embeddedConfig = `search --no-floppy --file /` + ManifestPath + ` --set=root
set prefix=($root)/liken
configfile ($root)/` + ConfigPath + `
`

// config boots the release's kernel and initramfs from the slot image, in install mode; the
// build sets liken_slot (the slot image's path) and liken_args before it.
const config = bootloader.ConsoleSelect + `set timeout=0
echo "liken-installer: booting the installer of release $liken_version"
loopback slot $liken_slot
if linux (slot)/vmlinuz liken.install=$liken_slot $console_args panic=5 apparmor=0 $liken_args; then
  if initrd (slot)/initramfs.img; then
    boot
  fi
fi
echo "liken-installer: the release's kernel could not be loaded; powering off in 30 seconds"
sleep 30
halt
`

// Build writes the installer image and returns its manifest. The release is checked as
// `liken install` checks it (signed by the channel's keys from the root the layers' Cluster
// trusts, each file against the pinned document) before any of it goes in. The image is
// reproducible: the same release and layers give the same bytes (file times are the
// release's).
func Build(ctx context.Context, o Options) (*Manifest, error) {
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	step := func(format string, args ...any) { fmt.Fprintf(log, "installer build: "+format+"\n", args...) }
	if o.Fetcher == nil {
		o.Fetcher = &release.Fetcher{}
	}
	if !apirelease.ValidDigest(o.Pin) {
		return nil, fmt.Errorf("--pin %q is not a release digest ('sha256:' and 64 hex digits)", o.Pin)
	}
	if err := bootloader.CheckInstallArgs(o.KernelArgs); err != nil {
		return nil, err
	}
	if strings.ContainsAny(o.KernelArgs, "\"'\\$;{}`\n") {
		return nil, fmt.Errorf("--kernel-args %q: quotes, '\\', '$', ';', braces and newlines are not taken (GRUB's script would read them)", o.KernelArgs)
	}
	if len(o.Layers) == 0 {
		return nil, errors.New("no deployment layer: the installer finds each machine's Machine in one")
	}
	if o.Out == "" && o.Netboot == "" {
		return nil, errors.New("nothing to write: give the image to write, a directory for the network boot's files, or both")
	}
	work := o.Work
	var err error
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
	layers, cluster, err := readLayers(o.Layers)
	if err != nil {
		return nil, err
	}
	root, unsigned, err := install.Trust("", o.InsecureUnsigned, cluster)
	if err != nil {
		return nil, err
	}
	// The channel's server is proven as the machines will prove it.
	if o.Fetcher, err = o.Fetcher.Trusting(cluster.Spec.ChannelCA); err != nil {
		return nil, fmt.Errorf("the layers' Cluster: spec.channelCA: %w", err)
	}
	version := o.Version
	if version == "" {
		if version, err = install.LookUp(ctx, o.Fetcher, o.Channel, o.Pin); err != nil {
			return nil, err
		}
	}
	channel := filepath.Join(tree, ChannelDir)
	m := &Manifest{Schema: Schema, Version: version, Pin: o.Pin, KernelArgs: o.KernelArgs}
	switch {
	case root != "":
		if err := tuf.MirrorRelease(ctx, o.Fetcher, o.Channel, root, version, o.Pin, filepath.Join(channel, tuf.MetadataDir)); err != nil {
			return nil, fmt.Errorf("release %s is not put in the installer: %w", version, err)
		}
		m.Signed = true
		step("release %s (%s) is what the channel's keys signed (root %s); the image carries the signed metadata", version, o.Pin, root)
	default:
		m.Unsigned = unsigned
		step("WARNING: release %s goes in unverified: the channel is taken unsigned (%s)", version, unsigned)
	}
	doc, raw, err := o.Fetcher.Document(ctx, o.Channel, version, o.Pin)
	if err != nil {
		return nil, err
	}
	relDir := filepath.Join(channel, version)
	if err := writeFile(filepath.Join(relDir, apirelease.DocumentName), raw); err != nil {
		return nil, err
	}
	slot := doc.File(apirelease.RoleSlot)
	for _, role := range []apirelease.Role{apirelease.RoleSlot, apirelease.RoleBootloader} {
		f := doc.File(role)
		if f == nil {
			return nil, fmt.Errorf("release %s has no %s file: it cannot be installed", version, role)
		}
		if f.Name != filepath.Base(f.Name) {
			return nil, fmt.Errorf("release %s names a file %q", version, f.Name)
		}
		step("copying %s (%d bytes, verified as it streams)", f.Name, f.Size)
		if err := o.Fetcher.File(ctx, o.Channel, version, *f, release.FileTarget{Path: filepath.Join(relDir, f.Name)}); err != nil {
			return nil, err
		}
	}
	for _, l := range layers {
		m.Layers = append(m.Layers, Layer{Name: l.name, Digest: l.digest})
		if err := writeFile(filepath.Join(tree, LayersDir, l.name), l.data); err != nil {
			return nil, err
		}
	}
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(tree, ManifestPath), append(mb, '\n')); err != nil {
		return nil, err
	}
	slotPath := "/" + ChannelDir + "/" + version + "/" + slot.Name
	cfg := fmt.Sprintf("set liken_version=%s\nset liken_slot=%s\nset liken_args=%q\n", version, slotPath, o.KernelArgs) + config
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
	if o.Out != "" {
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
		if st, err := os.Stat(o.Out); err == nil {
			step("wrote %s (%d bytes): release %s, %d layers", o.Out, st.Size(), version, len(m.Layers))
		}
	}
	if o.Netboot != "" {
		if err := buildNetboot(tree, work, o.Netboot, version, slotPath, o.KernelArgs, epoch); err != nil {
			return nil, fmt.Errorf("the network boot's files: %w", err)
		}
		step("wrote the network boot's files into %s: %s (GRUB, for UEFI PXE or HTTP boot), %s (an iPXE script), %s, %s, %s", o.Netboot,
			NetbootEFI, NetbootIPXE, NetbootKernel, NetbootInitramfs, NetbootArchive)
	}
	return m, nil
}

// aLayer is a layer file read for the image.
type aLayer struct {
	name, digest string
	data         []byte
}

// readLayers reads and checks the layers, which must be of one cluster (one CA), and
// returns their Cluster.
func readLayers(paths []string) ([]aLayer, *v1alpha1.Cluster, error) {
	var out []aLayer
	var cluster *v1alpha1.Cluster
	seen, ca := map[string]bool{}, ""
	for _, p := range paths {
		name := filepath.Base(p)
		if seen[name] {
			return nil, nil, fmt.Errorf("two layers named %s", name)
		}
		seen[name] = true
		lf, size, err := layer.Open(p, layer.DefaultLimits)
		if err != nil {
			return nil, nil, err
		}
		data := make([]byte, size)
		_, err = io.ReadFull(lf, data)
		lf.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", p, err)
		}
		idx, files, err := layer.Read(bytes.NewReader(data), layer.DefaultLimits)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p, err)
		}
		if ca != "" && idx.CAHash != ca {
			return nil, nil, fmt.Errorf("%s is a layer of another cluster (CA %.12s, the others %.12s): an installer holds one cluster's layers", p, idx.CAHash, ca)
		}
		ca = idx.CAHash
		if cluster == nil {
			if cluster, err = layer.DecodeCluster(files[layer.ClusterManifest]); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", p, err)
			}
		}
		sum := sha256.Sum256(data)
		out = append(out, aLayer{name: name, digest: "sha256:" + hex.EncodeToString(sum[:]), data: data})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, cluster, nil
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
