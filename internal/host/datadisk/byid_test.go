package datadisk

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// vpd is a VPD page as the kernel keeps it in sysfs (device/vpd_pgXX): a 4-byte header with
// the page code and length, then the body.
func vpd(code byte, body ...[]byte) []byte {
	b := []byte{0, code, 0, 0}
	for _, p := range body {
		b = append(b, p...)
	}
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)-4))
	return b
}

// designator is one identification descriptor of page 0x83: code set (1 binary, 2 ASCII),
// association and type (0x00 | type for the logical unit, 0x10 | type for the target port).
func designator(code, assocType byte, id []byte) []byte {
	return append([]byte{code, assocType, 0, byte(len(id))}, id...)
}

// ataPage89 is libata's ATA information page: IDENTIFY DEVICE data at bytes 60-571, strings
// two characters a word, the first in the high byte, words little-endian.
func ataPage89(model, serial string, wwn [4]uint16) []byte {
	id := make([]byte, 512)
	str := func(word int, s string, n int) {
		s += strings.Repeat(" ", n-len(s))
		for i := 0; i < n; i += 2 {
			id[2*word+i+1], id[2*word+i] = s[i], s[i+1]
		}
	}
	str(27, model, 40)
	str(10, serial, 20)
	for i, w := range wwn {
		binary.LittleEndian.PutUint16(id[2*(108+i):], w)
	}
	p := make([]byte, 60, 572)
	p[1], p[2], p[3] = 0x89, 0x02, 0x38
	return append(p, id...)
}

