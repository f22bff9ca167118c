#!/bin/sh
# Sets up one Kubernetes node for sbx: installs containerd-shim-sbx-v1 and
# runsc, the shim's policy file, and a containerd configuration drop-in that
# adds the runtime handler "sbx". Run as root on each node (or from a
# privileged DaemonSet that mounts the host's / at $ROOT), then restart
# containerd. Re-running it updates the binaries and keeps an existing
# policy file.
#
#   BIN_DIR            where containerd-shim-sbx-v1, runsc and sbx-init are (default:
#                      the bin/ of the sbx checkout this script is in)
#   ROOT               the node's root directory (default /)
#   PREFIX             install prefix below ROOT (default /usr/local)
#   SBX_ETC            the shim's configuration directory (default /etc/sbx)
#   CONTAINERD_CONF_D  containerd's drop-in directory (default
#                      /etc/containerd/conf.d); containerd's config.toml
#                      must import it: imports = ["/etc/containerd/conf.d/*.toml"]
set -eu

here=$(cd "$(dirname "$0")" && pwd)
BIN_DIR=${BIN_DIR:-$here/../../bin}
ROOT=${ROOT:-}
PREFIX=${PREFIX:-/usr/local}
SBX_ETC=${SBX_ETC:-/etc/sbx}
CONTAINERD_CONF_D=${CONTAINERD_CONF_D:-/etc/containerd/conf.d}

for f in containerd-shim-sbx-v1 runsc sbx-init; do
	[ -x "$BIN_DIR/$f" ] || { echo "install-node.sh: $BIN_DIR/$f not found (make build shim)" >&2; exit 1; }
done

mkdir -p "$ROOT$PREFIX/bin" "$ROOT$SBX_ETC" "$ROOT$CONTAINERD_CONF_D"
# containerd finds the shim on its PATH; the shim runs the runsc beside it.
for f in containerd-shim-sbx-v1 runsc sbx-init; do
	install -m 0755 "$BIN_DIR/$f" "$ROOT$PREFIX/bin/$f.new"
	mv -f "$ROOT$PREFIX/bin/$f.new" "$ROOT$PREFIX/bin/$f"
done

if [ ! -e "$ROOT$SBX_ETC/containerd-shim-sbx-v1.toml" ]; then
	install -m 0644 "$here/containerd-shim-sbx-v1.toml" "$ROOT$SBX_ETC/containerd-shim-sbx-v1.toml"
fi

cat > "$ROOT$CONTAINERD_CONF_D/sbx.toml.new" <<TOML
# The sbx runtime handler (RuntimeClass handler: sbx). Written by sbx's
# install-node.sh.
version = 3

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.sbx]
  runtime_type = "io.containerd.sbx.v1"
  # Pass sbx's annotations through to the shim (CRI drops the others).
  pod_annotations = ["dev.sbx.*"]
  container_annotations = ["dev.sbx.*"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.sbx.options]
    ConfigPath = "$SBX_ETC/containerd-shim-sbx-v1.toml"
TOML
mv -f "$ROOT$CONTAINERD_CONF_D/sbx.toml.new" "$ROOT$CONTAINERD_CONF_D/sbx.toml"

conf="$ROOT/etc/containerd/config.toml"
if [ -e "$conf" ] && ! grep -q "$CONTAINERD_CONF_D" "$conf"; then
	echo "install-node.sh: $conf does not import $CONTAINERD_CONF_D; add: imports = [\"$CONTAINERD_CONF_D/*.toml\"]" >&2
fi
echo "sbx installed; restart containerd to load the runtime handler \"sbx\""
