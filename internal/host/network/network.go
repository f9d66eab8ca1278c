// Package network configures a machine's network at boot from its Machine's spec.network:
// ports found by MAC (else name) and given the spec's name, bonds of ports, 802.1Q VLANs on
// a port or a bond, MTU, static addresses or a DHCPv4 lease (renewed while the machine
// runs), routes, resolvers, and the time servers DHCP names. Links are made through
// netlink (github.com/vishvananda/netlink); the DHCP client is liken's own (dhcp.go).
package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"liken.dev/liken/api/v1alpha1"
)

// ResolvConf is where resolvers are written; the root image's /etc/resolv.conf points here.
var ResolvConf = "/run/liken/resolv.conf"

// TimeServersFile is where Apply writes the NTP servers the DHCP leases name, one per line,
// for init's clock (internal/initd).
var TimeServersFile = "/run/liken/dhcp-time-servers"

// DHCPTimeServers are the time servers the DHCP leases named at boot.
func DHCPTimeServers() []string {
	b, _ := os.ReadFile(TimeServersFile)
	return strings.Fields(string(b))
}

// Apply configures the interfaces and routes in spec and writes the resolvers. It returns
// what it could not do, item by item, and configures the rest. DHCP leases are renewed until
// ctx ends; log hears about renewals.
func Apply(ctx context.Context, spec *v1alpha1.MachineNetwork, hostname string, log io.Writer) []error {
	var errs []error
	if lo, err := netlink.LinkByName("lo"); err == nil {
		netlink.LinkSetUp(lo)
	}
	if spec == nil {
		return []error{errors.New("the Machine has no spec.network: no interface configured")}
	}
	var leases []*Lease
	for _, i := range ordered(spec.Interfaces) {
		l, err := configure(ctx, i, hostname, log)
		if err != nil {
			errs = append(errs, fmt.Errorf("interface %s: %w", i.Name, err))
		}
		if l != nil {
			leases = append(leases, l)
		}
	}
	defaultRoute := false
	for _, r := range spec.Routes {
		if r.To == "0.0.0.0/0" {
			defaultRoute = true
		}
		if err := route(r); err != nil {
			errs = append(errs, fmt.Errorf("route to %s: %w", r.To, err))
		}
	}
	var b strings.Builder
	switch {
	case spec.DNS != nil:
		for _, ns := range spec.DNS.Nameservers {
			b.WriteString("nameserver " + ns + "\n")
		}
		if len(spec.DNS.Search) > 0 {
			b.WriteString("search " + strings.Join(spec.DNS.Search, " ") + "\n")
		}
	default:
		for _, l := range leases {
			for _, ns := range l.DNS {
				b.WriteString("nameserver " + ns.String() + "\n")
			}
			if len(l.Search) > 0 {
				b.WriteString("search " + strings.Join(l.Search, " ") + "\n")
			}
		}
	}
	for _, l := range leases {
		if l.Router != nil && !defaultRoute {
			if err := netlink.RouteReplace(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, Gw: l.Router}); err != nil {
				errs = append(errs, fmt.Errorf("default route via %s from DHCP: %w", l.Router, err))
			}
			defaultRoute = true
		}
	}
	if err := os.WriteFile(ResolvConf, []byte(b.String()), 0o644); err != nil {
		errs = append(errs, err)
	}
	var ntp strings.Builder
	for _, l := range leases {
		for _, n := range l.NTP {
			ntp.WriteString(n.String() + "\n")
		}
	}
	if err := os.WriteFile(TimeServersFile, []byte(ntp.String()), 0o644); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// ordered puts the ports first, then the bonds of them, then the VLANs (on a port or a bond),
