package datadisk

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode/utf8"
)

// LinkByID makes the /dev/disk/by-id links udev would for the disks whose identity the
// kernel shows in sysfs, and their partitions (-partN), as liken has no udev. It follows
// systemd's rules.d/60-persistent-storage.rules (v252, Debian 12's) and the programs those
// rules run (src/udev/ata_id/ata_id.c, src/udev/scsi_id/scsi_serial.c and scsi_id.c):
//   - virtio-<serial> for virtio disks;
//   - for NVMe namespaces, nvme-<model>_<serial>_<nsid>, nvme-<wwid>, and nvme-<model>_<serial>;
//   - for SATA disks (SCSI vendor "ATA", where udev runs ata_id), ata-<model>_<serial> and
//     wwn-0x<WWN> from the ATA IDENTIFY data;
//   - for other SCSI disks (where udev runs scsi_id), scsi-<serial> and wwn-0x<NAA> from
//     the device identification VPD page, else scsi-S<vendor><model><serial> from the unit
//     serial number page.
//
// The udev programs send ATA and SCSI commands to the disk; liken reads the same data from
// what the kernel kept of it (scsiIDs). A name two disks would share is made for neither: udev
// points such a link at whichever disk came last (nvme-<model>_<serial> on a controller with
// several namespaces, scsi- and wwn- on two paths to one LUN), and a disk named by it would be
// a guess. Forms not made: by-path, usb- and anything for USB disks, and the scsi-SATA_… and
// scsi-1ATA_… links sg3_utils' rules (not systemd's) add for SATA disks. CheckDevicePath
// refuses a Machine's path of a form not made here.
func LinkByID(dev, sys string) error {
	dir := filepath.Join(dev, "disk", "by-id")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	entries, err := os.ReadDir(filepath.Join(sys, "block"))
	if err != nil {
		return fmt.Errorf("listing the block devices: %w", err)
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
		return scsiIDs(base)
	}
	return nil
}

var usbBus = regexp.MustCompile(`^usb[0-9]+$`)

// scsiIDs are the links udev makes for a SCSI disk (sdX), SATA disks included. The rules
// run ata_id on a disk whose SCSI vendor is "ATA" and scsi_id on any other (or on an ATA disk
// ata_id found no model or serial for); both send INQUIRY or ATA PASS-THROUGH commands. The
// kernel sent the same INQUIRY at probe and keeps the pages it read in sysfs: device/vpd_pg83
// (device identification), vpd_pg80 (unit serial number) and, for ATA disks, vpd_pg89 (ATA
// information, whose bytes 60 to 571 are the IDENTIFY DEVICE data; libata makes it, as do the
// SAT layers of SAS HBAs). The SCSI vendor and model are device/vendor and model, which the
// kernel prints at their full INQUIRY widths of 8 and 16 characters. A page the kernel did not
// read (an old SCSI-2 device, or an ATA disk without page 0x89) gives no link rather than a
// guess at what udev would have made.
//
// USB disks get none: udev names them from the USB descriptors (usb_id) or an ATA
// pass-through through the bridge, neither of which the kernel shows.
func scsiIDs(base string) []string {
	if real, err := filepath.EvalSymlinks(base); err == nil {
		for _, part := range strings.Split(real, string(filepath.Separator)) {
			if usbBus.MatchString(part) {
				return nil
			}
		}
	}
	dev := filepath.Join(base, "device")
	vendor, model := inquiryString(dev, "vendor"), inquiryString(dev, "model")
	// udev's ATTRS{vendor}=="ATA" ignores the trailing spaces.
	if strings.TrimRight(vendor, " \t") == "ATA" {
		page, err := os.ReadFile(filepath.Join(dev, "vpd_pg89"))
		if err != nil || len(page) < 60+512 || page[1] != 0x89 {
			return nil
		}
		if ids, named := ataIDs(page[60 : 60+512]); named {
			return ids
		}
	}
	var serial, wwn string
	if page, err := os.ReadFile(filepath.Join(dev, "vpd_pg83")); err == nil {
		serial, wwn = page83(page, vendor, model)
	}
	if serial == "" {
		if page, err := os.ReadFile(filepath.Join(dev, "vpd_pg80")); err == nil {
			serial = page80(page, vendor, model)
		}
	}
	var ids []string
	if s := udevString(serial, maxSerial-1); s != "" {
		ids = append(ids, "scsi-"+s)
	}
	if wwn != "" {
		ids = append(ids, "wwn-0x"+wwn)
	}
	return ids
}

