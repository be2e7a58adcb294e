#!/usr/bin/env bash
# testlanes.sh: the go test part of make test, in two lanes run side by side
# on the 2 cores, then a table of what each step took.
#
#   build/testlanes.sh LOGDIR
#
# Lane A runs the packages whose tests measure scheduling on real sockets
# (SCHED_PKGS: the root's end-to-end tests, edge, web, mbserver), one
# package at a time, so that two of them never share the machine. The rest
# (every other package, bench's soak and smokes among them, every fuzz
# target for FUZZTIME inputs, the pure tests under qemu) is a queue that
# lane B works from the start and lane A joins when it is done. So each
# scheduling test runs beside at most one other test binary or build: the tests must pass under that
# load (and do under make test-loaded, which adds a CPU-bound process).
#
# The root package holds both kinds: its end-to-end tests that check
# scheduling (windows kept under a flood, a reload, resumes) run in lane A,
# those that check what a command prints, what is stored or what crosses a
# protocol (ROOT_B, a regexp of whole test names) are the queue's first item,
# so that the two halves of the longest package run side by side.
#
# Environment: GO, TESTFLAGS (go test flags, -p 1 included), SCHED_PKGS,
# ROOT_B, MAKE (for fuzz-brief and test-qemu). Exit status: non-zero when any
# step failed; both lanes always run to the end.
set -uo pipefail
logdir=${1:?usage: testlanes.sh LOGDIR}
GO=${GO:-go}
MAKE=${MAKE:-make}
TESTFLAGS=${TESTFLAGS:--race -p 1 -timeout 15m}
SCHED_PKGS=${SCHED_PKGS:-edgegw/e2e edgegw/edge/... edgegw/web/...}
ROOT_B=${ROOT_B:-'^(TestCheck.*|TestReadCommandByteOrders|TestScan.*|TestParseUnits|TestStartupRefusalsNeverPanic|TestVersion|TestBasicAuthFromConfig|TestRingSizeByRate|TestWebLimitsMapping|TestWebFallbacksAreConfDefaults|TestFaultFreshInstallStarts|TestFaultCheckAndRunAgreeOnMissingFile|TestPowerLossIsReported|TestEpoch.*|TestSparkplug.*|TestDemoSparkplug|TestWireBytesReportByException|TestUplinkBytes|TestMQTTBrokerClusterFailover|TestWebSocketURLsFailoverE2E|TestHostileReceiver.*|TestAcceptErrorsLoggedE2E)$'}
rm -rf "$logdir" && mkdir -p "$logdir"

sched=$($GO list $SCHED_PKGS) || exit 1
rest=$($GO list ./... | grep -vxF -f <(printf '%s\n' $sched)) || exit 1

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

# The work that checks no scheduling is a queue both lanes take from, the
# longest first: lane B from the start, lane A once its scheduling-checking
# packages are done. An item is claimed by mkdir (atomic), so each runs once.
# shellcheck disable=SC2086
big=$(printf '%s\n' $rest | grep -xE 'edgegw/internal/buildtest|edgegw/bench')
small=$(printf '%s\n' $rest | grep -vxE 'edgegw/internal/buildtest|edgegw/bench')
queue=()
if printf '%s\n' $sched | grep -qx edgegw/e2e; then
	queue+=("gotest-root-b|$GO test $TESTFLAGS -run '$ROOT_B' edgegw/e2e")
fi
for p in $big; do
	queue+=("gotest-${p##*/}|$GO test $TESTFLAGS $p")
done
queue+=("gotest-rest|$GO test $TESTFLAGS $(echo $small)")
queue+=("fuzz-brief|$MAKE --no-print-directory fuzz-brief")
queue+=("test-qemu|$MAKE --no-print-directory test-qemu")

# work LANE: runs every queue item no lane has claimed yet.
work() {
	local lane=$1 rc=0 i name cmd
	for i in "${!queue[@]}"; do
		mkdir "$logdir/claim.$i" 2>/dev/null || continue
		name=${queue[$i]%%|*} cmd=${queue[$i]#*|}
		step "$name" "$lane" sh -c "$cmd" || rc=1
	done
	return $rc
}

laneA() {
	local rc=0 others
	others=$(printf '%s\n' $sched | grep -vx edgegw/e2e)
	# shellcheck disable=SC2086
	if printf '%s\n' $sched | grep -qx edgegw/e2e; then
		step gotest-root-a A $GO test $TESTFLAGS -skip "$ROOT_B" edgegw/e2e || rc=1
	fi
	# shellcheck disable=SC2086
	step gotest-sched A $GO test $TESTFLAGS $others || rc=1
	work A || rc=1
	return $rc
}
laneB() {
	work B
}

t0=$SECONDS
laneA &
a=$!
laneB &
b=$!
rcA=0 rcB=0
wait $a || rcA=$?
wait $b || rcB=$?

echo
echo "== make test: time per package (go test's own figure; lane A one package at a time beside lane B)"
cat "$logdir"/gotest-*.log | awk '$2 == "ok" || $2 == "FAIL" {
	if ($4 ~ /s$/) { t = $4; sub(/s$/, "", t); printf "%9.1f s  %-4s %s %s\n", t, $2, $1, $3 } }' | sort -rn
echo "== steps (wall time)"
while read -r name rc secs; do
	printf '%6d s  %-14s %s\n' "$secs" "$name" "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
done <"$logdir/steps"
printf '%6d s  %s\n' "$((SECONDS - t0))" "both lanes"
pass=$(cat "$logdir"/gotest-*.log | awk '$2 == "ok"' | wc -l)
fail=$(cat "$logdir"/gotest-*.log | awk '$2 == "FAIL" && $4 ~ /s$/' | wc -l)
echo "packages: $pass passed, $fail failed"
[ $rcA = 0 ] && [ $rcB = 0 ]
