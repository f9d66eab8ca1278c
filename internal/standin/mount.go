package standin

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// mountFlags are mount(8)'s options that are flags of mount(2); the rest of -o goes to the
// file system as its data (util-linux's meaning of each).
var mountFlags = map[string]struct {
	set   uintptr
	clear bool // the option turns the flag off
}{
	"ro": {unix.MS_RDONLY, false}, "rw": {unix.MS_RDONLY, true},
	"nosuid": {unix.MS_NOSUID, false}, "suid": {unix.MS_NOSUID, true},
	"nodev": {unix.MS_NODEV, false}, "dev": {unix.MS_NODEV, true},
	"noexec": {unix.MS_NOEXEC, false}, "exec": {unix.MS_NOEXEC, true},
	"sync": {unix.MS_SYNCHRONOUS, false}, "async": {unix.MS_SYNCHRONOUS, true},
	"noatime": {unix.MS_NOATIME, false}, "atime": {unix.MS_NOATIME, true},
	"nodiratime": {unix.MS_NODIRATIME, false}, "diratime": {unix.MS_NODIRATIME, true},
	"relatime": {unix.MS_RELATIME, false}, "norelatime": {unix.MS_RELATIME, true},
	"strictatime": {unix.MS_STRICTATIME, false},
	"remount":     {unix.MS_REMOUNT, false},
	"bind":        {unix.MS_BIND, false}, "rbind": {unix.MS_BIND | unix.MS_REC, false},
	"defaults": {0, false},
}

// propagation are mount(8)'s propagation options and --make-* flags.
var propagation = map[string]uintptr{
	"private": unix.MS_PRIVATE, "rprivate": unix.MS_PRIVATE | unix.MS_REC,
	"shared": unix.MS_SHARED, "rshared": unix.MS_SHARED | unix.MS_REC,
	"slave": unix.MS_SLAVE, "rslave": unix.MS_SLAVE | unix.MS_REC,
	"unbindable": unix.MS_UNBINDABLE, "runbindable": unix.MS_UNBINDABLE | unix.MS_REC,
}

// MountMain is the stand-in run as mount or umount: the kubelet mounts every pod's
// service-account token and secret volumes (tmpfs) and bind mounts with mount(8) through
// PATH, and liken's image has no util-linux. k3s puts busybox's mount in bin/aux for the
// same reason; the stand-in's data directory has itself there, doing what the kubelet asks
// of mount(8) and umount(8) with mount(2) and umount2(2).
func MountMain(argv0 string, args []string, stderr io.Writer) (int, bool) {
	var err error
	switch filepath.Base(argv0) {
	case "mount":
		err = mount(args)
	case "umount":
		err = umount(args)
	default:
		return 0, false
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s (k3s-standin): %v\n", filepath.Base(argv0), err)
		return 32, true // mount(8)'s "mount failure"
	}
	return 0, true
}

// mount does `mount [--bind|--rbind|--make-*] [-t TYPE] [-o OPTIONS] [SOURCE] TARGET`.
func mount(args []string) error {
	var fstype string
	var opts []string
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-t" || a == "-o":
			if i+1 >= len(args) {
				return fmt.Errorf("option %s needs an argument", a)
			}
			if a == "-t" {
				fstype = args[i+1]
			} else {
				opts = append(opts, strings.Split(args[i+1], ",")...)
			}
			i++
		case a == "--bind" || a == "-B":
			opts = append(opts, "bind")
		case a == "--rbind" || a == "-R":
			opts = append(opts, "rbind")
		case strings.HasPrefix(a, "--make-"):
			opts = append(opts, strings.TrimPrefix(a, "--make-"))
		case a == "-n" || a == "--no-mtab" || a == "-c" || a == "--no-canonicalize":
			// no mtab to write; paths are taken as given
		case strings.HasPrefix(a, "-") && a != "-":
			return fmt.Errorf("option %s: not one the stand-in's mount knows", a)
		default:
			pos = append(pos, a)
		}
	}
	var flags, prop uintptr
	var data []string
	for _, o := range opts {
		if f, ok := mountFlags[o]; ok {
			if f.clear {
				flags &^= f.set
			} else {
				flags |= f.set
			}
		} else if p, ok := propagation[o]; ok {
			prop |= p
		} else if o != "" {
			data = append(data, o)
		}
	}
	var source, target string
	switch len(pos) {
	case 1:
		target = pos[0]
	case 2:
		source, target = pos[0], pos[1]
	default:
		return errors.New("usage: mount [-t TYPE] [-o OPTIONS] [SOURCE] TARGET")
	}
	if source == "" && flags&(unix.MS_REMOUNT|unix.MS_BIND) == 0 && prop == 0 {
		return errors.New("no source to mount (the stand-in's mount reads no fstab)")
	}
	if flags&unix.MS_BIND != 0 && flags&unix.MS_REMOUNT == 0 {
		// A bind mount takes no other flags at once: mount(8) binds, then remounts the bind
		// with them.
		if err := unix.Mount(source, target, "", flags&(unix.MS_BIND|unix.MS_REC), ""); err != nil {
			return fmt.Errorf("binding %s to %s: %w", source, target, err)
		}
		if rest := flags &^ (unix.MS_BIND | unix.MS_REC); rest != 0 {
			if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|rest, ""); err != nil {
				return fmt.Errorf("remounting the bind of %s with %v: %w", target, opts, err)
			}
		}
	} else if source != "" || flags != 0 {
		if err := unix.Mount(source, target, fstype, flags, strings.Join(data, ",")); err != nil {
			return fmt.Errorf("mounting %s (%s) on %s: %w", source, fstype, target, err)
		}
	}
	if prop != 0 {
		if err := unix.Mount("", target, "", prop, ""); err != nil {
			return fmt.Errorf("changing %s's propagation: %w", target, err)
		}
	}
	return nil
}

// umount does `umount [-f] [-l] TARGET`, saying "not mounted" as umount(8) does when TARGET
// is no mount point (the kubelet looks for those words).
func umount(args []string) error {
	var flags int
	var targets []string
	for _, a := range args {
		switch a {
		case "-f", "--force":
			flags |= unix.MNT_FORCE
		case "-l", "--lazy":
			flags |= unix.MNT_DETACH
		case "-n", "--no-mtab", "-c", "--no-canonicalize":
		default:
			if strings.HasPrefix(a, "-") {
				return fmt.Errorf("option %s: not one the stand-in's umount knows", a)
			}
			targets = append(targets, a)
		}
	}
	if len(targets) != 1 {
		return errors.New("usage: umount [-f] [-l] TARGET")
	}
	if err := unix.Unmount(targets[0], flags); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("%s: not mounted", targets[0])
		}
		return fmt.Errorf("%s: %w", targets[0], err)
	}
	return nil
}
