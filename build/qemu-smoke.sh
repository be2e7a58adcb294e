#!/bin/sh
# qemu-smoke.sh: run a cross-compiled edgegw under qemu-user (called
# explicitly: binfmt is not registered) and check what an integrator does
# first: version, check on the example config, and a short demo whose page
# and /api/shortPolling answer on loopback.
#
#   build/qemu-smoke.sh QEMU BINARY CONFIG [DEVICES [LAB]]
#   e.g. build/qemu-smoke.sh qemu-arm dist/edgegw-armv7 build/edgegw.example.toml 48 dist/edgegw-lab-armv7
#
# BINARY runs version and check; the demo runs LAB (the lab build, which has
# the demo; the release gateway binary does not), or BINARY when LAB is not
# given.
#
# The demo prints a line "page: http://127.0.0.1:PORT/" on stdout once it
# serves; the script reads the URL from it (no fixed port), then sends
# SIGINT and waits for a clean exit. It reports the peak RSS of the
# emulated process (VmHWM of qemu, which includes qemu's own few MB).
set -eu

[ $# -ge 3 ] || { echo "usage: $0 QEMU BINARY CONFIG [DEVICES]" >&2; exit 2; }
qemu=$1 bin=$2 config=$3 devices=${4:-48} lab=${5:-$2}
start_timeout=${SMOKE_START_TIMEOUT:-90} # seconds: emulation is slow on 2 shared cores
stop_timeout=${SMOKE_STOP_TIMEOUT:-30}
command -v "$qemu" >/dev/null || { echo "qemu-smoke: $qemu not found (Debian qemu-user)" >&2; exit 1; }
tag="qemu-smoke($(basename "$bin"))"

work=$(mktemp -d)
pid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

# alive PID: running (an exited child stays a zombie until wait, and kill -0
# succeeds on a zombie).
alive() {
	st=$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true)
	[ -n "$st" ] && [ "$st" != Z ]
}

fail() {
	echo "$tag: FAIL: $*" >&2
	for f in "$work/out" "$work/err"; do
		[ -s "$f" ] && { echo "--- $(basename "$f"):" >&2; tail -n 20 "$f" >&2; }
	done
	exit 1
}

# 1. version
v=$("$qemu" "$bin" version) || fail "version exited $?"
case $v in "edgegw "*) ;; *) fail "version printed: $v" ;; esac
echo "$tag: $v"

# 2. check on the example config
"$qemu" "$bin" check -config "$config" >"$work/out" 2>"$work/err" || fail "check -config $config exited $?"
echo "$tag: check $config ok"

# 3. demo on loopback
: >"$work/out"
"$qemu" "$lab" demo -devices "$devices" -http 127.0.0.1:0 >"$work/out" 2>"$work/err" &
pid=$!
url=
i=0
while [ -z "$url" ]; do
	url=$(sed -n 's/^page: \(http:\/\/127\.0\.0\.1:[0-9][0-9]*\/\)$/\1/p' "$work/out" | head -n 1)
	[ -n "$url" ] && break
	alive "$pid" || { wait "$pid" || true; pid=; fail "demo exited before printing 'page: http://127.0.0.1:PORT/'"; }
	i=$((i + 1))
	[ $i -le $((start_timeout * 10)) ] || fail "no 'page:' line within ${start_timeout}s"
	sleep 0.1 # poll interval of the readiness check above (bounded by start_timeout)
done
echo "$tag: demo serves $url"

curl -fsS --max-time 20 -o "$work/page" "$url" || fail "GET $url"
grep -qi '<html' "$work/page" || fail "GET $url: not an HTML page"
# shortPolling may answer before the first poll lands: retry until a tag is
# in (bounded).
i=0
while :; do
	curl -fsS --max-time 20 -o "$work/short" "${url}api/shortPolling" || fail "GET ${url}api/shortPolling"
	grep -q '"seq"' "$work/short" || fail "shortPolling without \"seq\": $(head -c 200 "$work/short")"
	grep -q '"device"' "$work/short" && break
	i=$((i + 1))
	[ $i -le 100 ] || fail "shortPolling has no samples after 100 tries: $(head -c 200 "$work/short")"
	sleep 0.2 # poll interval, bounded by the count above
done
echo "$tag: / and /api/shortPolling answer ($(wc -c <"$work/short" | tr -d ' ') bytes of samples)"

rss=$(awk '/^VmHWM:/ { print $2 " " $3 }' "/proc/$pid/status" 2>/dev/null || echo "?")
echo "$tag: peak RSS under $qemu with $devices loggers: $rss"

kill -INT "$pid"
i=0
while alive "$pid"; do
	i=$((i + 1))
	[ $i -le $((stop_timeout * 10)) ] || fail "demo still running ${stop_timeout}s after SIGINT"
	sleep 0.1 # poll interval of the exit check (bounded by stop_timeout)
done
rc=0
wait "$pid" || rc=$?
pid=
[ $rc -eq 0 ] || fail "demo exited $rc after SIGINT"
echo "$tag: demo stopped cleanly on SIGINT"
