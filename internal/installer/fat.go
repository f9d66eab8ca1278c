package installer

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/host/datadisk"
	"liken.dev/liken/internal/install"
)

// ImageTools are the release image's: its mke2fs and mkfs.fat (datadisk.ImageTools), and
// files put into a FAT image through a loop device and the kernel's vfat, as the image
// carries no mtools.
func ImageTools() install.Tools {
	t := datadisk.ImageTools()
	return install.Tools{Mke2fs: t.Mke2fs, MkfsFat: t.MkfsFat, PutFiles: loopPut}
}

// loopPut mounts the FAT image img on a loop device, makes dirs, copies files in, and
// unmounts it (the loop device goes with the mount: LO_FLAGS_AUTOCLEAR).
func loopPut(img string, dirs []string, files map[string]string) (err error) {
	loop, err := attach(img)
	if err != nil {
		return err
	}
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
		if err := copyTo(src, filepath.Join(mnt, name)); err != nil {
			return err
		}
	}
	return nil
}

func copyTo(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// attach attaches file read-write to a free loop device that detaches itself when its
// last user (the mount) goes.
func attach(file string) (string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("opening /dev/loop-control: %w", err)
	}
	defer ctl.Close()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		return "", fmt.Errorf("finding a free loop device: %w", err)
	}
	dev := fmt.Sprintf("/dev/loop%d", n)
	backing, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer backing.Close()
	var lf *os.File
	for i := 0; i < 50; i++ { // devtmpfs creates the node as the device appears
		if lf, err = os.OpenFile(dev, os.O_RDWR, 0); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", dev, err)
	}
	defer lf.Close()
	if err := unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_SET_FD, int(backing.Fd())); err != nil {
		return "", fmt.Errorf("attaching %s to %s: %w", file, dev, err)
	}
	info := unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}
	copy(info.File_name[:], filepath.Base(file))
	if err := unix.IoctlLoopSetStatus64(int(lf.Fd()), &info); err != nil {
		unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_CLR_FD, 0)
		return "", fmt.Errorf("configuring %s: %w", dev, err)
	}
	return dev, nil
}
