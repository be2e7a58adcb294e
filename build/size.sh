#!/bin/sh
# size.sh: binary size per target and the largest packages by symbol size,
# so growth is visible in every review. Fails when the armv7 gateway binary
# is above its budget (the gateways have small flash); says how far it is
# from the goal below the budget.
#
#   build/size.sh BINDIR SYMBIN [BUDGET_BYTES [GOAL_BYTES]]
#
# BINDIR holds the release binaries edgegw-{armv7,arm64,amd64} (stripped);
# SYMBIN is an armv7 build of the same source without -s -w (symbols).
set -eu

[ $# -ge 2 ] || { echo "usage: $0 BINDIR SYMBIN [BUDGET_BYTES [GOAL_BYTES]]" >&2; exit 2; }
bindir=$1 symbin=$2 budget=${3:-8100000} goal=${4:-$budget}
GO=${GO:-go}
top=${TOP:-15}

echo "binary sizes (stripped, as shipped):"
for arch in armv7 arm64 amd64; do
	f=$bindir/edgegw-$arch
	if [ -f "$f" ]; then
		n=$(wc -c <"$f" | tr -d ' ')
		awk -v a="$arch" -v n="$n" 'BEGIN { printf "  %-6s %10d bytes  %6.2f MiB\n", a, n, n / 1048576 }'
	fi
done

echo
echo "largest $top packages in armv7 by symbol bytes in the file (build/symsize):"
here=$(cd "$(dirname "$0")" && pwd)
(cd "$here/.." && "$GO" run ./build/symsize -n "$top" "$symbin")

n=$(wc -c <"$bindir/edgegw-armv7" | tr -d ' ')
if [ "$n" -gt "$budget" ]; then
	echo "size.sh: armv7 binary is $n bytes, budget is ≤ $budget" >&2
	exit 1
fi
echo
echo "armv7 budget: $n ≤ $budget bytes ok"
if [ "$n" -gt "$goal" ]; then
	echo "armv7 goal:   $n > $goal bytes: $((n - goal)) bytes to go"
else
	echo "armv7 goal:   $n ≤ $goal bytes ok ($((budget - n)) bytes under the budget)"
fi
