#!/bin/sh
# codeinterp-debs.sh ROOTFS_OCI_TAR OUTDIR PACKAGE...
#
# Downloads into OUTDIR the Debian packages that installing PACKAGE... on
# the root filesystem in ROOTFS_OCI_TAR (an OCI archive of one layer, as
# `make base-rootfs` writes) needs, and only those: apt resolves them
# against that filesystem's own dpkg status, not this host's. The
# code-interpreter-v1 image installs them without network.
set -eu
tar=$1 out=$2
shift 2
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
tar -xf "$tar" -C "$w" index.json
manifest=$(jq -r '.manifests[0].digest' "$w/index.json" | cut -d: -f2)
tar -xf "$tar" -C "$w" "blobs/sha256/$manifest"
layer=$(jq -r '.layers[-1].digest' "$w/blobs/sha256/$manifest" | cut -d: -f2)
tar -xf "$tar" -C "$w" "blobs/sha256/$layer"
# The layer is a (maybe compressed) tar holding var/lib/dpkg/status.
tar -xaf "$w/blobs/sha256/$layer" -C "$w" --wildcards '*var/lib/dpkg/status' 2>/dev/null ||
	{ echo "$tar: no var/lib/dpkg/status in its last layer" >&2; exit 1; }
status=$(find "$w" -path '*var/lib/dpkg/status' -type f | head -1)
mkdir -p "$out/partial"
apt-get -q -y \
	-o Dir::State::status="$status" \
	-o Dir::Cache::archives="$(cd "$out" && pwd)" \
	-o Debug::NoLocking=1 \
	-o APT::Install-Recommends=false \
	--download-only install "$@"
rmdir "$out/partial" 2>/dev/null || true
