#!/bin/sh
# loaded.sh: run a command with one CPU-bound process beside it for the
# whole run (make test-loaded), the way CI shares its 2 cores with other
# work. The busy process is stopped when the command ends, however it ends,
# and cannot outlive it by more than its own 2-hour bound.
#
#   build/loaded.sh CMD [ARGS...]
set -u
[ $# -ge 1 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
timeout 7200 sh -c 'while :; do :; done' &
busy=$!
trap 'kill "$busy" 2>/dev/null; wait "$busy" 2>/dev/null' EXIT INT TERM
echo "loaded.sh: CPU-bound process $busy beside: $*"
"$@"
rc=$?
echo "loaded.sh: $* exited $rc (with the CPU-bound process beside it)"
exit $rc
