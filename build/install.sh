#!/bin/sh
# install.sh: install edgegw on this gateway, or into $DESTDIR for an image.
#
#   ./install.sh                    binary, config (if absent), service unit, user, data dir
#   ./install.sh --openwrt          procd init script instead of the systemd unit (prefix /usr)
#   DESTDIR=/tmp/root ./install.sh --systemd      into a scratch root (no user created)
#   ./install.sh --uninstall        remove binary and unit; keep config and data
#   ./install.sh --uninstall --purge                 … and remove config and data too
#
# POSIX sh (dash, busybox ash). Idempotent: running it twice gives the same
# tree. An existing /etc/edgegw/edgegw.toml is never overwritten.
set -eu

prog=install.sh
say() { printf '%s: %s\n' "$prog" "$*"; }
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }

usage() {
	cat <<USAGE
usage: $prog [options]
  --prefix DIR     install the binary as DIR/bin/edgegw (default /usr/local; /usr with --openwrt)
  --systemd        install the systemd unit (default when systemd runs)
  --openwrt        install the procd init script (default on OpenWrt)
  --no-service     install neither
  --binary FILE    the edgegw binary to install (default: edgegw next to this script)
  --uninstall      remove binary and service files; keep config and data
  --purge          with --uninstall: also remove /etc/edgegw and /var/lib/edgegw
  -h, --help       this text
environment:
  DESTDIR          install below this root (image building); users are not created then
USAGE
}

here=$(cd "$(dirname "$0")" && pwd)
DESTDIR=${DESTDIR:-}
DESTDIR=${DESTDIR%/}
prefix=
service=auto
action=install
purge=no
binary=$here/edgegw

while [ $# -gt 0 ]; do
	case $1 in
	--prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix=$2; shift ;;
	--prefix=*) prefix=${1#*=} ;;
	--binary) [ $# -ge 2 ] || die "--binary needs a file"; binary=$2; shift ;;
	--binary=*) binary=${1#*=} ;;
	--systemd) service=systemd ;;
	--openwrt | --procd) service=openwrt ;;
	--no-service) service=none ;;
	--uninstall) action=uninstall ;;
	--purge) purge=yes ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; die "unknown option: $1" ;;
	esac
	shift
done
[ "$purge" = no ] || [ "$action" = uninstall ] || die "--purge goes with --uninstall"

# live: acting on this machine (not an image below DESTDIR).
live=yes
[ -z "$DESTDIR" ] || live=no

if [ "$service" = auto ]; then
	if [ -f "$DESTDIR/etc/openwrt_release" ] || { [ $live = yes ] && [ -x /sbin/procd ]; }; then
		service=openwrt
	elif { [ $live = yes ] && [ -d /run/systemd/system ]; } ||
		{ [ $live = no ] && { [ -e "$DESTDIR/lib/systemd/systemd" ] || [ -e "$DESTDIR/usr/lib/systemd/systemd" ]; }; }; then
		service=systemd
	else
		service=none
	fi
fi
if [ -z "$prefix" ]; then
	if [ "$service" = openwrt ]; then prefix=/usr; else prefix=/usr/local; fi
