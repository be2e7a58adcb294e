package modbus

import (
	"fmt"
	"time"
)

// Modbus ASCII framing (Modbus over Serial Line V1.02, 2.5.2): every byte
// of unit, PDU and LRC as two hex characters between ':' and CRLF.
//
//	start    : ':'                        1 char
//	unit     : 2 hex chars
//	PDU      : function, data             2 hex chars a byte (≤ 253 bytes)
//	LRC      : 2 hex chars: the two's complement of the sum of unit and PDU bytes
//	end      : CR LF                      2 chars
//
// goburrow's ASCII packager encodes requests and decodes replies; the
// RTUPort (ascii set) moves the characters, frames a reply by its ':' and
// CRLF, checks hex, LRC and unit here, and hands the frame to the packager
// (whose Verify also runs checkPDU on the decoded PDU: asciiFraming).
const asciiMaxFrame = 1 + 2*(1+253+1) + 2 // 513 characters

// asciiFraming marks the PDU of an ASCII ADU: hex between ':' + unit and
// LRC + CRLF; Verify decodes it before checkPDU.
var asciiFraming = framing{head: 1, tail: 1, hex: true}

// readASCIIFrame reads one ASCII reply into buf (at least asciiMaxFrame
// bytes): characters before ':' are skipped (noise on the line; a ':'
// starts the frame again, as the standard says), the frame ends at CRLF.
// A frame longer than asciiMaxFrame is a frame error. It checks nothing
// else: decodeASCII does.
func readASCIIFrame(read readFunc, deadline time.Time, timeout time.Duration, buf []byte) ([]byte, error) {
	got := 0       // characters of the frame in buf, ':' included
	var c [64]byte // what one read returned
	for {
		n, err := read(c[:], deadline)
		for _, b := range c[:n] {
			switch {
			case b == ':':
				buf[0], got = b, 1
			case got == 0: // before the start: noise
			case got >= asciiMaxFrame:
				return nil, frameErr("ascii frame longer than %d characters", asciiMaxFrame)
			default:
				buf[got] = b
				got++
				if b == '\n' && buf[got-2] == '\r' {
					return buf[:got], nil // characters after CRLF are left to the next drain
				}
			}
		}
		if err != nil {
			return nil, classify(err, timeout)
		}
		if n == 0 && !time.Now().Before(deadline) {
			if got > 0 {
				return nil, fmt.Errorf("%w (%d characters of a frame)", timeoutAfter(timeout), got)
			}
			return nil, timeoutAfter(timeout)
		}
	}
}

// decodeASCII checks an ASCII frame (':', hex pairs, CRLF, the LRC) and
// returns its bytes: unit, PDU, LRC, in dst (grown as needed).
func decodeASCII(dst, f []byte) ([]byte, error) {
	if len(f) < 1+2*3+2 || f[0] != ':' || f[len(f)-2] != '\r' || f[len(f)-1] != '\n' {
		return nil, frameErr("ascii frame %q: want ':', unit, function, LRC, CRLF", truncate(f))
	}
	h := f[1 : len(f)-2]
	if len(h)%2 != 0 {
		return nil, frameErr("ascii frame of %d hex characters (odd)", len(h))
	}
	dst = dst[:0]
	var sum byte
	for i := 0; i < len(h); i += 2 {
		hi, ok1 := unhex(h[i])
		lo, ok2 := unhex(h[i+1])
		if !ok1 || !ok2 {
			return nil, frameErr("ascii frame: %q is not hex", h[i:i+2])
		}
		b := hi<<4 | lo
		dst = append(dst, b)
		sum += b
	}
	if sum != 0 { // unit + PDU + LRC sum to 0 mod 256
		n := len(dst)
		return nil, frameErr("lrc %#02x, want %#02x", dst[n-1], lrc(dst[:n-1]))
	}
	return dst, nil
}

// lrc is the longitudinal redundancy check of b.
func lrc(b []byte) byte {
	var s byte
	for _, x := range b {
		s += x
	}
	return -s
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func truncate(f []byte) []byte {
	if len(f) > 24 {
		return f[:24]
	}
	return f
}

// checkASCII checks a reply frame: hex, LRC, and its unit and function against the
// request frame's; the PDU is the packager's to check (pduPackager).
func checkASCII(req, f []byte) error {
	var b [asciiMaxFrame / 2]byte
	resp, err := decodeASCII(b[:0], f)
	if err != nil {
		return err
	}
	u, _ := decodeASCII(nil, req) // our own request: well formed
	return checkSerialReply(u, resp)
}
