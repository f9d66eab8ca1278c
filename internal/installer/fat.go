package installer

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/host/datadisk"
	"liken.dev/liken/internal/initramfs"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/release"
)

// ImageTools are the release image's: its mke2fs and mkfs.fat (datadisk.ImageTools), and
// files put into a FAT image through a loop device and the kernel's vfat, as the image
// carries no mtools.
func ImageTools() install.Tools {
	t := datadisk.ImageTools()
	return install.Tools{Mke2fs: t.Mke2fs, MkfsFat: t.MkfsFat, PutFiles: loopPut}
}

// loopPut mounts the FAT image img on a loop device, makes dirs, copies files in, unmounts
// it and detaches the loop device.
func loopPut(img string, dirs []string, files map[string]string) (err error) {
	loop, err := initramfs.AttachLoop(img, 0)
	if err != nil {
		return err
	}
	defer func() {
		if derr := initramfs.DetachLoop(loop); derr != nil && err == nil {
			err = derr
		}
	}()
	mnt, err := os.MkdirTemp("", "liken-fat-")
	if err != nil {
		return err
	}
	defer os.Remove(mnt)
	if err := unix.Mount(loop, mnt, "vfat", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, "utf8=0"); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", img, loop, err)
	}
	defer func() {
		if uerr := unix.Unmount(mnt, 0); uerr != nil && err == nil {
			err = fmt.Errorf("unmounting %s: %w", img, uerr)
		}
	}()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(mnt, d), 0o755); err != nil {
			return err
		}
	}
	for name, src := range files {
		if _, err := release.CopyFileSum(src, filepath.Join(mnt, name)); err != nil {
			return err
		}
	}
	return nil
}
