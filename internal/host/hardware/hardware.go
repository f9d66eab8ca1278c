// Package hardware reads a machine's inventory from /sys and /proc for Machine.status: its
// DMI identity, CPUs, memory, disks, network interfaces, PCI devices with the driver bound to
// each, and loaded modules. Anything unreadable is left empty rather than failing the whole.
package hardware

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"liken.dev/liken/api/v1alpha1"
)

// Host names the sysfs and procfs roots (a test's tree, or "/sys" and "/proc"), and how to
// look further: Dev is where the device nodes are (for an unmounted partition's file
// system), Statfs a mounted file system's free space, Addrs a link's addresses. Each may be
// empty, which leaves that part out.
type Host struct {
	Sys, Proc string
	Dev       string
	Statfs    func(path string, st *unix.Statfs_t) error
	Addrs     func(link string) []string
}

// Default is the running kernel's.
var Default = Host{Sys: "/sys", Proc: "/proc", Dev: "/dev", Statfs: unix.Statfs, Addrs: LinkAddrs}

// Read returns the inventory.
func (h Host) Read() *v1alpha1.Hardware {
	hw := &v1alpha1.Hardware{
		System: v1alpha1.SystemInfo{
			Vendor:  h.read("class/dmi/id/sys_vendor"),
			Product: h.read("class/dmi/id/product_name"),
			Serial:  h.read("class/dmi/id/product_serial"),
			UUID:    h.read("class/dmi/id/product_uuid"),
		},
		CPU:         h.cpu(),
		MemoryBytes: h.Memory(),
		Disks:       h.disks(),
		NICs:        h.nics(),
		PCIDevices:  h.pci(),
		Modules:     h.modules(),
		Watchdogs:   h.watchdogs(),
	}
	return hw
}

func (h Host) read(rel string) string {
	b, err := os.ReadFile(filepath.Join(h.Sys, rel))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (h Host) link(rel string) string {
	p, err := os.Readlink(filepath.Join(h.Sys, rel))
	if err != nil {
		return ""
	}
	return filepath.Base(p)
}

func (h Host) list(rel string) []string {
	entries, err := os.ReadDir(filepath.Join(h.Sys, rel))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func (h Host) cpu() v1alpha1.CPUInfo {
	f, err := os.Open(filepath.Join(h.Proc, "cpuinfo"))
	if err != nil {
		return v1alpha1.CPUInfo{}
	}
	defer f.Close()
	var c v1alpha1.CPUInfo
	sockets := map[string]int32{} // physical id → cores
	phys := "0"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			c.Threads++
		case "model name":
			if c.Model == "" {
				c.Model = v
			}
		case "physical id":
			phys = v
		case "cpu cores":
			n, _ := strconv.Atoi(v)
			sockets[phys] = int32(n)
		}
	}
	c.Sockets = int32(len(sockets))
	for _, n := range sockets {
		c.Cores += n
	}
	if c.Sockets == 0 && c.Threads > 0 {
		c.Sockets, c.Cores = 1, c.Threads
	}
	return c
}

// Memory is the usable memory in bytes (MemTotal), 0 when it cannot be read.
func (h Host) Memory() int64 {
	f, err := os.Open(filepath.Join(h.Proc, "meminfo"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// disks lists whole block devices, leaving out loop devices, RAM disks and the like.
func (h Host) disks() []v1alpha1.DiskInfo {
	var out []v1alpha1.DiskInfo
	mounts := h.mounts()
	for _, name := range h.list("block") {
		if skipDisk(name) {
			continue
		}
		base := "block/" + name
		sectors, _ := strconv.ParseInt(h.read(base+"/size"), 10, 64)
		serial := h.read(base + "/device/serial")
		if serial == "" {
			serial = h.read(base + "/serial")
		}
		out = append(out, v1alpha1.DiskInfo{
			Name:       name,
			Model:      h.read(base + "/device/model"),
			Serial:     serial,
			SizeBytes:  sectors * 512, // sysfs counts 512-byte sectors whatever the device's
			Rotational: h.read(base+"/queue/rotational") == "1",
			Partitions: h.partitions(name, mounts),
		})
		if n, err := strconv.Atoi(h.read(base + "/queue/logical_block_size")); err == nil {
			out[len(out)-1].LogicalSectorBytes = int32(n)
		}
	}
	return out
}

func skipDisk(name string) bool {
	for _, p := range []string{"loop", "ram", "zram", "sr", "fd", "nbd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// nics lists interfaces backed by a device (not lo, bridges, veths or tunnels).
func (h Host) nics() []v1alpha1.NICInfo {
	var out []v1alpha1.NICInfo
	for _, name := range h.list("class/net") {
		base := "class/net/" + name
		if _, err := os.Stat(filepath.Join(h.Sys, base, "device")); err != nil {
			continue
		}
		speed, _ := strconv.Atoi(h.read(base + "/speed"))
		if speed < 0 {
			speed = 0
		}
		out = append(out, v1alpha1.NICInfo{
			Name:      name,
			MAC:       h.read(base + "/address"),
			Driver:    h.link(base + "/device/driver"),
			Link:      h.read(base+"/carrier") == "1",
			SpeedMbps: int32(speed),
		})
	}
	return out
}

func (h Host) pci() []v1alpha1.PCIDevice {
	var out []v1alpha1.PCIDevice
	for _, addr := range h.list("bus/pci/devices") {
		base := "bus/pci/devices/" + addr
		out = append(out, v1alpha1.PCIDevice{
			Address: addr,
			Vendor:  strings.TrimPrefix(h.read(base+"/vendor"), "0x"),
			Device:  strings.TrimPrefix(h.read(base+"/device"), "0x"),
			Class:   strings.TrimPrefix(h.read(base+"/class"), "0x"),
			Driver:  h.link(base + "/driver"),
		})
	}
	return out
}

func (h Host) modules() []string {
	f, err := os.Open(filepath.Join(h.Proc, "modules"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 0 {
			out = append(out, fields[0])
		}
	}
	sort.Strings(out)
	return out
}

// watchdogs are /sys/class/watchdog's devices, watchdog0 (/dev/watchdog) first.
func (h Host) watchdogs() []v1alpha1.WatchdogInfo {
	var out []v1alpha1.WatchdogInfo
	for _, name := range h.list("class/watchdog") {
		dir := "class/watchdog/" + name
		w := v1alpha1.WatchdogInfo{Name: name, Identity: h.read(dir + "/identity"), Active: h.read(dir+"/state") == "active"}
		if n, err := strconv.Atoi(h.read(dir + "/timeout")); err == nil {
			w.TimeoutSeconds = int32(n)
		}
		out = append(out, w)
	}
	// watchdog10 after watchdog9: the kernel numbers them in the order they registered.
	sort.SliceStable(out, func(i, j int) bool {
		a, _ := strconv.Atoi(strings.TrimPrefix(out[i].Name, "watchdog"))
		b, _ := strconv.Atoi(strings.TrimPrefix(out[j].Name, "watchdog"))
		return a < b
	})
	return out
}

// Addresses are the host's global unicast IP addresses, in the kernel's order.
func Addresses() []net.IP {
	addrs, _ := net.InterfaceAddrs()
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
			ips = append(ips, n.IP)
		}
	}
	return ips
}
