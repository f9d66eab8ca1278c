package hardware

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/vishvananda/netlink"

	"liken.dev/liken/api/v1alpha1"
)

// Network reads the machine's links: ports (backed by a device), bonds and VLANs, with
// their state, speed, MTU, addresses and bond. Links Kubernetes makes for pods (veths,
// bridges, tunnels) are left out.
func (h Host) Network() *v1alpha1.NetworkStatus {
	var links []v1alpha1.LinkInfo
	for _, name := range h.list("class/net") {
		base := "class/net/" + name
		kind := ""
		switch typ := uevent(h.read(base+"/uevent"), "DEVTYPE"); {
		case typ == "bond":
			kind = "bond"
		case typ == "vlan":
			kind = "vlan"
		default:
			if _, err := os.Stat(filepath.Join(h.Sys, base, "device")); err == nil {
				kind = "port"
			}
		}
		if kind == "" {
			continue
		}
		speed, _ := strconv.Atoi(h.read(base + "/speed"))
		mtu, _ := strconv.Atoi(h.read(base + "/mtu"))
		l := v1alpha1.LinkInfo{
			Name: name, Kind: kind, MAC: h.read(base + "/address"), State: h.read(base + "/operstate"),
			SpeedMbps: int32(max(speed, 0)), MTU: int32(mtu), Master: h.link(base + "/master"),
		}
		if h.Addrs != nil {
			l.Addresses = h.Addrs(name)
		}
		links = append(links, l)
	}
	if len(links) == 0 {
		return nil
	}
	return &v1alpha1.NetworkStatus{Links: links}
}

// LinkAddrs is a link's IPv4 and IPv6 addresses (not link-local ones), through netlink.
func LinkAddrs(name string) []string {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, a.IPNet.String())
	}
	sort.Strings(out)
	return out
}