// inquiryString is a sysfs INQUIRY string as the kernel prints it ("%.8s\n"), padding kept:
// scsi_id puts the padded fields into scsi-S and scsi-0 serials before it squeezes spaces.
func inquiryString(dev, attr string) string {
	b, _ := os.ReadFile(filepath.Join(dev, attr))
	return strings.TrimSuffix(string(b), "\n")
}

// ataIDs is what ata_id exports from IDENTIFY DEVICE data (256 little-endian words), as the
// links the rules make of it: ata-$ID_SERIAL, where ID_SERIAL is <model>_<serial> (words 27-46
// and 10-19, two characters a word, high byte first), and wwn-$ID_WWN_WITH_EXTENSION from words
// 108-111 when they hold an IEEE registered NAA (word 108 starting with 5h). named is false when
// ata_id would export no ID_SERIAL, and udev goes on to scsi_id. (libata copies its host-order
// words into the page, little-endian on the machines liken runs on.)
func ataIDs(id []byte) (ids []string, named bool) {
	str := func(word, n int) string {
		b := make([]byte, n)
		for i := 0; i < n; i += 2 {
			b[i], b[i+1] = id[2*word+i+1], id[2*word+i]
		}
		return string(b)
	}
	model, serial := udevString(str(27, 40), 40), udevString(str(10, 20), 20)
	name := model
	if serial != "" {
		name = model + "_" + serial
	}
	if name == "" {
		return nil, false
	}
	ids = append(ids, "ata-"+name)
	w := func(i int) uint64 { return uint64(binary.LittleEndian.Uint16(id[2*i:])) }
	if w(108)&0xf000 == 0x5000 {
		ids = append(ids, fmt.Sprintf("wwn-0x%x", w(108)<<48|w(109)<<32|w(110)<<16|w(111)))
	}
	return ids, true
}

const (
	maxSerial = 256 // scsi_id's MAX_SERIAL_LEN, its serial buffer with the NUL
	inqBufLen = 254 // SCSI_INQ_BUFF_LEN: scsi_id asks for no more of a page than this

	idVendorSpecific, idT10Vendor, idEUI64, idNAA = 0, 1, 2, 3
	codeBinary, codeASCII                         = 1, 2
	naaAny                                        = 0xff
)

// idSearch is scsi_id's id_search_list: the designator it takes from page 0x83, the first in
// this order the page has. (Its first entry, the target port group, never names a disk.)
var idSearch = []struct{ idType, naa, code byte }{
	{idNAA, 6, codeBinary}, {idNAA, 6, codeASCII},
	{idNAA, 5, codeBinary}, {idNAA, 5, codeASCII},
	{idNAA, naaAny, codeBinary}, {idNAA, naaAny, codeASCII},
	{idEUI64, naaAny, codeBinary}, {idEUI64, naaAny, codeASCII},
	{idT10Vendor, naaAny, codeBinary}, {idT10Vendor, naaAny, codeASCII},
	{idVendorSpecific, naaAny, codeBinary}, {idVendorSpecific, naaAny, codeASCII},
}

// inquiryBuf is a VPD page as scsi_id's INQUIRY gets it: at most inqBufLen bytes, zeros after.
// (Zeros, too, past the end where scsi_id would read beyond its buffer on a malformed page.)
func inquiryBuf(page []byte) []byte {
	b := make([]byte, inqBufLen+4+255)
	copy(b[:inqBufLen], page)
	return b
}

