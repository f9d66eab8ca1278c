package datadisk

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestLinkByID builds a sysfs tree as the kernel shows it and checks the links udev's
// rules would make, except a name two disks would share, which names neither.
func TestLinkByID(t *testing.T) {
	sys, dev := t.TempDir(), t.TempDir()
	put := func(p, v string) {
		p = filepath.Join(sys, "block", p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
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
	put("sda/device/wwid", "naa.5000C500ABCDEF")
	put("sdb/device/vendor", "ATA")
	// A link left from before, which is ambiguous now.
	byID := filepath.Join(dev, "disk", "by-id")
	os.MkdirAll(byID, 0o755)
	os.Symlink("../../nvme0n2", filepath.Join(byID, "nvme-Samsung_SSD_980_S64_ABC"))
	os.Symlink("../../nvme0n1p1", filepath.Join(byID, "nvme-Samsung_SSD_980_S64_ABC-part1"))

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
		"wwn-0x5000c500abcdef":                 "../../sda",
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
	}
	if len(got) != len(want) {
		sort.Strings(got)
		t.Errorf("links made: %s; want %d", strings.Join(got, " "), len(want))
	}
}
