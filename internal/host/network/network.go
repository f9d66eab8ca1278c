// Package network configures a machine's network at boot from its Machine's spec.network:
// interfaces found by name or MAC (and given the spec's name), MTU, static addresses,
// routes and resolvers. This increment configures plain interfaces; bonds, VLANs and DHCP
// are reported as not configured yet rather than silently skipped.
package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"

	"liken.dev/liken/api/v1alpha1"
)

// ResolvConf is where resolvers are written; the root image's /etc/resolv.conf points here.
const ResolvConf = "/run/liken/resolv.conf"

// Apply configures the interfaces and routes in spec and writes the resolvers. It returns
// what it could not do, item by item, and configures the rest.
func Apply(spec *v1alpha1.MachineNetwork) []error {
	var errs []error
	if lo, err := netlink.LinkByName("lo"); err == nil {
		netlink.LinkSetUp(lo)
	}
	if spec == nil {
		return []error{errors.New("the Machine has no spec.network: no interface configured")}
	}
	for _, i := range spec.Interfaces {
		if err := configure(i); err != nil {
			errs = append(errs, fmt.Errorf("interface %s: %w", i.Name, err))
		}
	}
	for _, r := range spec.Routes {
		if err := route(r); err != nil {
			errs = append(errs, fmt.Errorf("route to %s: %w", r.To, err))
		}
	}
	var b strings.Builder
	if spec.DNS != nil {
		for _, ns := range spec.DNS.Nameservers {
			b.WriteString("nameserver " + ns + "\n")
		}
		if len(spec.DNS.Search) > 0 {
			b.WriteString("search " + strings.Join(spec.DNS.Search, " ") + "\n")
		}
	}
	if err := os.WriteFile(ResolvConf, []byte(b.String()), 0o644); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func configure(i v1alpha1.Interface) error {
	if i.Bond != nil || i.VLAN != nil {
		return errors.New("bonds and VLANs are not configured at boot yet")
	}
	link, err := find(i)
	if err != nil {
		return err
	}
	if link.Attrs().Name != string(i.Name) {
		netlink.LinkSetDown(link)
		if err := netlink.LinkSetName(link, string(i.Name)); err != nil {
			return fmt.Errorf("renaming %s: %w", link.Attrs().Name, err)
		}
	}
	if i.MTU > 0 {
		if err := netlink.LinkSetMTU(link, int(i.MTU)); err != nil {
			return fmt.Errorf("setting MTU %d: %w", i.MTU, err)
		}
	}
	for _, a := range i.Addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		if err := netlink.AddrReplace(link, addr); err != nil {
			return fmt.Errorf("adding %s: %w", a, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing it up: %w", err)
	}
	if i.DHCP {
		return errors.New("the link is up, but DHCP is not built yet: give static addresses")
	}
	return nil
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
