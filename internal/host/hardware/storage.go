package hardware

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"liken.dev/liken/api/v1alpha1"
)

// partitions lists a disk's partitions (sysfs's block/<disk>/<disk>N), each with its GPT
// name, its file system (from the mount table, else its superblock), where it is mounted and
// its free space.
func (h Host) partitions(disk string, mounts map[string]mount) []v1alpha1.PartitionInfo {
	var out []v1alpha1.PartitionInfo
	for _, name := range h.list("block/" + disk) {
		base := "block/" + disk + "/" + name
		if h.read(base+"/partition") == "" {
			continue
		}
		sectors, _ := strconv.ParseInt(h.read(base+"/size"), 10, 64)
		p := v1alpha1.PartitionInfo{Name: name, Label: uevent(h.read(base+"/uevent"), "PARTNAME"), SizeBytes: sectors * 512}
		if m, ok := mounts[name]; ok {
			p.Filesystem, p.MountPoint = m.fstype, m.point
			var st unix.Statfs_t
			if h.Statfs != nil {
				if err := h.Statfs(m.point, &st); err == nil && p.SizeBytes > 0 {
					free := int64(st.Bavail) * int64(st.Bsize)
					step := max(p.SizeBytes/100, 1)
					p.FreeBytes = free / step * step
				}
			}
		} else if h.Dev != "" {
			p.Filesystem = probe(filepath.Join(h.Dev, name))
		}
		out = append(out, p)
	}
	return out
}

func uevent(text, key string) string {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v
		}
	}
	return ""
}

type mount struct{ point, fstype string }

// mounts reads the mount table (proc's self/mountinfo): each block device's first mount
// point, by kernel name.
func (h Host) mounts() map[string]mount {
	f, err := os.Open(filepath.Join(h.Proc, "self", "mountinfo"))
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]mount{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 2 || !strings.HasPrefix(tail[1], "/dev/") {
			continue
		}
		name := strings.TrimPrefix(tail[1], "/dev/")
		if _, seen := out[name]; !seen {
			out[name] = mount{point: UnescapeMount(fields[4]), fstype: tail[0]}
		}
	}
	return out
}

// UnescapeMount undoes the octal escapes of the kernel's mount tables (\040 for a space).
func UnescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// probe names the file system on an unmounted partition by its superblock's magic.
func probe(dev string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 2048)
	n, _ := f.ReadAt(b, 0)
	b = b[:n]
	switch {
	case len(b) >= 1082 && b[1080] == 0x53 && b[1081] == 0xEF:
		return "ext4" // ext2/3/4 share the magic; liken makes ext4
	case len(b) >= 4 && string(b[:4]) == "hsqs":
		return "squashfs"
	case len(b) >= 90 && (string(b[82:87]) == "FAT32" || string(b[54:59]) == "FAT16" || string(b[54:59]) == "FAT12"):
		return "vfat"
	}
	return ""
}
