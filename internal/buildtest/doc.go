// Package buildtest owns the tests of build/: the install script in a
// scratch DESTDIR, the systemd unit (systemd-analyze verify), the OpenWrt
// init script under a procd stand-in, the licence notices, reproducible
// builds and release tarballs, and the cross-compiled binaries under
// qemu-user. It has no code of its own besides its tests.
//
// It never touches the real root: every install goes below a temporary
// DESTDIR, every build into a temporary directory. The slow parts (a cold
// cache rebuild, the demo under qemu) run only with EDGEGW_BUILD_TESTS=1 or
// CI=true and are skipped with a message otherwise.
//
// Concurrency: the tests run child processes (sh, go, tar, qemu) one at a
// time per test and wait for each; nothing outlives its test.
package buildtest