fi
case $prefix in /*) ;; *) die "--prefix must be absolute: $prefix" ;; esac
prefix=${prefix%/}

bin=$prefix/bin/edgegw
unit=/etc/systemd/system/edgegw.service
sysusers=/usr/lib/sysusers.d/edgegw.conf
initd=/etc/init.d/edgegw
confdir=/etc/edgegw
conf=$confdir/edgegw.toml
data=/var/lib/edgegw
user=edgegw

have() { command -v "$1" >/dev/null 2>&1; }
systemd_live() { [ $live = yes ] && [ -d /run/systemd/system ] && have systemctl; }

# put SRC DEST MODE: replace DEST atomically (a running binary keeps its
# inode; a half-written file is never seen).
put() {
	mkdir -p "$(dirname "$DESTDIR$2")"
	tmp=$DESTDIR$2.tmp.$$
	cp "$1" "$tmp"
	chmod "$3" "$tmp"
	mv -f "$tmp" "$DESTDIR$2"
}

# render SRC: the file with the binary path rewritten to $bin.
render() {
	sed -e "s#/usr/local/bin/edgegw#$bin#g" -e "s#^PROG=/usr/bin/edgegw\$#PROG=$bin#" "$1" >"$work/$(basename "$1")"
	printf '%s\n' "$work/$(basename "$1")"
}

nologin() {
	for s in /usr/sbin/nologin /sbin/nologin; do
		[ -x "$s" ] && { printf '%s\n' "$s"; return; }
	done
	printf '/bin/false\n'
}

create_user() {
	if [ $live = no ]; then
		say "DESTDIR set: not creating user $user; on the target: useradd --system --user-group --home-dir $data --no-create-home --shell /usr/sbin/nologin $user"
		[ "$service" != systemd ] || say "(systemd creates it at boot from $sysusers)"
		return
	fi
	if id -u "$user" >/dev/null 2>&1; then
		return
	fi
	sh_=$(nologin)
	if have useradd; then
		useradd --system --user-group --home-dir "$data" --no-create-home --shell "$sh_" --comment "edgegw gateway" "$user"
	elif have adduser && have addgroup; then # busybox
		addgroup -S "$user" 2>/dev/null || true
		adduser -S -D -H -h "$data" -s "$sh_" -G "$user" "$user"
	else
		say "warning: neither useradd nor adduser: create the system user $user yourself"
		return
	fi
	say "created system user $user"
}

install_all() {
	[ -f "$binary" ] || die "no binary at $binary (pass --binary FILE)"
	for f in edgegw.example.toml edgegw.service edgegw.init; do
		[ -f "$here/$f" ] || die "missing $here/$f"
	done
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT

	put "$binary" "$bin" 0755
	say "binary: $DESTDIR$bin"

	mkdir -p "$DESTDIR$confdir"
	chmod 0755 "$DESTDIR$confdir"
	if [ ! -e "$DESTDIR$conf" ]; then
		put "$here/edgegw.example.toml" "$conf" 0644
		say "config: $DESTDIR$conf (from the example: edit it, then: edgegw check -config $conf)"
		say "config: files it may name (upstream token, TLS keys, password hash) are not created: write each, chmod 0640, chgrp $user, then uncomment its key"
	elif cmp -s "$here/edgegw.example.toml" "$DESTDIR$conf"; then
		say "config: $DESTDIR$conf unchanged"
	else
		put "$here/edgegw.example.toml" "$conf.new" 0644
		say "config: kept your $DESTDIR$conf; the new example is $DESTDIR$conf.new (diff them)"
	fi

	create_user
	mkdir -p "$DESTDIR$data"
	chmod 0750 "$DESTDIR$data"
	if [ $live = yes ] && id -u "$user" >/dev/null 2>&1; then
		chown "$user:$user" "$DESTDIR$data"
	fi
	if [ $live = yes ]; then say "data: $data (0750, owner $user)"; else say "data: $DESTDIR$data (0750; chown $user:$user on the target, or let StateDirectory= do it)"; fi

	case $service in
	systemd)
		put "$(render "$here/edgegw.service")" "$unit" 0644
		printf 'u %s - "edgegw gateway" %s\n' "$user" "$data" >"$work/sysusers"
		put "$work/sysusers" "$sysusers" 0644
		say "unit: $DESTDIR$unit"
		if systemd_live; then
			systemctl daemon-reload
			say "start with: systemctl enable --now edgegw"
		fi
		;;
	openwrt)
		put "$(render "$here/edgegw.init")" "$initd" 0755
		say "init script: $DESTDIR$initd"
		[ $live = no ] || say "start with: $initd enable && $initd start"
		;;
	none)
		say "no service manager found (pass --systemd or --openwrt): run $bin run -config $conf yourself"
		;;
	esac

	if [ $live = yes ]; then
		"$bin" version >/dev/null 2>&1 || say "warning: $bin does not run here (wrong architecture?)"
	fi
}

uninstall_all() {
	if [ $live = yes ]; then
		if [ -e "$unit" ] && systemd_live; then
			systemctl disable --now edgegw.service || true
		fi
		if [ -x "$initd" ]; then
			"$initd" stop || true
			"$initd" disable || true
		fi
	fi
	for f in "$bin" "$unit" "$sysusers" "$initd"; do
		if [ -e "$DESTDIR$f" ]; then
			rm -f "$DESTDIR$f"
			say "removed $DESTDIR$f"
		fi
	done
	if [ -e "$DESTDIR/etc/systemd" ] && systemd_live; then
		systemctl daemon-reload || true
	fi
	if [ "$purge" = yes ]; then
		rm -rf "$DESTDIR$confdir" "$DESTDIR$data"
		say "purged $DESTDIR$confdir and $DESTDIR$data (user $user kept: userdel $user removes it)"
	else
		say "kept $DESTDIR$confdir and $DESTDIR$data (--purge removes them)"
	fi
}

case $action in
install) install_all ;;
uninstall) uninstall_all ;;
esac
