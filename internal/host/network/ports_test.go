package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/test/vmtest"
)

// TestMain runs the tests as usual, or as PID 1 of a VM (test/vm TestNetworkPortsInVM).
func TestMain(m *testing.M) { vmtest.Main(m) }

// kernelHas skips the test when this kernel cannot make the link (no bonding or 802.1Q in
// a host's kernel without modules): test/vm runs it again with the release's kernel. The
// link is made on a veth in a namespace of the test's own.
func kernelHas(t *testing.T, kind string, link func(parent netlink.Link) netlink.Link) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the namespace goes with the thread
		if _, err := netns.New(); err != nil {
			errc <- err
			return
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}); err != nil {
			errc <- err
			return
		}
		parent, err := netlink.LinkByName("probe0")
		if err != nil {
			errc <- err
			return
		}
		errc <- netlink.LinkAdd(link(parent))
	}()
	if err := <-errc; errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("this kernel cannot make a %s (%v): test/vm TestNetworkPortsInVM runs this test with the release's kernel", kind, err)
	} else if err != nil {
		t.Fatalf("making a %s in a namespace of the test's own: %v", kind, err)
	}
}

// namespaces runs fn on a locked OS thread, in the first of n new network namespaces (the
// machine's), with the others to wire peers in. The thread is never unlocked, so the
// namespaces go with it. Needs root, as liken's init has.
func namespaces(t *testing.T, n int, fn func(ns []netns.NsHandle) error) {
	t.Helper()
	ResolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	TimeServersFile = filepath.Join(t.TempDir(), "dhcp-time-servers")
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		handles := make([]netns.NsHandle, n)
		for i := n - 1; i >= 0; i-- { // the machine's last, so the thread stays in it
			h, err := netns.New()
			if err != nil {
				errc <- fmt.Errorf("creating a network namespace (the host tier runs as root): %w", err)
				return
			}
			defer h.Close()
			handles[i] = h
		}
		errc <- fn(handles)
	}()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the namespace test hung")
	}
}

// wire makes a veth pair: name (with mac) stays in the current namespace, peer goes to ns.
func wire(name, mac, peer string, ns netns.NsHandle) error {
	hw, _ := net.ParseMAC(mac)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: hw}, PeerName: peer}); err != nil {
		return fmt.Errorf("veth %s-%s: %w", name, peer, err)
	}
	p, err := netlink.LinkByName(peer)
	if err != nil {
		return err
	}
	return netlink.LinkSetNsFd(p, int(ns))
}

// serve listens on addr in namespace ns and echoes one line per connection; back returns
// the thread to the machine's namespace.
func serve(ns, back netns.NsHandle, addr string) (net.Listener, error) {
	if err := netns.Set(ns); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp4", addr)
	netns.Set(back)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return l, nil
}

// reach says whether a TCP echo at addr answers from the current namespace.
func reach(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp4", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping\n" {
		return fmt.Errorf("echo %q: %v", b, err)
	}
	return nil
}

func up(h *netlink.Handle, names ...string) error {
	for _, n := range names {
		l, err := h.LinkByName(n)
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
	}
	return nil
}

