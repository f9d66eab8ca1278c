package hardware

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

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