// so each interface's links exist, named, when it is made.
func ordered(ifaces []v1alpha1.Interface) []v1alpha1.Interface {
	rank := func(i v1alpha1.Interface) int {
		switch {
		case i.Bond != nil:
			return 1
		case i.VLAN != nil:
			return 2
		}
		return 0
	}
	out := append([]v1alpha1.Interface(nil), ifaces...)
	sort.SliceStable(out, func(a, b int) bool { return rank(out[a]) < rank(out[b]) })
	return out
}

// linkFor finds or makes the interface's link: a port found by MAC (else name) and named, a
// bond of ports, or a VLAN on a link.
func linkFor(i v1alpha1.Interface) (netlink.Link, error) {
	switch {
	case i.Bond != nil:
		return bond(i)
	case i.VLAN != nil:
		return vlan(i)
	}
	link, err := find(i)
	if err != nil {
		return nil, err
	}
	if link.Attrs().Name != string(i.Name) {
		netlink.LinkSetDown(link)
		if err := netlink.LinkSetName(link, string(i.Name)); err != nil {
			return nil, fmt.Errorf("renaming %s: %w", link.Attrs().Name, err)
		}
	}
	return link, nil
}

// bond makes the bond (or takes the one a boot before made) and enslaves its members, which
// take its MTU. miimon checks the members' carrier every 100 ms, so active-backup fails
// over when a cable is pulled.
func bond(i v1alpha1.Interface) (netlink.Link, error) {
	var b *netlink.Bond
	if l, err := netlink.LinkByName(string(i.Name)); err == nil {
		existing, ok := l.(*netlink.Bond)
		if !ok {
			return nil, fmt.Errorf("%s exists and is not a bond (%s)", i.Name, l.Type())
		}
		b = existing
	} else {
		b = netlink.NewLinkBond(netlink.LinkAttrs{Name: string(i.Name)})
		b.Mode = netlink.StringToBondMode(string(i.Bond.Mode))
		b.Miimon = 100
		if i.MTU > 0 {
			b.MTU = int(i.MTU)
		}
		if err := netlink.LinkAdd(b); err != nil {
			return nil, fmt.Errorf("making bond %s (%s): %w", i.Name, i.Bond.Mode, err)
		}
		l, err := netlink.LinkByName(string(i.Name))
		if err != nil {
			return nil, err
		}
		b = l.(*netlink.Bond)
	}
	for _, name := range i.Bond.Interfaces {
		m, err := netlink.LinkByName(string(name))
		if err != nil {
			return nil, fmt.Errorf("bond member %s: %w", name, err)
		}
		if m.Attrs().MasterIndex == b.Attrs().Index {
			continue
		}
		// A port is enslaved down, and keeps no address of its own.
		netlink.LinkSetDown(m)
		if err := netlink.LinkSetMaster(m, b); err != nil {
			return nil, fmt.Errorf("adding %s to bond %s: %w", name, i.Name, err)
		}
		if err := netlink.LinkSetUp(m); err != nil {
			return nil, fmt.Errorf("bringing bond member %s up: %w", name, err)
		}
	}
	// Read again: the bond took its first member's MAC, which DHCP identifies it by.
	return netlink.LinkByName(string(i.Name))
}

// vlan makes the 802.1Q VLAN on its link (or takes the one a boot before made).
func vlan(i v1alpha1.Interface) (netlink.Link, error) {
	parent, err := netlink.LinkByName(string(i.VLAN.Link))
	if err != nil {
		return nil, fmt.Errorf("the VLAN's link %s: %w", i.VLAN.Link, err)
	}
	if l, err := netlink.LinkByName(string(i.Name)); err == nil {
		v, ok := l.(*netlink.Vlan)
		if !ok || v.VlanId != int(i.VLAN.ID) || v.ParentIndex != parent.Attrs().Index {
			return nil, fmt.Errorf("%s exists and is not VLAN %d on %s", i.Name, i.VLAN.ID, i.VLAN.Link)
		}
		return v, nil
	}
	v := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: string(i.Name), ParentIndex: parent.Attrs().Index}, VlanId: int(i.VLAN.ID)}
	if err := netlink.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("making VLAN %d on %s: %w", i.VLAN.ID, i.VLAN.Link, err)
	}
	if err := netlink.LinkSetUp(parent); err != nil {
		return nil, fmt.Errorf("bringing %s up: %w", i.VLAN.Link, err)
	}
	return netlink.LinkByName(string(i.Name))
}

