package datadisk

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// LinkByID makes the /dev/disk/by-id links udev would for the disks whose identity the
// kernel shows in sysfs, and their partitions (-partN), as liken has no udev:
//   - virtio-<serial> for virtio disks (udev's 60-persistent-storage.rules);
//   - nvme-<model>_<serial> for NVMe namespaces;
//   - wwn-0x<id> for SCSI and SATA disks that report an NAA world-wide name.
//
// Other forms (ata-*, scsi-*, by-path) are not made: name such disks by their wwn- link.
func LinkByID(dev, sys string) error {
	dir := filepath.Join(dev, "disk", "by-id")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(filepath.Join(sys, "block"))
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		base := filepath.Join(sys, "block", name)
		for _, id := range diskIDs(name, base) {
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
		model, serial := idPart(read("device/model")), idPart(read("device/serial"))
		if model != "" && serial != "" {
			return []string{"nvme-" + model + "_" + serial}
		}
	case strings.HasPrefix(name, "sd"):
		if w, ok := strings.CutPrefix(read("device/wwid"), "naa."); ok && w != "" {
			return []string{"wwn-0x" + strings.ToLower(idPart(w))}
		}
	}
	return nil
}
