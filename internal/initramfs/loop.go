package initramfs

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// attachLoop attaches file read-only to a free loop device and returns the device.
func attachLoop(file string) (string, error) {
	return AttachLoop(file, unix.LO_FLAGS_READ_ONLY)
}

// AttachLoop attaches file to a free loop device with flags (unix.LO_FLAGS_READ_ONLY) and
// returns the device. (Not LO_FLAGS_AUTOCLEAR: that detaches the device as this function
// closes it, before anything mounts it; DetachLoop detaches it.)
func AttachLoop(file string, flags uint32) (string, error) {
	mode := os.O_RDWR
	if flags&unix.LO_FLAGS_READ_ONLY != 0 {
		mode = os.O_RDONLY
	}
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
	backing, err := os.OpenFile(file, mode, 0)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", file, err)
	}
	defer backing.Close()
	var lf *os.File
	for i := 0; i < 50; i++ { // devtmpfs creates the node as the device appears
		if lf, err = os.OpenFile(dev, mode, 0); err == nil {
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
	info := unix.LoopInfo64{Flags: flags}
	copy(info.File_name[:], filepath.Base(file))
	if err := unix.IoctlLoopSetStatus64(int(lf.Fd()), &info); err != nil {
		unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_CLR_FD, 0)
		return "", fmt.Errorf("configuring %s: %w", dev, err)
	}
	return dev, nil
}

// DetachLoop detaches a loop device AttachLoop attached, once nothing uses it.
func DetachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil {
		return fmt.Errorf("detaching %s: %w", dev, err)
	}
	return nil
}