// TestLinkByID builds a sysfs tree as the kernel shows it and checks the exact set of links
// udev's rules would make (and the programs they run, ata_id and scsi_id, would name), except a
// name two disks would share, which names neither, and what liken cannot read from sysfs.
func TestLinkByID(t *testing.T) {
	sys, dev := t.TempDir(), t.TempDir()
	putRaw := func(p string, v []byte) {
		p = filepath.Join(sys, "block", p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, v, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put := func(p, v string) { putRaw(p, []byte(v+"\n")) }
	put("vda/serial", "data1")
	put("vda/vda1/partition", "1")
	// Two namespaces of one controller: model and serial are the controller's.
	for _, ns := range []string{"1", "2"} {
		put("nvme0n"+ns+"/device/model", "Samsung SSD 980     ")
		put("nvme0n"+ns+"/device/serial", "S64 ABC")
		put("nvme0n"+ns+"/nsid", ns)
		put("nvme0n"+ns+"/wwid", "eui.000"+ns)
	}
	put("nvme0n1/nvme0n1p1/partition", "1")
	put("nvme1n1/device/model", "X")
	put("nvme1n1/device/serial", "Y")
	put("nvme1n1/nsid", "1")

	// A SAS disk: scsi_id takes the logical unit's NAA designator, not the T10 vendor one
	// listed before it, nor the target port's NAA (association 1).
	put("sda/device/vendor", "SEAGATE ")
	put("sda/device/model", "ST1200MM0009    ")
	putRaw("sda/device/vpd_pg83", vpd(0x83,
		designator(2, 0x01, []byte("SEAGATE ST1200MM0009    Z4D0ABCD")),
		designator(1, 0x13, []byte{0x50, 0x00, 0xc5, 0x00, 0xa1, 0xb2, 0xc3, 0xff}),
		designator(1, 0x03, []byte{0x50, 0x00, 0xc5, 0x00, 0xa1, 0xb2, 0xc3, 0xd4})))
	putRaw("sda/device/vpd_pg80", vpd(0x80, []byte("Z4D0ABCD")))
	put("sda/sda1/partition", "1")
	// A SATA disk on libata: ata_id's model (all 40 characters, not the SCSI model's 16) and
	// serial (right-aligned, as drives send it), its WWN; no scsi- link, though the kernel has
	// the SCSI pages too.
	put("sdb/device/vendor", "ATA     ")
	put("sdb/device/model", "WDC WD40EFRX-68N")
	putRaw("sdb/device/vpd_pg89", ataPage89("WDC WD40EFRX-68N32N0", "     WD-WCC7K1234567", [4]uint16{0x5001, 0x4ee0, 0x6b2c, 0x3d40}))
	putRaw("sdb/device/vpd_pg83", vpd(0x83, designator(1, 0x03, []byte{0x50, 0x01, 0x4e, 0xe0, 0x6b, 0x2c, 0x3d, 0x40})))
	putRaw("sdb/device/vpd_pg80", vpd(0x80, []byte("     WD-WCC7K1234567")))
	put("sdb/sdb2/partition", "2")
	// A QEMU scsi-hd: a vendor-specific ASCII designator, which scsi_id prefixes with the
	// padded vendor and model.
	put("sdc/device/vendor", "QEMU    ")
	put("sdc/device/model", "QEMU HARDDISK   ")
	putRaw("sdc/device/vpd_pg83", vpd(0x83, designator(2, 0x00, []byte("drive-scsi0-0-0-0"))))
	// No page 0x83: the unit serial number, after S, the vendor and the model.
	put("sdd/device/vendor", "HP      ")
	put("sdd/device/model", "LOGICAL VOLUME  ")
	putRaw("sdd/device/vpd_pg80", vpd(0x80, []byte("PDNLH0BRH9Z0L8")))
	// An ATA disk without page 0x89: udev's ata_id would read IDENTIFY; liken makes nothing
	// rather than the scsi- and wwn- links udev would not make.
	put("sde/device/vendor", "ATA     ")
	put("sde/device/model", "ST4000NM0035-1V4")
	putRaw("sde/device/vpd_pg83", vpd(0x83, designator(1, 0x03, []byte{0x50, 0x00, 0xc5, 0x00, 0xb0, 0xb0, 0xb0, 0xb0})))
	// Two paths to one LUN (multipath): its names name neither.
	lun := []byte{0x60, 0x05, 0x07, 0x68, 0x02, 0x80, 0x88, 0x44, 0xe0, 0, 0, 0, 0, 0, 0x0a, 0x1b}
	for _, d := range []string{"sdf", "sdg"} {
		put(d+"/device/vendor", "IBM     ")
		put(d+"/device/model", "2145            ")
		putRaw(d+"/device/vpd_pg83", vpd(0x83, designator(1, 0x03, lun)))
	}
	// An NAA 6 designator: 16 bytes, the WWN with its vendor extension.
	lun[15] = 0x1c
	put("sdh/device/vendor", "IBM     ")
	put("sdh/device/model", "2145            ")
	putRaw("sdh/device/vpd_pg83", vpd(0x83, designator(1, 0x03, lun)))
	// A SATA disk in a USB enclosure: no links (udev names it through the bridge).
	usbDev := filepath.Join(sys, "devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdi")
	if err := os.MkdirAll(filepath.Join(usbDev, "device"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdi", filepath.Join(sys, "block", "sdi")); err != nil {
		t.Fatal(err)
	}
	put("sdi/device/vendor", "ATA     ")
	put("sdi/device/model", "Samsung SSD 870 ")
	putRaw("sdi/device/vpd_pg89", ataPage89("Samsung SSD 870 EVO 1TB", "S6PTNZ0R123456", [4]uint16{0x5002, 0x538f, 0x4242, 0x4242}))

	// Links left from before, which are ambiguous now.
	byID := filepath.Join(dev, "disk", "by-id")
	os.MkdirAll(byID, 0o755)
	os.Symlink("../../nvme0n2", filepath.Join(byID, "nvme-Samsung_SSD_980_S64_ABC"))
	os.Symlink("../../nvme0n1p1", filepath.Join(byID, "nvme-Samsung_SSD_980_S64_ABC-part1"))
	os.Symlink("../../sdf", filepath.Join(byID, "wwn-0x6005076802808844e000000000000a1b"))

	if err := LinkByID(dev, sys); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"virtio-data1":                         "../../vda",
		"virtio-data1-part1":                   "../../vda1",
		"nvme-Samsung_SSD_980_S64_ABC_1":       "../../nvme0n1",
		"nvme-Samsung_SSD_980_S64_ABC_1-part1": "../../nvme0n1p1",
		"nvme-Samsung_SSD_980_S64_ABC_2":       "../../nvme0n2",
		"nvme-eui.0001":                        "../../nvme0n1",
		"nvme-eui.0001-part1":                  "../../nvme0n1p1",
		"nvme-eui.0002":                        "../../nvme0n2",
		"nvme-X_Y":                             "../../nvme1n1",
		"nvme-X_Y_1":                           "../../nvme1n1",

		"scsi-35000c500a1b2c3d4":       "../../sda",
		"scsi-35000c500a1b2c3d4-part1": "../../sda1",
		"wwn-0x5000c500a1b2c3d4":       "../../sda",
		"wwn-0x5000c500a1b2c3d4-part1": "../../sda1",

		"ata-WDC_WD40EFRX-68N32N0_WD-WCC7K1234567":       "../../sdb",
		"ata-WDC_WD40EFRX-68N32N0_WD-WCC7K1234567-part2": "../../sdb2",
		"wwn-0x50014ee06b2c3d40":                         "../../sdb",
		"wwn-0x50014ee06b2c3d40-part2":                   "../../sdb2",

		"scsi-0QEMU_QEMU_HARDDISK_drive-scsi0-0-0-0": "../../sdc",
		"scsi-SHP_LOGICAL_VOLUME_PDNLH0BRH9Z0L8":     "../../sdd",

		"scsi-36005076802808844e000000000000a1c": "../../sdh",
		"wwn-0x6005076802808844e000000000000a1c": "../../sdh",
	}
	entries, err := os.ReadDir(byID)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(byID, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Name())
		if want[e.Name()] != target {
			t.Errorf("%s -> %s; want %q", e.Name(), target, want[e.Name()])
		}
		// What init makes, validation must take (partitions aside: spec.disks takes disks).
		if !byIDPart.MatchString(e.Name()) {
			if err := CheckDevicePath("/dev/disk/by-id/" + e.Name()); err != nil {
				t.Errorf("CheckDevicePath refuses a link LinkByID makes, %s: %v", e.Name(), err)
			}
		}
	}
	if len(got) != len(want) {
		sort.Strings(got)
		t.Errorf("links made: %s; want %d", strings.Join(got, " "), len(want))
	}
}

// TestUdevString checks the string clean-up ata_id and scsi_id apply (udev_replace_whitespace,
// then udev_replace_chars): runs of whitespace become one '_', unsafe bytes become '_' (they
// are not dropped), valid UTF-8 and \x escapes stay.
func TestUdevString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"  WDC WD40EFRX-68N32N0   ", "WDC_WD40EFRX-68N32N0"},
		{"a \t\n b", "a_b"},
		{"INTEL SSDSC2KB480G8/X,1", "INTEL_SSDSC2KB480G8_X_1"},
		{"Disque\u00e9", "Disque\u00e9"},
		{"bad\xffbyte", "bad_byte"},
		{`a\x20b`, `a\x20b`},
		{"cut\x00here", "cut"},
	} {
		if got := udevString(tc.in, 255); got != tc.want {
			t.Errorf("udevString(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// At most n bytes are read, as ata_id reads the 20-byte serial field.
	if got := udevString("ABCDEFGHIJKLMNOPQRSTUVWXYZ", 20); got != "ABCDEFGHIJKLMNOPQRST" {
		t.Errorf("udevString of 26 letters in 20 = %q", got)
	}
}

func TestCheckDevicePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want string // "" = accepted; else a part of the refusal
	}{
		{"/dev/disk/by-id/virtio-data1", ""},
		{"/dev/disk/by-id/nvme-eui.0025385b71b07e2f", ""},
		{"/dev/disk/by-id/nvme-Samsung_SSD_980_1TB_S649NF0R123456_1", ""},
		{"/dev/disk/by-id/ata-ST4000NM0035-1V4107_ZC1234AB", ""},
		{"/dev/disk/by-id/scsi-35000c500a1b2c3d4", ""},
		{"/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_drive-scsi0-0-0-0", ""},
		{"/dev/disk/by-id/scsi-SHP_LOGICAL_VOLUME_PDNLH0BRH9Z0L8", ""},
		{"/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", ""},
		{"/dev/vdb", ""},
		{"/dev/disk/by-id/wwn-0x5000C500A1B2C3D4", "lower-case"},
		{"/dev/disk/by-id/wwn-5000c500a1b2c3d4", "wwn-0x"},
		{"/dev/disk/by-id/scsi-SATA_ST4000NM0035-1V4_ZC1234AB", "sg3_utils"},
		{"/dev/disk/by-id/scsi-1ATA_ST4000NM0035-1V4107_ZC1234AB", "sg3_utils"},
		{"/dev/disk/by-id/scsi-9nothing", "scsi_id"},
		{"/dev/disk/by-id/usb-SanDisk_Ultra_4C530001", "USB"},
		{"/dev/disk/by-id/md-uuid-1234", "no md- links"},
		{"/dev/disk/by-id/ata-", "no ata- links"},
		{"/dev/disk/by-id/ata-ST4000NM0035-1V4107_ZC1234AB-part1", "partition"},
		{"/dev/disk/by-path/pci-0000:00:1f.2-ata-1", "only /dev/disk/by-id"},
		{"/dev/disk/by-uuid/0a1b2c3d", "only /dev/disk/by-id"},
		{"/dev/sdb", "kernel name"},
		{"/dev/nvme1n1", "kernel name"},
		{"/dev/sdb1", "partition"},
		{"/dev/nvme0n1p2", "partition"},
		{"/dev/vdb1", "partition"},
		{"/dev/mapper/data", "not a name liken resolves"},
	} {
		err := CheckDevicePath(tc.path)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s refused: %v", tc.path, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v; want a refusal saying %q", tc.path, err, tc.want)
		}
	}
}
