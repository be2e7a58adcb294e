//go:build linux && (amd64 || arm || arm64)

package modbus

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"syscall"
	"unsafe"
)

// Batched datagrams: sendmmsg(2) for the requests of a round, recvmmsg(2)
// for the replies, through the socket's syscall.RawConn so the runtime's
// poller does the waiting. Written on the syscall package rather than
// golang.org/x/net/ipv4 (whose ReadBatch allocates a *net.UDPAddr per
// datagram): no allocation per datagram either way.

const batchSupported = true

// mmsghdr is struct mmsghdr: a msghdr and the byte count the kernel sets.
// Go pads it to the C layout (64 bytes on 64-bit, 32 on arm).
type mmsghdr struct {
	hdr syscall.Msghdr
	n   uint32
}

// rawSockaddr is a sockaddr_in or sockaddr_in6 in the socket's family.
type rawSockaddr struct {
	b [syscall.SizeofSockaddrInet6]byte
	n uint32
}

// sockaddr encodes ap for a socket of family fam (IPv4 addresses are
// v4-mapped on an AF_INET6 socket); ok is false if it cannot be sent to.
func sockaddr(fam int, ap netip.AddrPort) (sa rawSockaddr, ok bool) {
	a := ap.Addr()
	binary.BigEndian.PutUint16(sa.b[2:], ap.Port())
	switch {
	case fam == syscall.AF_INET && a.Is4():
		binary.NativeEndian.PutUint16(sa.b[:], syscall.AF_INET)
		a4 := a.As4()
		copy(sa.b[4:], a4[:])
		sa.n = syscall.SizeofSockaddrInet4
	case fam == syscall.AF_INET6:
		binary.NativeEndian.PutUint16(sa.b[:], syscall.AF_INET6)
		a16 := a.As16()
		copy(sa.b[8:], a16[:])
		sa.n = syscall.SizeofSockaddrInet6
		if a.Zone() != "" {
			return sa, false
		}
	default:
		return sa, false
	}
	return sa, true
}

// parseSockaddr decodes what recvmmsg wrote into b.
func parseSockaddr(b []byte) netip.AddrPort {
	port := binary.BigEndian.Uint16(b[2:])
	switch binary.NativeEndian.Uint16(b) {
	case syscall.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)
	case syscall.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), port)
	}
	return netip.AddrPort{}
}

// socketFamily is the address family of the bound socket.
func (s *UDPSocket) socketFamily() int {
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return 0
	}
	fam := 0
	_ = rc.Control(func(fd uintptr) {
		sa, err := syscall.Getsockname(int(fd))
		switch sa.(type) {
		case *syscall.SockaddrInet4:
			fam = syscall.AF_INET
		case *syscall.SockaddrInet6:
			fam = syscall.AF_INET6
		}
		_ = err
	})
	return fam
}

// mmsgBatch is the reusable state of one sendmmsg or recvmmsg loop. The
// bound method values are made once, so a call allocates nothing.
type mmsgBatch struct {
	hdrs   []mmsghdr
	iovs   []syscall.Iovec
	names  []rawSockaddr // recv: where the kernel writes each source
	off, n int           // messages hdrs[off:n] still to go
	got    int           // messages handled by the last call
	errno  syscall.Errno
	sendF  func(fd uintptr) bool
	recvF  func(fd uintptr) bool
}

func newMmsgBatch() *mmsgBatch {
	b := &mmsgBatch{}
	b.sendF = b.send
	b.recvF = b.recv
	return b
}

func (b *mmsgBatch) grow(n int) {
	if cap(b.hdrs) < n {
		b.hdrs = make([]mmsghdr, n)
		b.iovs = make([]syscall.Iovec, n)
	}
	b.hdrs, b.iovs = b.hdrs[:n], b.iovs[:n]
}

// set points message i at buf, to or from name.
func (b *mmsgBatch) set(i int, buf []byte, name *rawSockaddr, namelen uint32) {
	b.iovs[i].Base = &buf[0]
	b.iovs[i].SetLen(len(buf))
	h := &b.hdrs[i].hdr
	h.Name = &name.b[0]
	h.Namelen = namelen
	h.Iov = &b.iovs[i]
	h.Iovlen = 1
	b.hdrs[i].n = 0
}

func (b *mmsgBatch) send(fd uintptr) bool {
	r, _, e := syscall.Syscall6(sysSendmmsg, fd, uintptr(unsafe.Pointer(&b.hdrs[b.off])), uintptr(b.n-b.off), 0, 0, 0)
	b.got, b.errno = int(r), e
	return e != syscall.EAGAIN
}

func (b *mmsgBatch) recv(fd uintptr) bool {
	r, _, e := syscall.Syscall6(sysRecvmmsg, fd, uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(len(b.hdrs)), 0, 0, 0)
	b.got, b.errno = int(r), e
	return e != syscall.EAGAIN
}

// errBatchUnsupported: the kernel refused sendmmsg/recvmmsg; the socket
// falls back to one syscall per datagram.
var errBatchUnsupported = errors.New("sendmmsg/recvmmsg not supported")

func unsupported(e syscall.Errno) bool { return e == syscall.ENOSYS || e == syscall.EOPNOTSUPP }

// sendBatch sends the datagrams prepared in b.hdrs[:n] with as few
// sendmmsg calls as the kernel allows. failed(i, err) is called for a
// message the kernel refused (the others still go). It returns how many
// messages it handled: all of them, or fewer with errBatchUnsupported
// (sendmmsg missing) or the socket's error.
func (s *UDPSocket) sendBatch(b *mmsgBatch, n int, failed func(i int, err error)) (int, error) {
	b.off, b.n = 0, n
	for b.off < b.n {
		if err := s.raw.Write(b.sendF); err != nil {
			return b.off, err
		}
		switch {
		case b.errno == 0:
			b.off += b.got
		case unsupported(b.errno) && b.off == 0:
			return 0, errBatchUnsupported
		default: // the first remaining message was refused
			failed(b.off, b.errno)
			b.off++
		}
	}
	return n, nil
}

// recvBatch reads at least one datagram (waiting for it) and as many more
// as are queued, up to len(bufs); it returns how many, with their sources
// in b.names and their lengths in b.hdrs[i].n.
func (s *UDPSocket) recvBatch(b *mmsgBatch, bufs [][]byte) (int, error) {
	for i := range bufs {
		b.set(i, bufs[i], &b.names[i], uint32(len(b.names[i].b)))
	}
	if err := s.raw.Read(b.recvF); err != nil {
		return 0, err
	}
	if b.errno != 0 {
		if unsupported(b.errno) {
			return 0, errBatchUnsupported
		}
		return 0, b.errno
	}
	return b.got, nil
}

// source and length of received datagram i.
func (b *mmsgBatch) source(i int) netip.AddrPort { return parseSockaddr(b.names[i].b[:]) }
func (b *mmsgBatch) length(i int) int            { return int(b.hdrs[i].n) }

// newRecvBatch sizes a batch for n datagrams.
func newRecvBatch(n int) *mmsgBatch {
	b := newMmsgBatch()
	b.grow(n)
	b.names = make([]rawSockaddr, n)
	return b
}