// TestBondFailsOver: a Machine's active-backup bond of two ports, its MTU on the members,
// an address and a static route; the peer is a switch (a bridge) in another namespace.
// Traffic flows; when the active member's cable is pulled (its peer end goes down), the
// bond fails over to the other and traffic flows again.
func TestBondFailsOver(t *testing.T) {
	kernelHas(t, "bond", func(netlink.Link) netlink.Link { return netlink.NewLinkBond(netlink.LinkAttrs{Name: "probe2"}) })
	kernelHas(t, "bridge", func(netlink.Link) netlink.Link { return &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "probe2"}} })
	namespaces(t, 2, func(ns []netns.NsHandle) error {
		machine, peer := ns[0], ns[1]
		if err := wire("nic0", "52:54:00:aa:00:01", "p0", peer); err != nil {
			return err
		}
		if err := wire("nic1", "52:54:00:aa:00:02", "p1", peer); err != nil {
			return err
		}
		ph, err := netlink.NewHandleAt(peer, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer ph.Close()
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "sw0"}}
		if err := ph.LinkAdd(br); err != nil {
			return fmt.Errorf("the peer's switch: %w", err)
		}
		for _, p := range []string{"p0", "p1"} {
			l, _ := ph.LinkByName(p)
			if err := ph.LinkSetMaster(l, br); err != nil {
				return err
			}
		}
		addr, _ := netlink.ParseAddr("192.0.2.1/24")
		if err := ph.AddrAdd(br, addr); err != nil {
			return err
		}
		if err := up(ph, "sw0", "p0", "p1", "lo"); err != nil {
			return err
		}
		l, err := serve(peer, machine, "192.0.2.1:0")
		if err != nil {
			return err
		}
		defer l.Close()

		spec := &v1alpha1.MachineNetwork{
			Interfaces: []v1alpha1.Interface{
				// The bond first: Apply makes the ports before it, whatever the order.
				{Name: "bond0", Bond: &v1alpha1.Bond{Mode: "active-backup", Interfaces: []v1alpha1.InterfaceName{"eth0", "eth1"}},
					Addresses: []string{"192.0.2.10/24"}, MTU: 9000},
				{Name: "eth0", MAC: "52:54:00:aa:00:01", MTU: 9000},
				{Name: "eth1", MAC: "52:54:00:aa:00:02", MTU: 9000},
			},
			Routes: []v1alpha1.Route{{To: "203.0.113.0/24", Via: "192.0.2.1"}},
		}
		var log strings.Builder
		if errs := Apply(context.Background(), spec, "m", &log); len(errs) > 0 {
			return fmt.Errorf("Apply: %v", errs)
		}
		bl, err := netlink.LinkByName("bond0")
		if err != nil {
			return err
		}
		b, ok := bl.(*netlink.Bond)
		if !ok || b.Mode != netlink.BOND_MODE_ACTIVE_BACKUP {
			return fmt.Errorf("bond0 is %s, mode %v", bl.Type(), b)
		}
		for _, m := range []string{"eth0", "eth1", "bond0"} {
			ml, err := netlink.LinkByName(m)
			if err != nil {
				return err
			}
			if ml.Attrs().MTU != 9000 {
				t.Errorf("%s MTU %d, want 9000", m, ml.Attrs().MTU)
			}
			if m != "bond0" && ml.Attrs().MasterIndex != b.Index {
				t.Errorf("%s is not in bond0", m)
			}
		}
		routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
		routed := false
		for _, r := range routes {
			routed = routed || (r.Dst != nil && r.Dst.String() == "203.0.113.0/24" && r.Gw.Equal(net.IPv4(192, 0, 2, 1)))
		}
		if !routed {
			t.Errorf("no route to 203.0.113.0/24 via 192.0.2.1: %v", routes)
		}
		if err := eventually(func() error { return reach(l.Addr().String(), time.Second) }); err != nil {
			return fmt.Errorf("through the bond: %w", err)
		}
		active := activeMember(t)
		cable := map[string]string{"eth0": "p0", "eth1": "p1"}[active]
		if cable == "" {
			return fmt.Errorf("no active member (%q)", active)
		}
		pl, _ := ph.LinkByName(cable)
		if err := ph.LinkSetDown(pl); err != nil {
			return err
		}
		if err := eventually(func() error {
			if now := activeMember(t); now == active {
				return fmt.Errorf("%s is still active", now)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("after %s's cable was pulled: %w", active, err)
		}
		if err := eventually(func() error { return reach(l.Addr().String(), time.Second) }); err != nil {
			return fmt.Errorf("after failing over from %s: %w", active, err)
		}
		t.Logf("active member %s lost its link; the bond failed over to %s and traffic flows", active, activeMember(t))
		return nil
	})
}

