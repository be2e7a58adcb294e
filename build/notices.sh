#!/bin/sh
# notices.sh: print THIRD_PARTY_NOTICES for the edgegw binary: the licence
# texts of every module it links (go list -deps of the main package, for
# the GOOS/GOARCH in the environment) and of the Go runtime and standard
# library. Reads the module cache only (GOPROXY=off, GOFLAGS=-mod=readonly):
# no network. Fails when a module is missing from the cache or ships no
# licence file, so a release never goes out with a gap.
#
#   GOOS=linux GOARCH=arm64 build/notices.sh [main package dir] > THIRD_PARTY_NOTICES
set -eu

GO=${GO:-go}
pkg=${1:-.}
export GOPROXY=off GOFLAGS=-mod=readonly

mods=$("$GO" list -deps -f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}' "$pkg" | sort -u)
goroot=$("$GO" env GOROOT)
gover=$("$GO" env GOVERSION)
goos=$("$GO" env GOOS)
goarch=$("$GO" env GOARCH)

# licence_files DIR: the licence/notice files at the module root, sorted.
licence_files() {
	find "$1" -maxdepth 1 -type f \( -iname 'LICENSE*' -o -iname 'LICENCE*' -o -iname 'COPYING*' -o -iname 'NOTICE*' \) | LC_ALL=C sort
}

rule='================================================================================'

echo "THIRD_PARTY_NOTICES"
echo
echo "The edgegw binary for $goos/$goarch links the software listed below. Their"
echo "licence texts follow, each in full. edgegw itself: see LICENSE."
echo
echo "  Go runtime and standard library $gover"
if [ -n "$mods" ]; then
	printf '%s\n' "$mods" | while read -r path version dir; do
		echo "  $path $version"
	done
fi

section() { # name version dir
	files=$(licence_files "$3")
	if [ -z "$files" ]; then
		echo "notices.sh: $1 $2: no LICENSE/COPYING file in $3" >&2
		exit 1
	fi
	printf '%s\n' "$files" | while read -r f; do
		echo
		echo "$rule"
		echo "$1 $2 ($(basename "$f"))"
		echo "$rule"
		echo
		cat "$f"
	done
}

section "Go runtime and standard library" "$gover" "$goroot"
if [ -n "$mods" ]; then
	printf '%s\n' "$mods" | while read -r path version dir; do
		if [ -z "$dir" ] || [ ! -d "$dir" ]; then
			echo "notices.sh: $path $version is not in the module cache (run: go mod download)" >&2
			exit 1
		fi
		section "$path" "$version" "$dir"
	done
fi

# The page's chart library, embedded in the binary (web/uplot/).
section "uPlot (embedded in the local page)" "1.6.32" "$(dirname "$0")/../web/uplot"
