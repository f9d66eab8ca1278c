package initramfs

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MediumDir is where the initramfs mounts the installer image (internal/installer) it
// booted from; under /run, so the booted system's install mode finds it there.
const MediumDir = "/run/liken/medium"

// InstallerVolume is the installer image's ISO 9660 volume name (installer.VolumeID).
const InstallerVolume = "LIKEN_INSTALL"

// InitrdMedium is where a network-booted installer's files are: the kernel unpacked them
// from the second initrd the boot loader gave it (installer.NetbootArchive) into the
// initramfs. They stay there (freeInitramfs keeps them) and are bound onto MediumDir, so the
// install mode reads them as it reads a CD.
const InitrdMedium = "/installer"

// isoVolume is the volume name of an ISO 9660 file system on dev ("" if it holds none):
// the primary volume descriptor is the 2048-byte sector 16, "\x01CD001" then, at byte 40,
// the volume identifier padded with spaces (ECMA-119, 8.4).
func isoVolume(dev string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 2048)
	if _, err := f.ReadAt(b, 16*2048); err != nil || string(b[:6]) != "\x01CD001" {
		return ""
	}
	return strings.TrimRight(string(b[40:72]), " ")
}

// findMedium finds the installer image among the block devices: a CD (sr*), or a USB stick
// or disk written with it, whose whole device is the same ISO 9660 volume. Whole devices
// are looked at before partitions.
func findMedium(timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		entries, _ := os.ReadDir("/sys/class/block")
		var whole, parts []string
		for _, e := range entries {
			if _, err := os.Stat(filepath.Join("/sys/class/block", e.Name(), "partition")); err == nil {
				parts = append(parts, e.Name())
			} else {
				whole = append(whole, e.Name())
			}
		}
		sort.Strings(whole)
		sort.Strings(parts)
		for _, name := range append(whole, parts...) {
			if isoVolume("/dev/"+name) == InstallerVolume {
				return "/dev/" + name, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no installer medium (an ISO 9660 volume named %s) appeared within %s: the CD or USB stick this machine booted from is not seen by liken's kernel (its drive's driver is not among the boot modules?)", InstallerVolume, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mountInstaller mounts the installer medium read-only on MediumDir and attaches the slot
// image it carries (slot, a path in the medium, as the installer's GRUB gave it in
// liken.install=) to a loop device, which it returns: the slot the installer boots.
func mountInstaller(log io.Writer, slot string) (string, error) {
	if err := os.MkdirAll(MediumDir, 0o755); err != nil {
		return "", err
	}
	var dev string
	if _, err := os.Stat(filepath.Join(InitrdMedium, "liken")); err == nil {
		// Network boot: the files came as an initrd.
		dev = "the boot loader's second initrd (" + InitrdMedium + ")"
		if err := unix.Mount(InitrdMedium, MediumDir, "", unix.MS_BIND, ""); err != nil {
			return "", fmt.Errorf("binding %s onto %s: %w", InitrdMedium, MediumDir, err)
		}
		unix.Mount("", MediumDir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
	} else {
		var err error
		if dev, err = findMedium(60 * time.Second); err != nil {
			return "", err
		}
		if err := unix.Mount(dev, MediumDir, "iso9660", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
			return "", fmt.Errorf("mounting the installer medium %s: %w", dev, err)
		}
	}
	img := filepath.Join(MediumDir, filepath.Clean("/"+slot))
	loop, err := attachLoop(img)
	if err != nil {
		return "", fmt.Errorf("the installer's slot image %s: %w", slot, err)
	}
	fmt.Fprintf(log, "liken-init: installer medium %s mounted on %s; its slot image %s on %s\n", dev, MediumDir, slot, loop)
	return loop, nil
}
