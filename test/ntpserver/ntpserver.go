// Package ntpserver is a small NTP (RFC 5905, mode 4) server for tests: it answers every
// client request with this host's clock plus a fixed shift, as a stratum-1 server would,
// so tests can check a real NTP client against real UDP.
package ntpserver

import (
	"encoding/binary"
	"net"
	"sync/atomic"
	"time"
)

// Server answers NTP requests until closed.
type Server struct {
	conn    net.PacketConn
	shift   time.Duration
	answers atomic.Int64
	silent  atomic.Bool
}

// Start listens on addr ("127.0.0.1:0" for a free port) and answers with the clock moved by
// shift.
func Start(addr string, shift time.Duration) (*Server, error) {
	conn, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{conn: conn, shift: shift}
	go s.serve()
	return s, nil
}

// Addr is where the server listens.
func (s *Server) Addr() *net.UDPAddr { return s.conn.LocalAddr().(*net.UDPAddr) }

// Silence makes the server drop every request until Answer, as a server that is down; its
// port stays its own.
func (s *Server) Silence() { s.silent.Store(true) }

// Answer makes a silenced server answer again.
func (s *Server) Answer() { s.silent.Store(false) }

// Answers is how many requests it answered.
func (s *Server) Answers() int64 { return s.answers.Load() }

// Close stops the server.
func (s *Server) Close() error { return s.conn.Close() }

// ntpEpoch is 1900-01-01, where NTP timestamps start.
var ntpEpoch = time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC)

func stamp(t time.Time) uint64 {
	d := t.Sub(ntpEpoch)
	sec := uint64(d / time.Second)
	frac := uint64(d%time.Second) << 32 / uint64(time.Second)
	return sec<<32 | frac
}

func (s *Server) serve() {
	buf := make([]byte, 512)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if n < 48 || s.silent.Load() {
			continue
		}
		recv := time.Now().Add(s.shift)
		req := buf[:48]
		ans := make([]byte, 48)
		version := req[0] >> 3 & 7
		ans[0] = 0<<6 | version<<3 | 4 // no leap warning, the client's version, mode 4 (server)
		ans[1] = 1                     // stratum 1
		ans[2] = req[2]                // poll
		ans[3] = 0xEC                  // precision, about a microsecond
		copy(ans[12:16], "LIKN")       // reference ID of a stratum-1 source
		binary.BigEndian.PutUint64(ans[16:], stamp(recv))
		copy(ans[24:32], req[40:48]) // origin: the client's transmit time
		binary.BigEndian.PutUint64(ans[32:], stamp(recv))
		binary.BigEndian.PutUint64(ans[40:], stamp(time.Now().Add(s.shift)))
		if _, err := s.conn.WriteTo(ans, from); err == nil {
			s.answers.Add(1)
		}
	}
}
