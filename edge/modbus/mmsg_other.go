//go:build !(linux && (amd64 || arm || arm64))

package modbus

import (
	"errors"
	"net/netip"
)

// Without sendmmsg/recvmmsg (another OS or architecture) every datagram is
// one syscall; rounds and matching behave the same.

const batchSupported = false

type rawSockaddr struct{ n uint32 }

func sockaddr(int, netip.AddrPort) (rawSockaddr, bool) { return rawSockaddr{}, false }

func (s *UDPSocket) socketFamily() int { return 0 }

type mmsgBatch struct{}

func newMmsgBatch() *mmsgBatch                             { return &mmsgBatch{} }
func newRecvBatch(int) *mmsgBatch                          { return &mmsgBatch{} }
func (b *mmsgBatch) grow(int)                              {}
func (b *mmsgBatch) set(int, []byte, *rawSockaddr, uint32) {}

var errBatchUnsupported = errors.New("sendmmsg/recvmmsg not supported")

func (s *UDPSocket) sendBatch(*mmsgBatch, int, func(int, error)) (int, error) {
	return 0, errBatchUnsupported
}

func (s *UDPSocket) recvBatch(*mmsgBatch, [][]byte) (int, error) { return 0, errBatchUnsupported }

func (b *mmsgBatch) source(int) netip.AddrPort { return netip.AddrPort{} }
func (b *mmsgBatch) length(int) int            { return 0 }
