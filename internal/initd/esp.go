package initd

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/host/hardware"
	"liken.dev/liken/internal/initramfs"
)

const espMount = "/run/liken/esp"

// espOwner is the one owner of the ESP in init: every read and write of it (the boot's
// kernel arguments, boot info, slot records, arming and committing a trial) mounts it
// through with, one at a time, so GRUB's environment has a single writer, as its
// torn-write proof assumes. The ESP is mounted only while it is read or written, so a power
// cut almost never finds it mounted.
//
// A mount can be left behind: anything that looks at the mount point while it is unmounted
// (the agent's inventory calls statfs on every mounted partition) makes the unmount fail
// with EBUSY. Before this owner, that left the ESP mounted and every later mount failed
// with EBUSY for the rest of the boot. Now the unmount is retried, then detached, and a
// mount found in place is taken down before the next.
type espOwner struct {
	mu  sync.Mutex
	dir string
	// device finds the ESP's block device.
	device func() (string, error)
	log    io.Writer
	// fstype is the ESP's file system: vfat, but for host tests on a kernel without it.
	fstype string
	// private: dir is its own mount with private propagation (made at the first use).
	private bool
}

func newESPOwner(log io.Writer) *espOwner {
	return &espOwner{dir: espMount, log: log, fstype: "vfat", device: func() (string, error) {
		return initramfs.WaitForDevice("PARTLABEL="+disk.ESP, 10*time.Second)
	}}
}

// with mounts the ESP for fn, alone.
func (o *espOwner) with(fn func(bootloader.ESP) error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	dev, err := o.device()
	if err != nil {
		return fmt.Errorf("finding the ESP: %w", err)
	}
	if err := o.prepare(); err != nil {
		return err
	}
	if mountsAt(o.dir) > 1 {
		fmt.Fprintf(o.log, "liken-init: the ESP was left mounted at %s; unmounting it first\n", o.dir)
		if err := o.unmount(); err != nil {
			return err
		}
	}
	if err := unix.Mount(dev, o.dir, o.fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting the ESP %s: %w", dev, err)
	}
	ferr := fn(bootloader.ESP{Dir: o.dir})
	unix.Sync()
	if err := o.unmount(); err != nil && ferr == nil {
		ferr = err
	}
	return ferr
}

// prepare makes dir a mount of its own with private propagation, once: the ESP mounted
// on it then appears in no other mount namespace (k3s's pods with host mounts), where a
// copy held busy would make its unmount fail.
func (o *espOwner) prepare() error {
	if o.private {
		return nil
	}
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return fmt.Errorf("making the ESP's mount point: %w", err)
	}
	for mountsAt(o.dir) > 0 {
		fmt.Fprintf(o.log, "liken-init: %s was left mounted; unmounting it first\n", o.dir)
		if err := o.unmount(); err != nil {
			return err
		}
	}
	if err := unix.Mount(o.dir, o.dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the ESP's mount point: %w", err)
	}
	if err := unix.Mount("", o.dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the ESP's mount point private: %w", err)
	}
	o.private = true
	return nil
}

// unmount takes the ESP down from dir. A busy mount (a statfs or open file of another
// process) is retried for about a second, then detached: the file system was synced, the
// mount point is free for the next mount at once, and the kernel drops the mount when its
// last user lets go.
func (o *espOwner) unmount() error {
	var err error
	for i := range 10 {
		if err = unix.Unmount(o.dir, 0); err == nil || !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(time.Duration(10*(i+1)) * time.Millisecond)
	}
	if errors.Is(err, unix.EBUSY) {
		fmt.Fprintf(o.log, "liken-init: the ESP at %s stayed busy; detaching it\n", o.dir)
		err = unix.Unmount(o.dir, unix.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmounting the ESP: %w", err)
	}
	return nil
}

// release undoes prepare (for tests, which mount in a temporary directory).
func (o *espOwner) release() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for mountsAt(o.dir) > 0 {
		if unix.Unmount(o.dir, unix.MNT_DETACH) != nil {
			break
		}
	}
	o.private = false
}

// mountsAt counts the mounts on dir itself: prepare's private bind mount at the bottom,
// and any ESP stacked on it.
func mountsAt(dir string) int {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && hardware.UnescapeMount(fields[4]) == dir {
			n++
		}
	}
	return n
}
