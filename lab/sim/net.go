package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

var errClosed = errors.New("sim: logger closed")

// bindLocked opens the logger's socket on its address (the first time with
// the port asked for, later on the port it got). Caller holds l.mu.
func (l *Logger) bindLocked() error {
	switch l.transport {
	case "tcp", "rtutcp":
		ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(l.addr))
		if err != nil {
			return fmt.Errorf("sim: %s: listen tcp %s: %w", l.name, l.addr, err)
		}
		l.ln = ln
		if l.addr.Port() == 0 { // first bind on a random port; later binds reuse it
			l.addr = ln.Addr().(*net.TCPAddr).AddrPort()
		}
	case "udp":
		uc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(l.addr))
		if err != nil {
			return fmt.Errorf("sim: %s: listen udp %s: %w", l.name, l.addr, err)
		}
		l.uc = uc
		if l.addr.Port() == 0 {
			l.addr = uc.LocalAddr().(*net.UDPAddr).AddrPort()
		}
	}
	return nil
}

// Stop powers the logger off: over TCP the listener and every connection
// are closed, over UDP the socket; pending delayed replies are discarded.
// Over RTU the unit stops answering. Idempotent.
func (l *Logger) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.off {
		return
	}
	l.off = true
	close(l.stop)
	if l.ln != nil {
		l.ln.Close()
		l.ln = nil
	}
	for c := range l.conns {
		c.Close()
	}
	clear(l.conns)
	if l.uc != nil {
		l.uc.Close()
		l.uc = nil
	}
	if l.uc2 != nil {
		l.uc2.Close()
		l.uc2 = nil
	}
	for t := range l.timers {
		if t.Stop() {
			l.wg.Done()
		}
	}
	clear(l.timers)
	l.log.Debug("sim: logger stopped")
}

// Start powers a stopped logger on again on the same address (uptime and
// sequence counter restart from zero; written registers are kept).
func (l *Logger) Start() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	if !l.off {
		return nil
	}
	if err := l.bindLocked(); err != nil {
		return err
	}
	l.off = false
	l.stop = make(chan struct{})
	l.eng.mu.Lock()
	l.eng.boot = l.eng.now()
	l.eng.mu.Unlock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.log.Debug("sim: logger started", "addr", l.Addr())
	return nil
}

// Restart is Stop then Start: a device restart as a client sees it.
func (l *Logger) Restart() error {
	l.Stop()
	return l.Start()
}

// shutdown stops the logger for good.
func (l *Logger) shutdown() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.Stop()
}

// run serves the logger's socket, and each new one after a restart, until
// ctx is done and the logger is shut down; it returns after every
// connection goroutine and delayed reply has finished.
func (l *Logger) run(ctx context.Context) {
	defer l.wg.Wait()
	var lastLn *net.TCPListener
	var lastUC *net.UDPConn
	for {
		l.mu.Lock()
		ln, uc, changed, stop := l.ln, l.uc, l.changed, l.stop
		l.mu.Unlock()
		switch {
		case ln != nil && ln != lastLn:
			lastLn = ln
			l.acceptLoop(ln, stop)
		case uc != nil && uc != lastUC:
			lastUC = uc
			l.readLoop(uc, stop)
		default:
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
	}
}

func (l *Logger) acceptLoop(ln *net.TCPListener, stop chan struct{}) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.log.Warn("sim: accept", "err", err)
			select { // e.g. EMFILE: back off a little instead of spinning
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		l.mu.Lock()
		if l.ln != ln {
			l.mu.Unlock()
			c.Close()
			continue
		}
		if l.conns == nil {
			l.conns = make(map[net.Conn]struct{})
		}
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		if l.transport == "rtutcp" {
			go l.serveRTUConn(c, stop)
		} else {
			go l.serveConn(c, stop)
		}
	}
}

// serveConn reads MBAP requests from one TCP connection and answers them in
// order, one at a time.
func (l *Logger) serveConn(c net.Conn, stop chan struct{}) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		c.Close()
	}()
	var req [maxMBAPLen]byte
	out := make([]byte, 0, maxMBAPLen)
	for {
		if _, err := io.ReadFull(c, req[:mbapHeaderLen]); err != nil {
			return
		}
		n := 6 + int(binary.BigEndian.Uint16(req[4:]))
		if binary.BigEndian.Uint16(req[2:]) != 0 || n < mbapHeaderLen+1 || n > maxMBAPLen {
			l.ctr.malformed.Add(1)
			return // the stream cannot be resynchronised: drop the connection
		}
		if _, err := io.ReadFull(c, req[mbapHeaderLen:n]); err != nil {
			return
		}
		r := l.serve(out[:0], req[:n], req[mbapHeaderLen:n])
		if r.frame == nil {
			continue
		}
		if r.delay > 0 && !wait(r.delay, stop, nil) {
			return
		}
		l.ctr.replies.Add(1) // before the write: a client that got it sees it counted
		if _, err := c.Write(r.frame); err != nil {
			return
		}
		if r.duplicate {
			if _, err := c.Write(r.frame); err != nil {
				return
			}
		}
	}
}

