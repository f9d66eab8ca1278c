package installer

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/cpio"
	"liken.dev/liken/internal/initramfs"
)

// The files of a network boot (Options.Netboot), served from one directory by TFTP or HTTP.
const (
	// NetbootEFI is GRUB for the firmware's network boot (UEFI PXE; UEFI HTTP boot where
	// the DHCP server gives its URL): it checks the kernel and initramfs against the
	// release's digests, built into it, before it boots them.
	NetbootEFI = "bootx64.efi"
	// NetbootKernel and NetbootInitramfs are the release's, taken from its slot image.
	NetbootKernel    = "vmlinuz"
	NetbootInitramfs = "initramfs.img"
	// NetbootArchive is the installer image's files as a second initrd: the kernel unpacks it
	// into the initramfs under initramfs.InitrdMedium.
	NetbootArchive = "installer.cpio"
	// NetbootIPXE is an iPXE script booting the same files.
	NetbootIPXE = "liken.ipxe"
)

// netbootConfig is the network GRUB's grub.cfg, in its memdisk; the build sets liken_version,
// liken_slot, liken_manifest and liken_args before it. $cmdpath is where the firmware fetched
// GRUB from: (tftp,SERVER)/DIR, or (http,SERVER)/DIR.
const netbootConfig = bootloader.ConsoleSelect + `echo "liken-installer: booting the installer of release $liken_version from $cmdpath"
if sha256sum -c (memdisk)/SHA256SUMS -p $cmdpath; then
  if linux $cmdpath/` + NetbootKernel + ` liken.install=$liken_slot liken.install.manifest=$liken_manifest $console_args panic=5 apparmor=0 $liken_args; then
    if initrd $cmdpath/` + NetbootInitramfs + ` $cmdpath/` + NetbootArchive + `; then
      boot
    fi
  fi
fi
echo "liken-installer: the kernel or initramfs at $cmdpath could not be fetched or is not the release's; powering off in 30 seconds"
sleep 30
halt
`

// netbootModules are GRUB's network stack (efinet takes the firmware's DHCP answer), its
// memdisk and the SHA-256 check, built in: nothing is loaded from the network unchecked.
var netbootModules = []string{"efinet", "net", "tftp", "http", "memdisk", "tar", "hashsum", "gcry_sha256"}

// buildNetboot writes the network boot's files into dir from the image's tree.
func buildNetboot(tree, work, dir, version, slotPath, kernelArgs string, epoch time.Time) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	slot := filepath.Join(tree, filepath.FromSlash(strings.TrimPrefix(slotPath, "/")))
	// The kernel and initramfs from the slot image, which was checked against the release.
	for _, name := range []string{NetbootKernel, NetbootInitramfs} {
		os.Remove(filepath.Join(dir, name))
		if out, err := exec.Command("mcopy", "-n", "-m", "-i", slot, "::/"+name, filepath.Join(dir, name)).CombinedOutput(); err != nil {
			return fmt.Errorf("taking %s from the slot image: %w: %s", name, err, out)
		}
	}
	// The installer's archive follows the initramfs in memory, and the kernel finds an
	// archive only at a 4-byte boundary. GRUB aligns each initrd so; the kernel's EFI stub,
	// loading iPXE's initrd= files, puts them end to end: the initramfs is padded with zeros,
	// which the kernel skips after a compressed archive.
	if err := padTo4(filepath.Join(dir, NetbootInitramfs)); err != nil {
		return err
	}
	if err := writeArchive(tree, filepath.Join(dir, NetbootArchive)); err != nil {
		return err
	}
	sums := ""
	for _, name := range []string{NetbootKernel, NetbootInitramfs} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		h := sha256.Sum256(b)
		sums += hex.EncodeToString(h[:]) + "  " + name + "\n"
	}
	mb, err := os.ReadFile(filepath.Join(tree, ManifestPath))
	if err != nil {
		return err
	}
	mh := sha256.Sum256(mb)
	manifest := "sha256:" + hex.EncodeToString(mh[:])
	cfg := fmt.Sprintf("set liken_version=%s\nset liken_slot=%s\nset liken_manifest=%s\nset liken_args=%q\n", version, slotPath, manifest, kernelArgs) + netbootConfig
	var md bytes.Buffer
	tw := tar.NewWriter(&md)
	for _, f := range []struct{ name, data string }{{"grub.cfg", cfg}, {"SHA256SUMS", sums}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epoch, Format: tar.FormatUSTAR}); err != nil {
			return err
		}
		if _, err := tw.Write([]byte(f.data)); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	memdisk := filepath.Join(work, "memdisk.tar")
	if err := os.WriteFile(memdisk, md.Bytes(), 0o644); err != nil {
		return err
	}
	// The embedded configuration is read by GRUB's rescue parser, a line at a time: hand
	// over to the memdisk's at once.
	if err := bootloader.BuildEFIMemdisk(filepath.Join(dir, NetbootEFI), work, "normal (memdisk)/grub.cfg\n", memdisk, "(memdisk)", netbootModules...); err != nil {
		return err
	}
	ipxe := fmt.Sprintf(`#!ipxe
# liken's installer, release %s, booted by iPXE (chain this script by its URL, or hand it
# out as the DHCP boot file). iPXE boots the kernel and initramfs as they are served, checking
# no digest: serve them over HTTPS (iPXE trusts its CAs) or on a network you trust, or boot
# %s (GRUB), which checks them. What the installer writes is checked as from a CD.
# initrd= names the initrds for the kernel's EFI stub where iPXE hands them over as files.
kernel %s initrd=%s initrd=%s liken.install=%s liken.install.manifest=%s console=tty0 console=ttyS0,115200 panic=5 apparmor=0 %s
initrd %s
initrd %s
boot
`, version, NetbootEFI, NetbootKernel, NetbootInitramfs, NetbootArchive, slotPath, manifest, kernelArgs, NetbootInitramfs, NetbootArchive)
	return os.WriteFile(filepath.Join(dir, NetbootIPXE), []byte(ipxe), 0o644)
}

// padTo4 pads a file with zeros to a multiple of 4 bytes.
func padTo4(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if n := st.Size() % 4; n != 0 {
		return os.Truncate(p, st.Size()+4-n)
	}
	return nil
}

// writeArchive writes the image's files (all but its boot image, which a network boot does
// not use) as a newc archive under initramfs.InitrdMedium, reproducibly, renamed into place
// once whole.
func writeArchive(tree, out string) error {
	tmp := out + ".partial"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	w := cpio.NewWriter(f)
	top := strings.TrimPrefix(initramfs.InitrdMedium, "/")
	if err := w.Write(cpio.Entry{Name: top, Mode: cpio.ModeDir | 0o755}); err != nil {
		return err
	}
	err = filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tree, p)
		switch {
		case rel == ".":
			return nil
		case rel == filepath.Dir(BootImage):
			return filepath.SkipDir
		case d.IsDir():
			return w.Write(cpio.Entry{Name: top + "/" + filepath.ToSlash(rel), Mode: cpio.ModeDir | 0o755})
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return w.Write(cpio.Entry{Name: top + "/" + filepath.ToSlash(rel), Mode: cpio.ModeRegular | 0o644, Data: b})
	})
	if err == nil {
		err = w.Close()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}
