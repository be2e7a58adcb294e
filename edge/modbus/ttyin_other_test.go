//go:build !linux

package modbus

import "errors"

// ttyQueued is not available here: callers skip what needs it.
func ttyQueued(uintptr) (int, error) { return 0, errors.ErrUnsupported }
