package network

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Lease is what a DHCPv4 server granted.
type Lease struct {
	Address net.IPNet
	Router  net.IP
	DNS     []net.IP
	// NTP are the time servers the lease names (option 42).
	NTP      []net.IP
	Search   []string
	Server   net.IP
	Duration time.Duration
	MTU      int
}

// DHCP message types and options (RFC 2131, RFC 2132).
const (
	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpAck      = 5
	dhcpNak      = 6

	optSubnetMask    = 1
	optRouter        = 3
	optDNS           = 6
	optHostname      = 12
	optDomainName    = 15
	optMTU           = 26
	optNTPServers    = 42
	optRequestedIP   = 50
	optLeaseTime     = 51
	optMessageType   = 53
	optServerID      = 54
	optParameterList = 55
	optEnd           = 255
)

var magicCookie = []byte{99, 130, 83, 99}

// message is a DHCPv4 message: the fixed header fields liken uses and the options.
type message struct {
	op      byte
	xid     uint32
	flags   uint16
	ciaddr  net.IP
	yiaddr  net.IP
	chaddr  net.HardwareAddr
	options map[byte][]byte
}

func (m *message) encode() []byte {
	b := make([]byte, 236, 300)
	b[0], b[1], b[2] = m.op, 1, 6 // BOOTREQUEST/REPLY, Ethernet, 6-byte addresses
	binary.BigEndian.PutUint32(b[4:], m.xid)
	binary.BigEndian.PutUint16(b[10:], m.flags)
	if m.ciaddr != nil {
		copy(b[12:16], m.ciaddr.To4())
	}
	if m.yiaddr != nil {
		copy(b[16:20], m.yiaddr.To4())
	}
	copy(b[28:44], m.chaddr)
	b = append(b, magicCookie...)
	// Message type first, as some servers expect.
	if t, ok := m.options[optMessageType]; ok {
		b = append(b, optMessageType, byte(len(t)))
		b = append(b, t...)
	}
	for code := 1; code < 255; code++ {
		v, ok := m.options[byte(code)]
		if !ok || code == optMessageType {
			continue
		}
		b = append(b, byte(code), byte(len(v)))
		b = append(b, v...)
	}
	b = append(b, optEnd)
	for len(b) < 300 { // BOOTP's minimum size; some servers drop shorter packets
		b = append(b, 0)
	}
	return b
}

func decode(b []byte) (*message, error) {
	if len(b) < 240 || string(b[236:240]) != string(magicCookie) {
		return nil, errors.New("not a DHCP message")
	}
	m := &message{op: b[0], xid: binary.BigEndian.Uint32(b[4:]), flags: binary.BigEndian.Uint16(b[10:]),
		ciaddr: net.IP(append([]byte{}, b[12:16]...)), yiaddr: net.IP(append([]byte{}, b[16:20]...)),
		chaddr: net.HardwareAddr(append([]byte{}, b[28:34]...)), options: map[byte][]byte{}}
	opts := b[240:]
	for i := 0; i < len(opts); {
		code := opts[i]
		if code == optEnd {
			break
		}
		if code == 0 { // pad
			i++
			continue
		}
		if i+1 >= len(opts) || i+2+int(opts[i+1]) > len(opts) {
			return nil, errors.New("DHCP options run past the message")
		}
		n := int(opts[i+1])
		m.options[code] = append(m.options[code], opts[i+2:i+2+n]...)
		i += 2 + n
	}
	return m, nil
}

func (m *message) msgType() byte {
	if t := m.options[optMessageType]; len(t) == 1 {
		return t[0]
	}
	return 0
}

// lease reads the lease an ACK grants.
func (m *message) lease() (*Lease, error) {
	mask := m.options[optSubnetMask]
	if len(mask) != 4 || m.yiaddr.To4() == nil || m.yiaddr.IsUnspecified() {
		return nil, errors.New("the DHCP answer grants no address and mask")
	}
	l := &Lease{Address: net.IPNet{IP: m.yiaddr.To4(), Mask: net.IPMask(mask)}, Duration: time.Hour}
	if r := m.options[optRouter]; len(r) >= 4 {
		l.Router = net.IP(r[:4])
	}
	for d := m.options[optDNS]; len(d) >= 4; d = d[4:] {
		l.DNS = append(l.DNS, net.IP(d[:4]))
	}
	for n := m.options[optNTPServers]; len(n) >= 4; n = n[4:] {
		l.NTP = append(l.NTP, net.IP(n[:4]))
	}
	if s := m.options[optServerID]; len(s) == 4 {
		l.Server = net.IP(s)
	}
	if t := m.options[optLeaseTime]; len(t) == 4 {
		l.Duration = time.Duration(binary.BigEndian.Uint32(t)) * time.Second
	}
	if mtu := m.options[optMTU]; len(mtu) == 2 {
		l.MTU = int(binary.BigEndian.Uint16(mtu))
	}
	if d := m.options[optDomainName]; len(d) > 0 {
		l.Search = []string{string(d)}
	}
	return l, nil
}

