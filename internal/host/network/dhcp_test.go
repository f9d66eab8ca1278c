package network

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"liken.dev/liken/api/v1alpha1"
)

func TestMessageRoundTrip(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	c := &Client{MAC: mac, Hostname: "vm-1"}
	m := c.request(dhcpRequest, 0xdeadbeef, net.IPv4(10, 0, 2, 15), []byte{10, 0, 2, 2})
	b := m.encode()
	if len(b) < 300 {
		t.Errorf("message of %d bytes; BOOTP wants at least 300", len(b))
	}
	got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.xid != 0xdeadbeef || got.msgType() != dhcpRequest || got.chaddr.String() != mac.String() ||
		string(got.options[optHostname]) != "vm-1" || !net.IP(got.options[optRequestedIP]).Equal(net.IPv4(10, 0, 2, 15)) {
		t.Errorf("decoded %+v", got)
	}
	for _, bad := range [][]byte{nil, make([]byte, 239), append(b[:240:240], 53, 9, 1)} {
		if _, err := decode(bad); err == nil {
			t.Errorf("decoded a malformed message of %d bytes", len(bad))
		}
	}
}

// fakeDHCPServer answers on dev like a DHCP server would, broadcasting its answers.
func fakeDHCPServer(t *testing.T, dev string) (stop func()) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BROADCAST, 1)
	if err := unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, dev); err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 67}); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "dhcp-server")
	conn, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			req, err := decode(buf[:n])
			if err != nil || req.op != 1 {
				continue
			}
			kind := byte(dhcpOffer)
			if req.msgType() == dhcpRequest {
				kind = dhcpAck
			}
			lease := make([]byte, 4)
			binary.BigEndian.PutUint32(lease, 3600)
			ans := &message{op: 2, xid: req.xid, flags: req.flags, yiaddr: net.IPv4(192, 0, 2, 10), chaddr: req.chaddr, options: map[byte][]byte{
				optMessageType: {kind}, optSubnetMask: {255, 255, 255, 0}, optRouter: {192, 0, 2, 1},
				optDNS: {192, 0, 2, 53, 192, 0, 2, 54}, optServerID: {192, 0, 2, 1}, optLeaseTime: lease,
				optDomainName: []byte("example.test"), optNTPServers: {192, 0, 2, 123, 192, 0, 2, 124},
			}}
			conn.WriteTo(ans.encode(), &net.UDPAddr{IP: net.IPv4bcast, Port: 68})
		}
	}()
	return func() { conn.Close() }
}

// TestDHCPLeaseInNetworkNamespace runs the client against a DHCP server on the other end of
// a veth pair, in a network namespace of the test's own, and applies the lease through Apply:
// address, default route and resolvers. Needs root, as liken's init has.
func TestDHCPLeaseInNetworkNamespace(t *testing.T) {
	ResolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	TimeServersFile = filepath.Join(t.TempDir(), "dhcp-time-servers")
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the namespace dies with the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("creating a network namespace (the host tier runs as root): %v", err)
			return
		}
		mac, _ := net.ParseMAC("52:54:00:aa:bb:01")
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nic0", HardwareAddr: mac}, PeerName: "wire0"}
		if err := netlink.LinkAdd(veth); err != nil {
			t.Errorf("creating a veth pair: %v", err)
			return
		}
		peer, _ := netlink.LinkByName("wire0")
		netlink.LinkSetUp(peer)
		stop := fakeDHCPServer(t, "wire0")
		defer stop()

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		spec := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", MAC: "52:54:00:aa:bb:01", DHCP: true}}}
		var log strings.Builder
		if errs := Apply(ctx, spec, "vm-1", &log); len(errs) > 0 {
			t.Errorf("Apply: %v", errs)
			return
		}
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Errorf("the interface was not renamed eth0: %v", err)
			return
		}
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4)
		if len(addrs) != 1 || addrs[0].IPNet.String() != "192.0.2.10/24" {
			t.Errorf("addresses %v; want the leased 192.0.2.10/24", addrs)
		}
		routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
		def := false
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(net.IPv4(192, 0, 2, 1)) {
				def = true
			}
		}
		if !def {
			t.Errorf("no default route via the leased router: %v", routes)
		}
		b, _ := os.ReadFile(ResolvConf)
		if string(b) != "nameserver 192.0.2.53\nnameserver 192.0.2.54\nsearch example.test\n" {
			t.Errorf("resolv.conf:\n%s", b)
		}
		if b, _ := os.ReadFile(TimeServersFile); string(b) != "192.0.2.123\n192.0.2.124\n" {
			t.Errorf("time servers from the lease (option 42):\n%s", b)
		}
		if !strings.Contains(log.String(), "DHCP lease 192.0.2.10/24 from 192.0.2.1 for 1h0m0s") {
			t.Errorf("log: %s", log.String())
		}
	}()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("DHCP test hung")
	}
}
