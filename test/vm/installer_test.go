package vm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/installer"
	"liken.dev/liken/internal/qemu"
	"liken.dev/liken/test/apiserver"
	"liken.dev/liken/test/report"
)

// TestInstallerInstallsAMachine (issue 29 item 1): the test release's installer image, built
// from the signed channel and the cluster's layer, in the CD drive of a machine with an
// empty disk: the firmware boots it through its El Torito EFI entry (the disk holds nothing
// to boot), GRUB finds the image by its manifest and boots the release's kernel from the
// slot image in it; the install mode finds vm-1 by its MAC, installs the one disk from the
// image's copy of the channel (checked offline against the Cluster's root) and reboots; the
// firmware boots the disk, and vm-1 joins the cluster running release A from slot A. A
// machine booted from the network with the same installer (the firmware's PXE from QEMU's
// TFTP), whose disk holds a file system, is refused: the console says why, the machine powers
// itself off, and the disk's bytes are unchanged; so is one booted from the image on a USB
// stick, whose disk is too small.
func TestInstallerInstallsAMachine(t *testing.T) {
	vmTest(t)
	j, res, _ := prepareJoin(t, apiserver.Options{}, []string{vmMachine})
	dir := t.TempDir()
	iso, net := filepath.Join(dir, "installer.iso"), filepath.Join(dir, "netboot")
	start := time.Now()
	m, err := installer.Build(t.Context(), installer.Options{
		Channel: "file://" + j.channel.dir, Pin: j.channel.pins[releaseA], Layers: []string{res.Layers[v1alpha1.RoleServer]}, Out: iso, Netboot: net,
		// A refusal's minute before the power-off, shortened for the test.
		KernelArgs: qemu.InstallArgs(false, "quiet liken.test.api="+j.guestAPI+" liken.test.node=simulated liken.test.installer-wait=2"),
	})
	if err != nil {
		t.Fatal(err)
	}
	built := time.Since(start)
	st, err := os.Stat(iso)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(disk.DefaultLayout.MinSizeMiB()+16) << 20

	// Refused, booted from the network (the same installer's network boot: QEMU's DHCP and
	// TFTP, the firmware's PXE, liken's network GRUB, which checks the kernel and initramfs
	// against the release's digests): a disk holding a file system, nothing written.
	held := filepath.Join(dir, "held.img")
	if err := os.WriteFile(held, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Truncate(held, size)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", held, "65536").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	before := imageSum(t, held)
	// The installer's files come as an initrd, unpacked into memory beside the kernel's own.
	r := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: held, Serial: "held"}}, Netboot: net, NICs: []string{vmMAC}, MemoryMiB: 2048})
	// GRUB wraps its line at the terminal's 80 columns: where it booted from follows.
	netGRUB := expect(t, r, "liken-installer: booting the installer of release "+m.Version+" from", 180*time.Second)
	expect(t, r, "(tftp,10.0.2.2)", 10*time.Second)
	// Bounds: about ten times what each step took alone (December 2026, TCG: GRUB 8 s, the
	// 152 MB archive over TFTP and the initramfs 28 s; the CD machine's install 23 s, its
	// join 56 s), for a host busy with the rest of the suite.
	netInit := expect(t, r, "liken-init: installer medium the boot loader's second initrd (/installer) mounted", 300*time.Second)
	expect(t, r, "liken-installer: refused: /dev/vda is not empty: it holds an ext2/3/4 file system. Nothing was written: to install over it, set Machine vm-1's spec.install {disk: ..., wipe: {serial: \"held\", contentID: \"sha256:", 180*time.Second)
	if _, err := r.Wait(90 * time.Second); err != nil {
		t.Fatalf("the refused machine did not power off: %v", err)
	}
	if imageSum(t, held) != before {
		t.Error("the refused disk's bytes changed")
	}

	// Refused again, booted by iPXE (QEMU's NIC ROM) running the network boot's script: the
	// same disk, still unchanged.
	x := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: held, Serial: "held"}}, Netboot: net, NetbootIPXE: true, NICs: []string{vmMAC}, MemoryMiB: 2048})
	ipxeInit := expect(t, x, "liken-init: installer medium the boot loader's second initrd (/installer) mounted", 300*time.Second)
	expect(t, x, "liken-installer: refused: /dev/vda is not empty: it holds an ext2/3/4 file system.", 180*time.Second)
	if _, err := x.Wait(90 * time.Second); err != nil {
		t.Fatalf("the refused machine did not power off: %v", err)
	}
	if imageSum(t, held) != before {
		t.Error("the refused disk's bytes changed")
	}
	report.Line("installer network boot by iPXE (TCG, QEMU's iPXE ROM and TFTP, liken.ipxe): the initramfs found the installer's files %s from QEMU's start", ipxeInit.Round(100*time.Millisecond))

	// Refused, booted from a USB stick (the same image written to it: the firmware boots
	// its GPT's EFI system partition, the initramfs finds the ISO 9660 volume on the stick's
	// whole disk): a disk too small to install on, nothing written.
	small := filepath.Join(dir, "small.img")
	if err := os.WriteFile(small, make([]byte, 64<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	u := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: small}}, USB: iso, NICs: []string{vmMAC}})
	usbGRUB := expect(t, u, "liken-installer: booting the installer of release "+m.Version, 180*time.Second)
	expect(t, u, "liken-init: installer medium /dev/sda mounted", 120*time.Second)
	usbRefused := expect(t, u, "liken-installer: refused: no disk to install on: sda (the installer's own medium), vda (64 MiB: smaller than the 3154 MiB liken needs)", 180*time.Second)
	if _, err := u.Wait(90 * time.Second); err != nil {
		t.Fatalf("the refused machine did not power off: %v", err)
	}
	if b, _ := os.ReadFile(small); !bytes.Equal(b, make([]byte, 64<<20)) {
		t.Error("the refused small disk was written")
	}
	report.Line("installer image on a USB stick (TCG, xHCI): GRUB %s, refused (a 64 MiB disk) %s from QEMU's start", usbGRUB.Round(100*time.Millisecond), usbRefused.Round(100*time.Millisecond))

	// Installed: an empty disk.
	empty := filepath.Join(dir, "vm-1.img")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Truncate(empty, size)
	vstart := time.Now()
	v := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: empty}}, CDROM: iso, NICs: []string{vmMAC}, AllowReboot: true})
	grub := expect(t, v, "liken-installer: booting the installer of release "+m.Version, 180*time.Second)
	expect(t, v, "liken-init: installer medium /dev/sr0 mounted", 120*time.Second)
	expect(t, v, "liken-installer: this is Machine vm-1 (server, found by MAC 52:54:00:12:34:01); installing release "+releaseA+" on /dev/vda (the one disk that can be the install disk", 240*time.Second)
	expect(t, v, "install: release "+releaseA+" ("+j.channel.pins[releaseA]+") is what the channel's keys signed", 60*time.Second)
	installed := expect(t, v, "liken-installer: installed Machine vm-1 on /dev/vda in", 240*time.Second)
	expect(t, v, "liken-grub: booting slot A (trial 0)", 180*time.Second)
	j.disk = empty
	j.waitMachine(t, "release A running from slot A after the installer", 5*time.Minute, func(m *v1alpha1.Machine) bool {
		return running(m, "A", releaseA)
	})
	joinedAt := time.Since(vstart)
	report.Line("installer image (ISO 9660 + El Torito EFI + GPT for USB) of release %s and one layer: %d bytes, built with its network boot in %s; booted as a CD (TCG): GRUB %s, installed %s, the installed machine joined %s from QEMU's start",
		m.Version, st.Size(), built.Round(100*time.Millisecond), grub.Round(100*time.Millisecond), installed.Round(100*time.Millisecond), joinedAt.Round(time.Second))
	arch, _ := os.Stat(filepath.Join(net, installer.NetbootArchive))
	report.Line("installer network boot (TCG, QEMU's TFTP, the firmware's PXE): GRUB %s, the initramfs found the installer's files (an initrd of %d bytes) %s from QEMU's start",
		netGRUB.Round(100*time.Millisecond), arch.Size(), netInit.Round(100*time.Millisecond))
}

// imageSum is the SHA-256 of a whole disk image.
func imageSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