// page83 is scsi_id's do_scsi_page83_inquiry: the serial (designator type as a hex digit,
// then the designator, binary ones in lower-case hex) and, for an NAA designator, the WWN
// with its extension.
func page83(page []byte, vendor, model string) (serial, wwn string) {
	p := inquiryBuf(page)
	if p[1] != 0x83 {
		return "", ""
	}
	if p[6] != 0 {
		// A SCSI-2 reply (some EMC Symmetrix): the page is one binary WWN, no descriptors.
		s := "3"
		for i := 0; i < int(p[3]) && len(s) < maxSerial-3; i++ {
			s += hex.EncodeToString(p[4+i : 5+i])
		}
		return s, ""
	}
	end := int(p[2])<<8 | int(p[3]) + 3
	for _, want := range idSearch {
		for j := 4; j <= end && j < inqBufLen; j += int(p[j+3]) + 4 {
			d := p[j:]
			if d[1]&0x30 != 0 || d[1]&0x0f != want.idType || d[0]&0x0f != want.code ||
				(want.naa != naaAny && want.naa != d[4]>>4) {
				continue
			}
			n := int(d[3])
			need := n + 2
			if want.code != codeASCII {
				need = 2*n + 2
			}
			if want.idType == idVendorSpecific {
				need += 8 + 16
			}
			if need > maxSerial {
				continue
			}
			s := string("0123456789abcdef"[want.idType])
			if want.idType == idVendorSpecific {
				vm := vendorModel(vendor, model)
				if vm == "" {
					continue
				}
				s += vm
			}
			ident := hex.EncodeToString(d[4 : 4+n])
			if want.code == codeASCII {
				ident = cString(string(d[4 : 4+n]))
			}
			if want.idType == idNAA && isHex(ident) {
				wwn = ident[:min(32, len(ident))]
			}
			return cString(s + ident), wwn
		}
	}
	return "", ""
}

// page80 is scsi_id's do_scsi_page80_inquiry: S, the padded vendor and model, and the unit
// serial number.
func page80(page []byte, vendor, model string) string {
	p := inquiryBuf(page)
	n := int(p[3])
	if p[1] != 0x80 || 1+8+16+n > maxSerial {
		return ""
	}
	vm := vendorModel(vendor, model)
	if vm == "" {
		return ""
	}
	return cString("S" + vm + string(p[4:4+n]))
}

// vendorModel is scsi_id's append_vendor_model: both fields at their full widths, or nothing.
func vendorModel(vendor, model string) string {
	if len(vendor) != 8 || len(model) != 16 || strings.ContainsRune(vendor+model, 0) {
		return ""
	}
	return vendor + model
}

func cString(s string) string {
	if i := strings.IndexByte(s, 0); i >= 0 {
		return s[:i]
	}
	return s
}

func isHex(s string) bool {
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return s != ""
}

// udevString is udev_replace_whitespace(s, n) then udev_replace_chars(s, NULL), as ata_id and
// scsi_id apply them to what they export: at most n bytes read, up to a NUL; leading and
// trailing whitespace dropped, each run inside one '_'; then every byte that is not a letter,
// digit, one of #+-.:=@_, a \x escape or part of a valid UTF-8 sequence becomes '_'.
func udevString(s string, n int) string {
	s = cString(s[:min(len(s), n)])
	i := 0
	for i < len(s) && strings.IndexByte(" \t\n\r", s[i]) >= 0 {
		i++
	}
	var b []byte
	space := false
	for ; i < len(s) && len(b) < n; i++ {
		if strings.IndexByte(" \t\n\v\f\r", s[i]) >= 0 { // C's isspace
			space = true
			continue
		}
		if space {
			if len(b)+1 >= n {
				break
			}
			b = append(b, '_')
			space = false
		}
		b = append(b, s[i])
	}
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("#+-.:=@_", c) >= 0:
			i++
		case c == '\\' && i+1 < len(b) && b[i+1] == 'x':
			i += 2
		default:
			if r, size := utf8.DecodeRune(b[i:]); size > 1 && r != utf8.RuneError {
				i += size
				continue
			}
			b[i] = '_'
			i++
		}
	}
	return string(b)
}

