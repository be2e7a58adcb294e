package modbus

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	gb "github.com/goburrow/modbus"
)

// ErrTimeout is wrapped by every error that means "no reply in time": net
// timeouts and the UDP and RTU reply timeouts. Test with errors.Is.
var ErrTimeout = errors.New("timeout")

// ErrBackoff is wrapped by the quick error a TCP connection returns while it
// waits out its reconnect backoff: the device was not contacted. That error
// is a *BackoffError: it says what started the backoff.
var ErrBackoff = errors.New("reconnect backoff")

// BackoffError is the quick error of a connection waiting out its reconnect
// backoff. It reads as the failure that started the backoff, with the wait:
// "dial tcp 127.0.0.1:502: connect: connection refused (next try in 9.7 s)",
// so a device's reason keeps its cause. It unwraps to ErrBackoff only: a
// dial that timed out does not make the backoff a timeout (errors.Is(err,
// ErrTimeout) is false), and a frame error that started it is not a frame
// received now (Cause holds it).
type BackoffError struct {
	Cause error         // the failure that started the backoff (nil: unknown)
	Wait  time.Duration // left before the next attempt
}

func (e *BackoffError) Error() string {
	cause := ErrBackoff.Error()
	if e.Cause != nil {
		cause = e.Cause.Error()
	}
	return cause + " (next try in " + fmtWait(e.Wait) + ")"
}

func (e *BackoffError) Unwrap() error { return ErrBackoff }

// fmtWait is a wait as people read it: "150 ms", "9.7 s".
func fmtWait(d time.Duration) string {
	if d < time.Second {
		return strconv.FormatInt(d.Round(time.Millisecond).Milliseconds(), 10) + " ms"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
}

// ErrRequest is wrapped when a request is refused before sending (quantity
// or value out of the protocol's range).
var ErrRequest = errors.New("invalid request")

// FrameError is a reply that could not be accepted: malformed, length wrong
// for the quantity asked, transaction id / unit / function mismatch, echo
// mismatch or bad CRC. The stream it came from is not trusted afterwards.
type FrameError struct {
	Reason string
	// OtherUnit: a whole, checked serial frame from a unit other than the
	// one asked (a late reply to an earlier request on the line).
	OtherUnit bool
	// OtherFunction: a whole, checked serial frame from the unit asked but
	// for another function (the late reply to its previous request, e.g. a
	// read answered after its timeout while a write waits).
	OtherFunction bool
}

// late reports whether the frame answers another request: skipped as a
// late reply, never taken as ours.
func (e *FrameError) late() bool { return e.OtherUnit || e.OtherFunction }

func (e *FrameError) Error() string { return "modbus: bad frame: " + e.Reason }

func frameErr(format string, args ...any) error {
	return &FrameError{Reason: fmt.Sprintf(format, args...)}
}

// ModbusError is goburrow's exception error, re-exported for errors.As.
type ModbusError = gb.ModbusError

// IsException reports whether err is (or wraps) a Modbus exception reply and
// returns its exception code. Exceptions leave the stream clean.
func IsException(err error) (code byte, ok bool) {
	var me *gb.ModbusError
	if errors.As(err, &me) {
		return me.ExceptionCode, true
	}
	return 0, false
}

// timeoutAfter is the ErrTimeout-wrapping error for a wait of d.
func timeoutAfter(d time.Duration) error {
	return fmt.Errorf("%w after %v", ErrTimeout, d)
}

// classify turns net timeouts into ErrTimeout (keeping the cause) and
// leaves every other error as it is.
func classify(err error, d time.Duration) error {
	if err == nil || errors.Is(err, ErrTimeout) {
		return err
	}
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return timeoutAfter(d)
	}
	return err
}