func configure(ctx context.Context, i v1alpha1.Interface, hostname string, log io.Writer) (*Lease, error) {
	link, err := linkFor(i)
	if err != nil {
		return nil, err
	}
	if i.MTU > 0 {
		if err := netlink.LinkSetMTU(link, int(i.MTU)); err != nil {
			return nil, fmt.Errorf("setting MTU %d: %w", i.MTU, err)
		}
	}
	for _, a := range i.Addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return nil, err
		}
		if err := netlink.AddrReplace(link, addr); err != nil {
			return nil, fmt.Errorf("adding %s: %w", a, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("bringing it up: %w", err)
	}
	if !i.DHCP {
		return nil, nil
	}
	c := &Client{Interface: string(i.Name), MAC: link.Attrs().HardwareAddr, Hostname: hostname}
	actx, cancel := context.WithTimeout(ctx, 60*time.Second)
	l, err := c.Acquire(actx)
	cancel()
	if err != nil {
		return nil, err
	}
	if err := applyLease(link, l, i.MTU == 0); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "liken-init: %s: DHCP lease %s from %s for %s (router %s)\n", i.Name, l.Address.String(), l.Server, l.Duration, l.Router)
	go renew(ctx, c, link, l, log)
	return l, nil
}

func applyLease(link netlink.Link, l *Lease, mtu bool) error {
	if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: &l.Address}); err != nil {
		return fmt.Errorf("adding the DHCP address %s: %w", l.Address.String(), err)
	}
	if mtu && l.MTU >= 576 {
		if err := netlink.LinkSetMTU(link, l.MTU); err != nil {
			return fmt.Errorf("setting the DHCP MTU %d: %w", l.MTU, err)
		}
	}
	return nil
}

// renew keeps the lease: half-way through it asks again, and retries every minute when the
// server does not answer.
func renew(ctx context.Context, c *Client, link netlink.Link, l *Lease, log io.Writer) {
	wait := l.Duration / 2
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		nl, err := c.Renew(rctx, l)
		cancel()
		if err != nil {
			fmt.Fprintf(log, "liken-init: %v; retrying in a minute\n", err)
			wait = time.Minute
			continue
		}
		if !nl.Address.IP.Equal(l.Address.IP) {
			fmt.Fprintf(log, "liken-init: %s: the DHCP server now gives %s instead of %s\n", c.Interface, nl.Address.String(), l.Address.String())
		}
		if err := applyLease(link, nl, false); err != nil {
			fmt.Fprintf(log, "liken-init: %v\n", err)
		}
		l, wait = nl, nl.Duration/2
	}
}

// find returns the link with the interface's MAC, else with its name.
func find(i v1alpha1.Interface) (netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		if i.MAC != "" && strings.EqualFold(l.Attrs().HardwareAddr.String(), string(i.MAC)) {
			return l, nil
		}
	}
	if i.MAC != "" {
		return nil, fmt.Errorf("no network card has MAC %s", i.MAC)
	}
	return netlink.LinkByName(string(i.Name))
}

func route(r v1alpha1.Route) error {
	_, dst, err := net.ParseCIDR(r.To)
	if err != nil {
		return err
	}
	rt := &netlink.Route{Dst: dst, Gw: net.ParseIP(r.Via), Priority: int(r.Metric)}
	if r.Interface != "" {
		l, err := netlink.LinkByName(string(r.Interface))
		if err != nil {
			return err
		}
		rt.LinkIndex = l.Attrs().Index
	}
	return netlink.RouteReplace(rt)
}
