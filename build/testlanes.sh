#!/usr/bin/env bash
# testlanes.sh: the go test part of make test, in lanes run side by side on
# the 2 cores, then a table of what each step took.
#
#   build/testlanes.sh LOGDIR
#
# Lane A runs the packages whose tests measure scheduling on real sockets
# (SCHED_PKGS: e2e's end-to-end tests, edge, web, mbserver), one
# package at a time, so that two of them never share the machine. The rest
# (every other package, bench's soak and smokes among them, every fuzz
# target for FUZZTIME inputs, the pure tests under qemu) is a queue that
# QUEUE_LANES lanes (B, C, ...; 2 by default) work from the start and lane A
# joins when it is done. Most of the suite waits on real time (intervals,
# timeouts, processes starting): two lanes kept the 2 cores ~40% busy and
# made the run as long as its two longest chains. So each scheduling test
# runs beside up to QUEUE_LANES other test binaries or builds: the tests
# must pass under that load (and do under make test-loaded, which adds a
# CPU-bound process).
#
# The e2e package (the tests that drive the built binary) holds both kinds:
# its tests that check scheduling (windows kept under a flood, a reload,
# resumes) run in lane A, those that check what a command prints, what is
# stored or what crosses a protocol (E2E_B, a regexp of whole test names)
# are the queue's first item, so that the two halves of the longest package
# run side by side.
#
# Environment: GO, TESTFLAGS (go test flags, -p 1 included), SCHED_PKGS,
# E2E_B, QUEUE_LANES, MAKE (for fuzz-brief and test-qemu). Exit status:
# non-zero when any step failed; every lane always runs to the end.
set -uo pipefail
logdir=${1:?usage: testlanes.sh LOGDIR}
GO=${GO:-go}
MAKE=${MAKE:-make}
TESTFLAGS=${TESTFLAGS:--race -p 1 -timeout 15m}
SCHED_PKGS=${SCHED_PKGS:-edgegw/e2e edgegw/edge/... edgegw/web/...}
E2E_B=${E2E_B:-'^(TestCheck.*|TestReadCommandByteOrders|TestScan.*|TestVersion|TestBasicAuthFromConfig|TestFaultFreshInstallStarts|TestFaultCheckAndRunAgreeOnMissingFile|TestPowerLossIsReported|TestSharedSpool.*|TestEpoch.*|TestSparkplug.*|TestDemoSparkplug|TestWireBytesReportByException|TestUplinkBytes|TestMQTTBrokerClusterFailover|TestWebSocketURLsFailoverE2E|TestHostileReceiver.*|TestAcceptErrorsLoggedE2E)$'}
QUEUE_LANES=${QUEUE_LANES:-2}
rm -rf "$logdir" && mkdir -p "$logdir"

sched=$($GO list $SCHED_PKGS) || exit 1
rest=$($GO list ./... | grep -vxF -f <(printf '%s\n' $sched)) || exit 1

# gotest ARGS...: go test with TESTFLAGS and ARGS, its output the plain one
# (build/gotestjson.py) and each top-level test's seconds kept in
# LOGDIR/tests.tsv; the exit status is go test's.
here=$(cd "$(dirname "$0")" && pwd)
gotest() {
	# shellcheck disable=SC2086
	$GO test -json $TESTFLAGS "$@" | python3 "$here/gotestjson.py" "$logdir/tests.tsv"
	return "${PIPESTATUS[0]}"
}

# step NAME LANE CMD...: runs CMD with its output prefixed by [LANE] and
# kept in LOGDIR/NAME.log; records NAME's exit status and seconds.
step() {
	local name=$1 lane=$2
	shift 2
	local t0=$SECONDS
	"$@" 2>&1 | sed -u "s/^/[$lane] /" | tee "$logdir/$name.log"
	local rc=${PIPESTATUS[0]}
	echo "$name $rc $((SECONDS - t0))" >>"$logdir/steps"
	return "$rc"
}

# The work that checks no scheduling is a queue every lane takes from, the
# longest first: lanes B, C... from the start, lane A once its scheduling-checking
# packages are done. An item is claimed by mkdir (atomic), so each runs once.
# shellcheck disable=SC2086
big=$(printf '%s\n' $rest | grep -xE 'edgegw/internal/buildtest|edgegw/lab/bench')
small=$(printf '%s\n' $rest | grep -vxE 'edgegw/internal/buildtest|edgegw/lab/bench')
queue=()
if printf '%s\n' $sched | grep -qx edgegw/e2e; then
	queue+=("gotest-e2e-b|gotest -run '$E2E_B' edgegw/e2e")
fi
for p in $big; do
	queue+=("gotest-${p##*/}|gotest $p")
done
queue+=("gotest-rest|gotest $(echo $small)")
queue+=("fuzz-brief|$MAKE --no-print-directory fuzz-brief")
queue+=("test-qemu|$MAKE --no-print-directory test-qemu")

# work LANE: runs every queue item no lane has claimed yet.
work() {
	local lane=$1 rc=0 i name cmd
	for i in "${!queue[@]}"; do
		mkdir "$logdir/claim.$i" 2>/dev/null || continue
		name=${queue[$i]%%|*} cmd=${queue[$i]#*|}
		step "$name" "$lane" eval "$cmd" || rc=1
	done
	return $rc
}

laneA() {
	local rc=0 others
	others=$(printf '%s\n' $sched | grep -vx edgegw/e2e)
	# shellcheck disable=SC2086
	if printf '%s\n' $sched | grep -qx edgegw/e2e; then
		step gotest-e2e-a A gotest -skip "$E2E_B" edgegw/e2e || rc=1
	fi
	# shellcheck disable=SC2086
	step gotest-sched A gotest $others || rc=1
	work A || rc=1
	return $rc
}
t0=$SECONDS
laneA &
pids=($!)
for l in B C D E F; do
	[ ${#pids[@]} -gt "$QUEUE_LANES" ] && break
	work $l &
	pids+=($!)
done
status=0
for p in "${pids[@]}"; do
	wait "$p" || status=1
done

echo
echo "== make test: time per package (go test's own figure; lane A one package at a time beside lanes B..)"
cat "$logdir"/gotest-*.log | awk '$2 == "ok" || $2 == "FAIL" {
	if ($4 ~ /s$/) { t = $4; sub(/s$/, "", t); printf "%9.1f s  %-4s %s %s\n", t, $2, $1, $3 } }' | sort -rn
echo "== the 15 slowest tests (seconds, package, test, result)"
sort -rn "$logdir/tests.tsv" 2>/dev/null | head -15 | awk -F'\t' '{ printf "%9.1f s  %-4s %s %s\n", $1, $4, $2, $3 }'
echo "== steps (wall time)"
while read -r name rc secs; do
	printf '%6d s  %-14s %s\n' "$secs" "$name" "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
done <"$logdir/steps"
printf '%6d s  %s\n' "$((SECONDS - t0))" "all lanes"
pass=$(cat "$logdir"/gotest-*.log | awk '$2 == "ok"' | wc -l)
fail=$(cat "$logdir"/gotest-*.log | awk '$2 == "FAIL" && $4 ~ /s$/' | wc -l)
echo "packages: $pass passed, $fail failed"
[ "$status" = 0 ]
