#!/bin/sh
# package.sh: the release tarballs and their SHA-256 sums.
#
#   SOURCE_DATE_EPOCH=… build/package.sh BINDIR OUTDIR VERSION ARCH...
#
# For each ARCH (armv7, arm64, amd64) it takes BINDIR/edgegw-ARCH and writes
# OUTDIR/edgegw-VERSION-linux-ARCH.tar.gz holding one directory
# edgegw-VERSION-linux-ARCH/ with: edgegw, edgegw.example.toml,
# edgegw.service, edgegw.init, install.sh, LICENSE, THIRD_PARTY_NOTICES, and
# edgegw-lab (the lab build: demo, sim, receive, bench) when
# BINDIR/edgegw-lab-ARCH exists, as make release builds it, and
# edgegw-receiver with edgegw-receiver.service when
# BINDIR/edgegw-receiver-ARCH exists (arm64, amd64). install.sh installs
# only the gateway.
# Then OUTDIR/SHA256SUMS over those tarballs.
#
# Reproducible: fixed file modes, names sorted, owner 0:0, every mtime
# SOURCE_DATE_EPOCH (the commit time), GNU format (no pax atime/ctime),
# gzip -n (no name, no time stamp). Same inputs, same bytes.
set -eu

[ $# -ge 4 ] || { echo "usage: $0 BINDIR OUTDIR VERSION ARCH..." >&2; exit 2; }
bindir=$1 outdir=$2 version=$3
shift 3
: "${SOURCE_DATE_EPOCH:?package.sh: set SOURCE_DATE_EPOCH (git log -1 --format=%ct)}"
GO=${GO:-go}

build=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$build/.." && pwd)
for f in "$build/edgegw.example.toml" "$build/edgegw.service" "$build/edgegw.init" "$build/install.sh" "$top/LICENSE"; do
	[ -f "$f" ] || { echo "package.sh: missing $f" >&2; exit 1; }
done

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

tarballs=
for arch in "$@"; do
	case $arch in
	armv7) goenv="GOOS=linux GOARCH=arm GOARM=7" ;;
	arm64) goenv="GOOS=linux GOARCH=arm64" ;;
	amd64) goenv="GOOS=linux GOARCH=amd64" ;;
	*) echo "package.sh: unknown arch $arch" >&2; exit 1 ;;
	esac
	bin=$bindir/edgegw-$arch
	[ -f "$bin" ] || { echo "package.sh: missing $bin (make $arch)" >&2; exit 1; }

	name=edgegw-$version-linux-$arch
	d=$stage/$name
	mkdir -p "$d"
	cp "$bin" "$d/edgegw"
	if [ -f "$bindir/edgegw-lab-$arch" ]; then
		cp "$bindir/edgegw-lab-$arch" "$d/edgegw-lab"
		chmod 0755 "$d/edgegw-lab"
	fi
	if [ -f "$bindir/edgegw-receiver-$arch" ]; then
		cp "$bindir/edgegw-receiver-$arch" "$d/edgegw-receiver"
		cp "$build/edgegw-receiver.service" "$d/"
		chmod 0755 "$d/edgegw-receiver"
		chmod 0644 "$d/edgegw-receiver.service"
	fi
	cp "$build/edgegw.example.toml" "$build/edgegw.service" "$build/edgegw.init" "$build/install.sh" "$top/LICENSE" "$d/"
	(cd "$top" && env $goenv GO="$GO" "$build/notices.sh" .) >"$d/THIRD_PARTY_NOTICES"
	chmod 0755 "$d" "$d/edgegw" "$d/edgegw.init" "$d/install.sh"
	chmod 0644 "$d/edgegw.example.toml" "$d/edgegw.service" "$d/LICENSE" "$d/THIRD_PARTY_NOTICES"

	# Wire: gzip(tar) — GNU tar headers, entries in byte order of their
	# names, uid/gid 0 with no names, mtime SOURCE_DATE_EPOCH.
	(cd "$stage" && LC_ALL=C tar --format=gnu --sort=name --mtime="@$SOURCE_DATE_EPOCH" \
		--owner=0 --group=0 --numeric-owner -cf - "$name") | gzip -9n >"$outdir/$name.tar.gz"
	tarballs="$tarballs $name.tar.gz"
	echo "package.sh: $outdir/$name.tar.gz"
done

# shellcheck disable=SC2086 # the names contain no blanks
(cd "$outdir" && sha256sum $tarballs >SHA256SUMS)
echo "package.sh: $outdir/SHA256SUMS"