// serveRTUConn reads RTU frames (unit, PDU, CRC) from one TCP connection,
// framed by length per function code as on a serial line, and answers
// them in order. A bad CRC is counted as malformed and gets no reply; a
// function code whose request length is unknown drops the connection (a
// stream has no silence to end the frame).
func (l *Logger) serveRTUConn(c net.Conn, stop chan struct{}) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		c.Close()
	}()
	var tmp [512]byte
	buf := make([]byte, 0, 1024)
	out := make([]byte, 0, maxPDULen+3)
	for {
		n, err := c.Read(tmp[:])
		if err != nil {
			return
		}
		buf = append(buf, tmp[:n]...)
		for {
			need := rtuRequestLen(buf)
			if need < 0 {
				l.ctr.malformed.Add(1)
				return
			}
			if need == 0 || len(buf) < need {
				break
			}
			frame := buf[:need]
			if !rtuCRCOK(frame) {
				l.ctr.malformed.Add(1)
			} else if r := l.serve(out[:0], frame, frame[1:need-2]); r.frame != nil {
				if r.delay > 0 && !wait(r.delay, stop, nil) {
					return
				}
				l.ctr.replies.Add(1)
				if _, err := c.Write(r.frame); err != nil {
					return
				}
				if r.duplicate {
					if _, err := c.Write(r.frame); err != nil {
						return
					}
				}
			}
			buf = append(buf[:0], buf[need:]...)
		}
	}
}

// wait waits d; false if stop or done is closed first (nil never is).
func wait(d time.Duration, stop, done <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	case <-done:
		return false
	}
}

// readLoop serves MBAP datagrams on uc: one goroutine per socket, replies
// written inline, or by a timer when a delay fault is set.
func (l *Logger) readLoop(uc *net.UDPConn, stop chan struct{}) {
	buf := make([]byte, 2*maxMBAPLen) // larger than any valid ADU, so oversize is seen
	out := make([]byte, 0, maxMBAPLen)
	for {
		n, from, err := uc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				l.log.Warn("sim: udp read", "err", err)
			}
			return
		}
		pdu, ok := parseMBAP(buf[:n])
		if !ok {
			l.ctr.malformed.Add(1)
			continue
		}
		r := l.serve(out[:0], buf[:n], pdu)
		if r.frame == nil {
			continue
		}
		if r.delay <= 0 {
			l.sendUDP(uc, from, r)
			continue
		}
		r.frame = bytes.Clone(r.frame)
		l.mu.Lock()
		if l.uc != uc {
			l.mu.Unlock()
			continue
		}
		if l.timers == nil {
			l.timers = make(map[*time.Timer]struct{})
		}
		l.wg.Add(1)
		var t *time.Timer
		t = time.AfterFunc(r.delay, func() {
			defer l.wg.Done()
			l.mu.Lock()
			_, ok := l.timers[t]
			delete(l.timers, t)
			l.mu.Unlock()
			if ok {
				l.sendUDP(uc, from, r)
			}
		})
		l.timers[t] = struct{}{}
		l.mu.Unlock()
	}
}

func (l *Logger) sendUDP(uc *net.UDPConn, to netip.AddrPort, r reply) {
	if r.otherPort {
		if o := l.otherSocket(); o != nil {
			uc = o
		}
	}
	l.ctr.replies.Add(1)
	if _, err := uc.WriteToUDPAddrPort(r.frame, to); err != nil {
		return
	}
	if r.duplicate {
		_, _ = uc.WriteToUDPAddrPort(r.frame, to)
	}
}

// otherSocket is the second UDP socket (same IP, another port) used by the
// OtherPort fault; opened on first use, closed by Stop.
func (l *Logger) otherSocket() *net.UDPConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.uc2 == nil && !l.off {
		uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: l.addr.Addr().AsSlice()})
		if err != nil {
			l.log.Warn("sim: second udp socket", "err", err)
			return nil
		}
		l.uc2 = uc
	}
	return l.uc2
}
