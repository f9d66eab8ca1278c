package datadisk

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// LinkByID makes the /dev/disk/by-id links udev would for the disks whose identity the
// kernel shows in sysfs, and their partitions (-partN), as liken has no udev
// (systemd's 60-persistent-storage.rules):
//   - virtio-<serial> for virtio disks;
//   - for NVMe namespaces, nvme-<model>_<serial>_<nsid>, nvme-<wwid>, and nvme-<model>_<serial>;
//   - wwn-0x<id> for SCSI and SATA disks that report an NAA world-wide name.
//
// A name two disks would share is made for neither: udev points such a link at whichever
// disk came last (nvme-<model>_<serial> on a controller with several namespaces), and a
// disk named by it would be a guess. Other forms (ata-*, scsi-*, by-path) are not made:
// name such disks by their wwn- link.
func LinkByID(dev, sys string) error {
	dir := filepath.Join(dev, "disk", "by-id")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(filepath.Join(sys, "block"))
	if err != nil {
		return err
	}
	claims := map[string][]string{} // link name -> the disks it would name
	for _, e := range entries {
		for _, id := range diskIDs(e.Name(), filepath.Join(sys, "block", e.Name())) {
			claims[id] = append(claims[id], e.Name())
		}
	}
	for id, disks := range claims {
		if len(disks) != 1 {
			os.Remove(filepath.Join(dir, id))
			stale, _ := filepath.Glob(filepath.Join(dir, id+"-part*"))
			for _, p := range stale {
				os.Remove(p)
			}
			continue
		}
		name := disks[0]
		base := filepath.Join(sys, "block", name)
		link(dir, id, "../../"+name)
		parts, _ := os.ReadDir(base)
		for _, p := range parts {
			n, err := os.ReadFile(filepath.Join(base, p.Name(), "partition"))
			if err != nil {
				continue
			}
			link(dir, id+"-part"+strings.TrimSpace(string(n)), "../../"+p.Name())
		}
	}
	return nil
}

func link(dir, name, target string) {
	p := filepath.Join(dir, name)
	if cur, err := os.Readlink(p); err == nil && cur == target {
		return
	}
	os.Remove(p)
	os.Symlink(target, p)
}

var idUnsafe = regexp.MustCompile(`[^A-Za-z0-9#+\-.:=@_]`)

// idPart is how udev makes a sysfs string part of a link name: spaces become '_', and
// what is not a safe character is dropped.
func idPart(s string) string {
	s = strings.Join(strings.Fields(s), "_")
	return idUnsafe.ReplaceAllString(s, "")
}

func diskIDs(name, base string) []string {
	read := func(f string) string {
		b, _ := os.ReadFile(filepath.Join(base, f))
		return strings.TrimSpace(string(b))
	}
	switch {
	case strings.HasPrefix(name, "vd"):
		if s := idPart(read("serial")); s != "" {
			return []string{"virtio-" + s}
		}
	case strings.HasPrefix(name, "nvme"):
		// The namespace has nsid and wwid; model and serial are its controller's.
		var ids []string
		model, serial := idPart(read("device/model")), idPart(read("device/serial"))
		if model != "" && serial != "" {
			ids = append(ids, "nvme-"+model+"_"+serial)
			if nsid := idPart(read("nsid")); nsid != "" {
				ids = append(ids, "nvme-"+model+"_"+serial+"_"+nsid)
			}
		}
		if w := idPart(read("wwid")); w != "" {
			ids = append(ids, "nvme-"+w)
		}
		return ids
	case strings.HasPrefix(name, "sd"):
		if w, ok := strings.CutPrefix(read("device/wwid"), "naa."); ok && w != "" {
			return []string{"wwn-0x" + strings.ToLower(idPart(w))}
		}
	}
	return nil
}