var (
	byIDPart   = regexp.MustCompile(`-part[0-9]+$`)
	virtioDisk = regexp.MustCompile(`^/dev/vd[a-z]+$`)
	kernelPart = regexp.MustCompile(`^/dev/((vd|sd|hd|xvd)[a-z]+[0-9]+|(nvme[0-9]+n|mmcblk)[0-9]+p[0-9]+)$`)
	kernelDisk = regexp.MustCompile(`^/dev/(sd[a-z]+|hd[a-z]+|nvme[0-9]+n[0-9]+)$`)
	lowerHex   = regexp.MustCompile(`^[0-9a-f]+$`)
)

// linkForms says, for messages, which by-id links init makes.
const linkForms = "/dev/disk/by-id/ followed by virtio-<serial>, nvme-<model>_<serial>_<nsid>, nvme-<wwid>, ata-<model>_<serial>, scsi-<serial> or wwn-0x<wwn>"

// CheckDevicePath says whether init finds the same disk by path at every boot: a by-id link of
// a form LinkByID makes, or a virtio disk's kernel name (virtio disks are numbered in the
// order of their PCI slots, so /dev/vdb stays while the machine's disks do, and a virtio disk
// without a serial has no other name). Whether such a link exists on a given machine depends
// on its disks; a path of any other form never names a disk there, or names whichever disk the
// kernel found in that place at this boot. `liken validate` and `liken layer` check each
// spec.disks device with it; the error says what to write instead.
func CheckDevicePath(path string) error {
	const byID = "/dev/disk/by-id/"
	switch {
	case strings.HasPrefix(path, byID):
		name := strings.TrimPrefix(path, byID)
		if m := byIDPart.FindString(name); m != "" {
			return fmt.Errorf("names a partition (%s): spec.disks takes whole disks, and makes their partitions itself; drop %q", m, m)
		}
		prefix, rest, _ := strings.Cut(name, "-")
		switch prefix {
		case "virtio", "nvme", "ata":
			if rest != "" {
				return nil
			}
		case "wwn":
			w, ok := strings.CutPrefix(rest, "0x")
			if ok && lowerHex.MatchString(w) {
				return nil
			}
			return fmt.Errorf("liken makes wwn- links as udev does, wwn-0x followed by the world wide name in lower-case hexadecimal, such as wwn-0x5000c500a1b2c3d4")
		case "scsi":
			for _, sg := range []string{"SATA_", "0ATA_", "1ATA_"} {
				if strings.HasPrefix(rest, sg) {
					return fmt.Errorf("scsi-%s… links are made for SATA disks by sg3_utils' udev rules, not systemd's, and liken does not make them: name the disk by its ata-<model>_<serial> or wwn-0x<wwn> link, as `ls -l /dev/disk/by-id` shows them on a Linux with udev", sg)
				}
			}
			// scsi_id's serials start with the designator type it found (0 to 3) or S.
			if len(rest) > 1 && strings.ContainsRune("0123S", rune(rest[0])) {
				return nil
			}
			return fmt.Errorf("liken makes scsi- links as udev's scsi_id does: scsi- then 0, 1, 2 or 3 (the type of the device's identifier) or S (its unit serial number), such as scsi-35000c500a1b2c3d4 or scsi-SSEAGATE_ST1200MM0009_Z4D0ABCD")
		case "usb":
			return fmt.Errorf("liken makes no links for USB disks (udev reads their names from the USB descriptors, which the kernel does not show): use another disk, or one of %s", linkForms)
		}
		return fmt.Errorf("liken has no udev and makes no %s- links: its init makes %s", prefix, linkForms)
	case strings.HasPrefix(path, "/dev/disk/"):
		return fmt.Errorf("liken has no udev and makes only /dev/disk/by-id links, so this path never exists: name the disk %s", linkForms)
	case virtioDisk.MatchString(path):
		return nil
	case kernelPart.MatchString(path):
		return fmt.Errorf("names a partition: spec.disks takes whole disks, and makes their partitions itself")
	case kernelDisk.MatchString(path):
		return fmt.Errorf("a kernel name, given in the order disks are found, which can change from one boot to the next (SCSI, SATA and NVMe disks are probed in parallel): name the disk %s", linkForms)
	}
	return fmt.Errorf("not a name liken resolves to a disk: name it %s, or a virtio disk /dev/vdX", linkForms)
}
