package hardware

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"liken.dev/liken/api/v1alpha1"
)

func tree(t *testing.T, files map[string]string, links map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, v := range files {
		full := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for p, target := range links {
		full := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestReadFakeTree(t *testing.T) {
	sys := tree(t, map[string]string{
		"class/dmi/id/sys_vendor":             "QEMU\n",
		"class/dmi/id/product_name":           "Standard PC (Q35 + ICH9, 2009)\n",
		"class/dmi/id/product_serial":         "CZ2026AB17\n",
		"class/dmi/id/product_uuid":           "0b9f3a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b\n",
		"block/vda/size":                      "41943040\n",
		"block/vda/queue/rotational":          "0\n",
		"block/vda/serial":                    "disk-1\n",
		"block/sda/size":                      "7814037168\n",
		"block/sda/device/model":              "ST4000NM0035\n",
		"block/sda/device/serial":             "ZC1234AB\n",
		"block/sda/queue/rotational":          "1\n",
		"block/loop0/size":                    "100\n",
		"class/net/eth0/address":              "52:54:00:12:34:56\n",
		"class/net/eth0/carrier":              "1\n",
		"class/net/eth0/speed":                "-1\n",
		"class/net/eth0/device/x":             "",
		"class/net/lo/address":                "00:00:00:00:00:00\n",
		"bus/pci/devices/0000:00:03.0/vendor": "0x1af4\n",
		"bus/pci/devices/0000:00:03.0/device": "0x1000\n",
		"bus/pci/devices/0000:00:03.0/class":  "0x020000\n",
		"bus/pci/devices/0000:00:04.0/vendor": "0x8086\n",
		"bus/pci/devices/0000:00:04.0/device": "0x25ab\n",
		"bus/pci/devices/0000:00:04.0/class":  "0x088000\n",
		"class/watchdog/watchdog0/identity":   "i6300ESB timer\n",
		"class/watchdog/watchdog0/state":      "active\n",
		"class/watchdog/watchdog0/timeout":    "60\n",
		"class/watchdog/watchdog1/identity":   "Software Watchdog\n",
		"class/watchdog/watchdog1/state":      "inactive\n",
		"class/watchdog/watchdog1/timeout":    "60\n",
		"class/watchdog/watchdog10/identity":  "iTCO_wdt\n",
		"class/watchdog/watchdog10/state":     "inactive\n",
	}, map[string]string{
		"class/net/eth0/device/driver":        "../../../bus/virtio/drivers/virtio_net",
		"bus/pci/devices/0000:00:03.0/driver": "../../../bus/pci/drivers/virtio-pci",
	})
	proc := tree(t, map[string]string{
		"cpuinfo": "processor\t: 0\nmodel name\t: QEMU Virtual CPU\nphysical id\t: 0\ncpu cores\t: 2\n\nprocessor\t: 1\nmodel name\t: QEMU Virtual CPU\nphysical id\t: 0\ncpu cores\t: 2\n",
		"meminfo": "MemTotal:        2030000 kB\nMemFree:  1 kB\n",
		"modules": "virtio_net 61440 0 - Live 0x0\nbr_netfilter 32768 0 - Live 0x0\n",
	}, nil)
	got := Host{Sys: sys, Proc: proc}.Read()
	want := &v1alpha1.Hardware{
		System:      v1alpha1.SystemInfo{Vendor: "QEMU", Product: "Standard PC (Q35 + ICH9, 2009)", Serial: "CZ2026AB17", UUID: "0b9f3a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b"},
		CPU:         v1alpha1.CPUInfo{Model: "QEMU Virtual CPU", Sockets: 1, Cores: 2, Threads: 2},
		MemoryBytes: 2030000 * 1024,
		Disks: []v1alpha1.DiskInfo{
			{Name: "sda", Model: "ST4000NM0035", Serial: "ZC1234AB", SizeBytes: 7814037168 * 512, Rotational: true},
			{Name: "vda", Serial: "disk-1", SizeBytes: 41943040 * 512},
		},
		NICs: []v1alpha1.NICInfo{{Name: "eth0", MAC: "52:54:00:12:34:56", Driver: "virtio_net", Link: true}},
		PCIDevices: []v1alpha1.PCIDevice{
			{Address: "0000:00:03.0", Vendor: "1af4", Device: "1000", Class: "020000", Driver: "virtio-pci"},
			{Address: "0000:00:04.0", Vendor: "8086", Device: "25ab", Class: "088000"},
		},
		Modules: []string{"br_netfilter", "virtio_net"},
		Watchdogs: []v1alpha1.WatchdogInfo{
			{Name: "watchdog0", Identity: "i6300ESB timer", Active: true, TimeoutSeconds: 60},
			{Name: "watchdog1", Identity: "Software Watchdog", TimeoutSeconds: 60},
			{Name: "watchdog10", Identity: "iTCO_wdt"},
		},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("inventory (-want +got):\n%s", d)
	}
}

// TestReadThisMachine reads the real /sys and /proc: the numbers must be there.
func TestReadThisMachine(t *testing.T) {
	hw := Default.Read()
	if hw.CPU.Threads < 1 || hw.MemoryBytes < 1<<28 || len(hw.Disks) == 0 || len(hw.Modules) == 0 && len(hw.PCIDevices) == 0 {
		t.Errorf("implausible inventory of this machine: %+v", hw)
	}
}

// TestStorageAndLinks: a disk's partitions with their GPT names, file systems, mount points
// and free space (rounded to 1% of the size), and the links: ports, a bond with its members,
// a VLAN on it; not a pod's veth.
func TestStorageAndLinks(t *testing.T) {
	sys := tree(t, map[string]string{
		"block/vda/size":                     "409600\n",
		"block/vda/queue/logical_block_size": "4096\n",
		"block/vda/vda1/partition":           "1\n",
		"block/vda/vda1/size":                "81920\n",
		"block/vda/vda1/uevent":              "MAJOR=254\nMINOR=1\nDEVNAME=vda1\nDEVTYPE=partition\nPARTN=1\nPARTNAME=liken-esp\n",
		"block/vda/vda5/partition":           "5\n",
		"block/vda/vda5/size":                "204800\n",
		"block/vda/vda5/uevent":              "DEVNAME=vda5\nPARTNAME=liken-state\n",
		"block/vda/queue/rotational":         "0\n",
		"class/net/eth0/address":             "52:54:00:00:00:01\n",
		"class/net/eth0/operstate":           "up\n",
		"class/net/eth0/mtu":                 "9000\n",
		"class/net/eth0/speed":               "10000\n",
		"class/net/eth0/device/x":            "",
		"class/net/eth0/uevent":              "INTERFACE=eth0\nIFINDEX=2\n",
		"class/net/bond0/address":            "52:54:00:00:00:01\n",
		"class/net/bond0/operstate":          "up\n",
		"class/net/bond0/mtu":                "9000\n",
		"class/net/bond0/uevent":             "DEVTYPE=bond\nINTERFACE=bond0\n",
		"class/net/bond0.100/operstate":      "lowerlayerdown\n",
		"class/net/bond0.100/mtu":            "9000\n",
		"class/net/bond0.100/uevent":         "DEVTYPE=vlan\nINTERFACE=bond0.100\n",
		"class/net/veth1234/uevent":          "INTERFACE=veth1234\n",
		"class/net/veth1234/operstate":       "up\n",
	}, map[string]string{"class/net/eth0/master": "../bond0"})
	proc := tree(t, map[string]string{
		"self/mountinfo": "22 1 254:5 / /var rw,noatime shared:2 - ext4 /dev/vda5 rw\n" +
			"23 22 254:5 /lib/liken/rancher /etc/rancher rw shared:2 - ext4 /dev/vda5 rw\n" +
			"30 1 0:25 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
	}, nil)
	h := Host{Sys: sys, Proc: proc,
		Statfs: func(path string, st *unix.Statfs_t) error {
			if path != "/var" {
				t.Errorf("statfs of %s", path)
			}
			st.Bsize, st.Bavail = 4096, 12345 // 50565120 bytes
			return nil
		},
		Addrs: func(link string) []string {
			if link == "bond0.100" {
				return []string{"192.0.2.10/24"}
			}
			return nil
		},
	}
	hw := h.Read()
	wantDisk := v1alpha1.DiskInfo{Name: "vda", SizeBytes: 409600 * 512, LogicalSectorBytes: 4096, Partitions: []v1alpha1.PartitionInfo{
		{Name: "vda1", Label: "liken-esp", SizeBytes: 81920 * 512},
		// 1% of 104857600 is 1048576: 50565120 rounds down to 48 of those.
		{Name: "vda5", Label: "liken-state", SizeBytes: 204800 * 512, Filesystem: "ext4", MountPoint: "/var", FreeBytes: 48 * 1048576},
	}}
	if d := cmp.Diff([]v1alpha1.DiskInfo{wantDisk}, hw.Disks); d != "" {
		t.Errorf("disks (-want +got):\n%s", d)
	}
	wantNet := &v1alpha1.NetworkStatus{Links: []v1alpha1.LinkInfo{
		{Name: "bond0", Kind: "bond", MAC: "52:54:00:00:00:01", State: "up", MTU: 9000},
		{Name: "bond0.100", Kind: "vlan", State: "lowerlayerdown", MTU: 9000, Addresses: []string{"192.0.2.10/24"}},
		{Name: "eth0", Kind: "port", MAC: "52:54:00:00:00:01", State: "up", SpeedMbps: 10000, MTU: 9000, Master: "bond0"},
	}}
	if d := cmp.Diff(wantNet, h.Network()); d != "" {
		t.Errorf("links (-want +got):\n%s", d)
	}
}

// TestProbeFilesystems names the file systems liken makes by their superblocks, on real
// images made by mkfs.
func TestProbeFilesystems(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		mk   []string
	}{
		{"ext4", []string{"mkfs.ext4", "-q", "-F", "-b", "4096", "IMG", "8M"}},
		{"vfat", []string{"mkfs.vfat", "-F", "16", "-S", "4096", "-s", "1", "-C", "IMG", "49152"}},
		{"vfat", []string{"mkfs.vfat", "-F", "32", "-S", "512", "-s", "1", "-C", "IMG", "40960"}},
	} {
		img := filepath.Join(dir, tc.name+strings.Join(tc.mk[1:3], ""))
		args := append([]string(nil), tc.mk[1:]...)
		for i, a := range args {
			if a == "IMG" {
				args[i] = img
			}
		}
		if out, err := exec.Command(tc.mk[0], args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", tc.mk[0], err, out)
		}
		if got := probe(img); got != tc.name {
			t.Errorf("%v: probed %q", tc.mk, got)
		}
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, make([]byte, 4096), 0o644)
	if got := probe(empty); got != "" {
		t.Errorf("an empty partition probed as %q", got)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/var/lib/kubelet/pods/a\040b`: "/var/lib/kubelet/pods/a b",
		`/plain`:                       "/plain",
		`/tab\011end\134`:              "/tab\tend\\",
	} {
		if got := UnescapeMount(in); got != want {
			t.Errorf("UnescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}
