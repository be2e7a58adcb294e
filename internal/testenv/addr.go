package testenv

import (
	"net"
	"testing"
)

// RefusedAddr is a loopback TCP address that nothing listens on (a
// listener's, closed): a dial there is refused, where a fixed port might
// be held by another process.
func RefusedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// SilentUDPAddr is a loopback UDP address where a socket is open until
// the test ends and never answers: a dead device.
func SilentUDPAddr(t testing.TB) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.LocalAddr().String()
}
