//go:build !linux

package sdnotify

// monotonicUsec: systemd exists on Linux only.
func monotonicUsec() (int64, bool) { return 0, false }
