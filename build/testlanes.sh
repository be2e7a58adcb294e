#!/usr/bin/env bash
# testlanes.sh: the go test part of make test, in two lanes run side by side
# on the 2 cores, then a table of what each step took.
#
#   build/testlanes.sh LOGDIR
#
# Lane A runs the packages whose tests measure scheduling on real sockets
# (SCHED_PKGS: the root's end-to-end tests, edge, web), one package at a
# time, so that two of them never share the machine. Lane B runs every
# other package (bench's soak and smokes among them), one at a time, then
# every fuzz target for FUZZTIME inputs and the pure tests under qemu. So each scheduling test runs beside
# at most one other test binary or build: the tests must pass under that
# load (and do under make test-loaded, which adds a CPU-bound process).
#
# The root package holds both kinds: its end-to-end tests that check
# scheduling (windows kept under a flood, a reload, resumes) run in lane A,
# those that check what a command prints, what is stored or what crosses a
# protocol (ROOT_B, a regexp of whole test names) in lane B after the other
# packages, so that the two halves of the longest package run side by side.
#
# Environment: GO, TESTFLAGS (go test flags, -p 1 included), SCHED_PKGS,
# ROOT_B, MAKE (for fuzz-brief and test-qemu). Exit status: non-zero when any
# step failed; both lanes always run to the end.
set -uo pipefail
logdir=${1:?usage: testlanes.sh LOGDIR}
GO=${GO:-go}
MAKE=${MAKE:-make}
TESTFLAGS=${TESTFLAGS:--race -p 1 -timeout 15m}
SCHED_PKGS=${SCHED_PKGS:-edgegw edgegw/edge/... edgegw/web/...}
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

laneA() {
	local rc=0 others
	others=$(printf '%s\n' $sched | grep -vx edgegw)
	# shellcheck disable=SC2086
	if printf '%s\n' $sched | grep -qx edgegw; then
		step gotest-root-a A $GO test $TESTFLAGS -skip "$ROOT_B" edgegw || rc=1
	fi
	# shellcheck disable=SC2086
	step gotest-sched A $GO test $TESTFLAGS $others || rc=1
	return $rc
}
laneB() {
	local rc=0
	# shellcheck disable=SC2086
	step gotest-rest B $GO test $TESTFLAGS $rest || rc=1
	if printf '%s\n' $sched | grep -qx edgegw; then
		step gotest-root-b B $GO test $TESTFLAGS -run "$ROOT_B" edgegw || rc=1
	fi
	step fuzz-brief B $MAKE --no-print-directory fuzz-brief || rc=1
	step test-qemu B $MAKE --no-print-directory test-qemu || rc=1
	return $rc
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