// dhcpConn is a UDP socket on port 68 bound to one interface, able to send broadcasts
// before the interface has an address.
func dhcpConn(ifname string) (net.PacketConn, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("DHCP socket: %w", err)
	}
	for _, o := range []int{unix.SO_REUSEADDR, unix.SO_BROADCAST} {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, o, 1); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("DHCP socket: %w", err)
		}
	}
	if err := unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifname); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding the DHCP socket to %s: %w", ifname, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 68}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding the DHCP socket to port 68: %w", err)
	}
	f := os.NewFile(uintptr(fd), "dhcp-"+ifname)
	defer f.Close()
	return net.FilePacketConn(f)
}

// Client asks a DHCPv4 server for a lease on one interface.
type Client struct {
	Interface string
	MAC       net.HardwareAddr
	Hostname  string
	// Server is where requests go; nil broadcasts (255.255.255.255:67). Tests set it.
	Server *net.UDPAddr
	// Attempts bounds the tries of each exchange (default 4, waits 2, 4, 8... seconds).
	Attempts int
}

// Acquire runs DISCOVER, OFFER, REQUEST, ACK and returns the lease.
func (c *Client) Acquire(ctx context.Context) (*Lease, error) {
	conn, err := dhcpConn(c.Interface)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	xid := randomXID()
	offer, err := c.exchange(ctx, conn, c.request(dhcpDiscover, xid, nil, nil), xid, dhcpOffer)
	if err != nil {
		return nil, fmt.Errorf("DHCP on %s: no offer: %w", c.Interface, err)
	}
	ack, err := c.exchange(ctx, conn, c.request(dhcpRequest, xid, offer.yiaddr, offer.options[optServerID]), xid, dhcpAck)
	if err != nil {
		return nil, fmt.Errorf("DHCP on %s: offer of %s not confirmed: %w", c.Interface, offer.yiaddr, err)
	}
	return ack.lease()
}

// Renew asks the server again for the address held.
func (c *Client) Renew(ctx context.Context, l *Lease) (*Lease, error) {
	conn, err := dhcpConn(c.Interface)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	xid := randomXID()
	ack, err := c.exchange(ctx, conn, c.request(dhcpRequest, xid, l.Address.IP, nil), xid, dhcpAck)
	if err != nil {
		return nil, fmt.Errorf("renewing the DHCP lease of %s on %s: %w", l.Address.IP, c.Interface, err)
	}
	return ack.lease()
}

func (c *Client) request(kind byte, xid uint32, ip net.IP, server []byte) *message {
	m := &message{op: 1, xid: xid, flags: 0x8000, chaddr: c.MAC, options: map[byte][]byte{
		optMessageType:   {kind},
		optParameterList: {optSubnetMask, optRouter, optDNS, optDomainName, optMTU, optNTPServers, optLeaseTime, optServerID},
	}}
	if c.Hostname != "" {
		m.options[optHostname] = []byte(c.Hostname)
	}
	if ip != nil {
		m.options[optRequestedIP] = ip.To4()
	}
	if server != nil {
		m.options[optServerID] = server
	}
	return m
}

// exchange sends req until an answer of kind want with the same transaction arrives.
func (c *Client) exchange(ctx context.Context, conn net.PacketConn, req *message, xid uint32, want byte) (*message, error) {
	to := c.Server
	if to == nil {
		to = &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	}
	attempts := c.Attempts
	if attempts == 0 {
		attempts = 4
	}
	wait := 2 * time.Second
	buf := make([]byte, 1500)
	for try := 0; try < attempts; try++ {
		if _, err := conn.WriteTo(req.encode(), to); err != nil {
			return nil, err
		}
		deadline := time.Now().Add(wait)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		conn.SetReadDeadline(deadline)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break
				}
				return nil, err
			}
			m, err := decode(buf[:n])
			if err != nil || m.op != 2 || m.xid != xid || string(m.chaddr) != string(c.MAC) {
				continue // someone else's answer
			}
			switch m.msgType() {
			case want:
				return m, nil
			case dhcpNak:
				return nil, errors.New("the server refused (NAK)")
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wait *= 2
	}
	return nil, fmt.Errorf("no answer after %d tries", attempts)
}

func randomXID() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}
