#!/bin/sh
# Installs the Debian packages hutch and its tests need, if missing.
set -eu
need=""
# prometheus: its promtool checks and tests deploy/monitoring's alert rules;
# zsh, fish and groff-base: the completion and man page tests run them.
for p in busybox-static nftables iproute2 slirp4netns uidmap mmdebstrap nodejs npm openssh-client rsync patch runc chromium prometheus zsh fish groff-base; do
	# Node.js builds that bundle npm provide it without a package of its own.
	[ "$p" = npm ] && command -v npm >/dev/null 2>&1 && continue
	dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
[ -z "$need" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "missing packages:$need (run as root, or: sudo apt-get install$need)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $need
