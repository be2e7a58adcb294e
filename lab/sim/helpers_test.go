package sim

import (
	"io"
	"log/slog"
	"net"
	"runtime"
	"time"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type runtimeMem struct{ heap uint64 }

func (m *runtimeMem) read() {
	runtime.GC()
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.heap = s.HeapAlloc
}

type tcpDialer struct{}

func (tcpDialer) dial(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return c, err
}
