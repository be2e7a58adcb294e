#!/bin/sh
# Runs the hot-path Go benchmarks COUNT times and compares them with
# lab/bench/baseline.txt using benchstat (fetched through the Go module proxy).
#   lab/bench/benchcmp.sh          compare with the baseline
#   lab/bench/benchcmp.sh -save    run and save the result as the new baseline
# Run it on an idle machine; compare only results from the same machine.
set -eu
cd "$(dirname "$0")/../.."
COUNT=${COUNT:-10}
PKGS=${PKGS:-"./ringstore/ ./spool/ ./edge/... ./web/ ./push/ ./wire/ ./lab/sim/ ./stats/ ./lab/bench/"}
BENCH=${BENCH:-.}
BENCHSTAT="go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# shellcheck disable=SC2086
go test -run '^$' -bench "$BENCH" -benchmem -count "$COUNT" $PKGS | tee "$out"
if [ "${1:-}" = "-save" ]; then
	cp "$out" lab/bench/baseline.txt
	echo "saved lab/bench/baseline.txt"
	exit 0
fi
if [ ! -f lab/bench/baseline.txt ]; then
	echo "no lab/bench/baseline.txt: run lab/bench/benchcmp.sh -save first" >&2
	exit 1
fi
$BENCHSTAT lab/bench/baseline.txt "$out"