func activeMember(t *testing.T) string {
	l, err := netlink.LinkByName("bond0")
	if err != nil {
		return ""
	}
	b, ok := l.(*netlink.Bond)
	if !ok || b.ActiveSlave <= 0 {
		return ""
	}
	m, err := netlink.LinkByIndex(b.ActiveSlave)
	if err != nil {
		return ""
	}
	return m.Attrs().Name
}

// eventually retries fn for up to 10 seconds.
func eventually(fn func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestVLANCarriesItsOwnTraffic: a Machine's VLAN 100 on a port reaches a peer on VLAN 100 of
// the same wire, and not one on VLAN 200, although both are in one subnet.
func TestVLANCarriesItsOwnTraffic(t *testing.T) {
	kernelHas(t, "VLAN", func(p netlink.Link) netlink.Link {
		return &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "probe0.7", ParentIndex: p.Attrs().Index}, VlanId: 7}
	})
	namespaces(t, 3, func(ns []netns.NsHandle) error {
		machine, peer, other := ns[0], ns[1], ns[2]
		if err := wire("nic0", "52:54:00:aa:00:03", "p0", peer); err != nil {
			return err
		}
		ph, err := netlink.NewHandleAt(peer, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer ph.Close()
		// A VLAN comes up only on a link that is up.
		if err := up(ph, "p0"); err != nil {
			return err
		}
		p0, _ := ph.LinkByName("p0")
		for _, v := range []struct {
			id   int
			addr string
			ns   netns.NsHandle
		}{{100, "198.51.100.1/24", peer}, {200, "198.51.100.2/24", other}} {
			name := fmt.Sprintf("p0.%d", v.id)
			if err := ph.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: p0.Attrs().Index}, VlanId: v.id}); err != nil {
				return err
			}
			vl, _ := ph.LinkByName(name)
			h := ph
			if v.ns != peer {
				// VLAN 200's end lives in a namespace of its own: the peer's kernel would
				// otherwise answer for any of its addresses on any VLAN.
				if err := ph.LinkSetNsFd(vl, int(v.ns)); err != nil {
					return err
				}
				if h, err = netlink.NewHandleAt(v.ns, unix.NETLINK_ROUTE); err != nil {
					return err
				}
				defer h.Close()
				vl, _ = h.LinkByName(name)
			}
			a, _ := netlink.ParseAddr(v.addr)
			if err := h.AddrAdd(vl, a); err != nil {
				return err
			}
			if err := up(h, name, "lo"); err != nil {
				return err
			}
		}
		on100, err := serve(peer, machine, "198.51.100.1:0")
		if err != nil {
			return err
		}
		defer on100.Close()
		on200, err := serve(other, machine, "198.51.100.2:0")
		if err != nil {
			return err
		}
		defer on200.Close()

		spec := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{
			{Name: "vlan100", VLAN: &v1alpha1.VLAN{ID: 100, Link: "eth0"}, Addresses: []string{"198.51.100.10/24"}},
			{Name: "eth0", MAC: "52:54:00:aa:00:03"},
		}}
		var log strings.Builder
		if errs := Apply(context.Background(), spec, "m", &log); len(errs) > 0 {
			return fmt.Errorf("Apply: %v", errs)
		}
		vl, err := netlink.LinkByName("vlan100")
		if err != nil {
			return err
		}
		if v, ok := vl.(*netlink.Vlan); !ok || v.VlanId != 100 {
			return fmt.Errorf("vlan100 is %s", vl.Type())
		}
		if err := eventually(func() error { return reach(on100.Addr().String(), time.Second) }); err != nil {
			return fmt.Errorf("to the peer on VLAN 100: %w", err)
		}
		if err := reach(on200.Addr().String(), 3*time.Second); err == nil {
			return fmt.Errorf("reached the peer on VLAN 200 from VLAN 100")
		}
		// A second boot finds the VLAN there and takes it.
		if errs := Apply(context.Background(), spec, "m", &log); len(errs) > 0 {
			return fmt.Errorf("Apply again: %v", errs)
		}
		return nil
	})
}
