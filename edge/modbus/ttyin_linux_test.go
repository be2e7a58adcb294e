package modbus

import (
	"syscall"
	"unsafe"
)

// ttyQueued is how many bytes wait in the input queue of the tty open on
// fd: the queue is the tty's, shared by every descriptor open on it.
func ttyQueued(fd uintptr) (int, error) {
	var n int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); e != 0 {
		return 0, e
	}
	return int(n), nil
}
