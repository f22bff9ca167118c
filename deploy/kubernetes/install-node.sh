#!/bin/sh
# Sets up one Kubernetes node for hutch: installs containerd-shim-hutch-v1,
# runsc and hutch-init, the shim's policy file, and a containerd configuration
# drop-in that adds the runtime handler "hutch". Run as root on each node (or
# from the privileged DaemonSet of daemonset.yaml, which mounts the host's /
# at $ROOT), then restart containerd. Re-running it updates the binaries and
# keeps an existing policy file.
#
#   install-node.sh [install]   install (the default)
#   install-node.sh uninstall   remove what install put there: the binaries,
#                               the drop-in, the policy file unless the
#                               operator changed it, and the directories
#                               install created; then restart containerd
#
#   BIN_DIR            where containerd-shim-hutch-v1, runsc and hutch-init are (default:
#                      the bin/ of the hutch checkout this script is in)
#   ROOT               the node's root directory (default /)
#   PREFIX             install prefix below ROOT (default /usr/local)
#   HUTCH_ETC            the shim's configuration directory (default /etc/hutch)
#   CONTAINERD_CONF_D  containerd's drop-in directory (default
#                      /etc/containerd/conf.d); containerd's config.toml
#                      must import it: imports = ["/etc/containerd/conf.d/*.toml"]
#   CONTAINERD_CONFIG  containerd's config.toml (default
#                      /etc/containerd/config.toml), checked for that import
set -eu

here=$(cd "$(dirname "$0")" && pwd)
BIN_DIR=${BIN_DIR:-$here/../../bin}
ROOT=${ROOT:-}
PREFIX=${PREFIX:-/usr/local}
HUTCH_ETC=${HUTCH_ETC:-/etc/hutch}
CONTAINERD_CONF_D=${CONTAINERD_CONF_D:-/etc/containerd/conf.d}
CONTAINERD_CONFIG=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
mode=${1:-install}

binaries="containerd-shim-hutch-v1 runsc hutch-init"
policy="$ROOT$HUTCH_ETC/containerd-shim-hutch-v1.toml"
dropin="$ROOT$CONTAINERD_CONF_D/hutch.toml"
# The directories install created, deepest first, for uninstall to remove.
created="$ROOT$HUTCH_ETC/.install-node-dirs"

# mkdirs makes each directory, recording every level it creates.
mkdirs() {
	new=""
	for d in "$@"; do
		p=$d
		while [ ! -e "$p" ]; do
			new="$new$p
"
			p=$(dirname "$p")
		done
		mkdir -p "$d"
	done
	if [ -n "$new" ]; then
		printf '%s' "$new" | sort -r >> "$created.new"
	fi
}

case $mode in
install)
	for f in $binaries; do
		[ -x "$BIN_DIR/$f" ] || { echo "install-node.sh: $BIN_DIR/$f not found (make build shim)" >&2; exit 1; }
	done
	mkdirs "$ROOT$PREFIX/bin" "$ROOT$HUTCH_ETC" "$ROOT$CONTAINERD_CONF_D"
	if [ -e "$created.new" ]; then
		cat "$created.new" >> "$created"
		rm -f "$created.new"
	fi
	# containerd finds the shim on its PATH; the shim runs the runsc beside it.
	for f in $binaries; do
		cp "$BIN_DIR/$f" "$ROOT$PREFIX/bin/$f.new"
		chmod 0755 "$ROOT$PREFIX/bin/$f.new"
		mv -f "$ROOT$PREFIX/bin/$f.new" "$ROOT$PREFIX/bin/$f"
	done

	if [ ! -e "$policy" ]; then
		cp "$here/containerd-shim-hutch-v1.toml" "$policy.new"
		chmod 0644 "$policy.new"
		mv -f "$policy.new" "$policy"
	fi

	cat > "$dropin.new" <<TOML
# The hutch runtime handler (RuntimeClass handler: hutch). Written by hutch's
# install-node.sh.
version = 3

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.hutch]
  runtime_type = "io.containerd.hutch.v1"
  # Pass hutch's annotations through to the shim (CRI drops the others).
  pod_annotations = ["dev.hutch.*"]
  container_annotations = ["dev.hutch.*"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.hutch.options]
    ConfigPath = "$HUTCH_ETC/containerd-shim-hutch-v1.toml"
TOML
	mv -f "$dropin.new" "$dropin"

	conf="$ROOT$CONTAINERD_CONFIG"
	if [ -e "$conf" ] && ! grep -q "$CONTAINERD_CONF_D" "$conf"; then
		echo "install-node.sh: $conf does not import $CONTAINERD_CONF_D; add: imports = [\"$CONTAINERD_CONF_D/*.toml\"]" >&2
	fi
	echo "hutch installed; restart containerd to load the runtime handler \"hutch\""
	;;
uninstall)
	rm -f "$dropin" "$dropin.new"
	for f in $binaries; do
		rm -f "$ROOT$PREFIX/bin/$f" "$ROOT$PREFIX/bin/$f.new"
	done
	# The policy file goes only if it is still the one install wrote.
	if [ -e "$policy" ] && cmp -s "$policy" "$here/containerd-shim-hutch-v1.toml"; then
		rm -f "$policy"
	elif [ -e "$policy" ]; then
		echo "install-node.sh: keeping $policy (changed since install)" >&2
	fi
	if [ -e "$created" ]; then
		dirs=$(sort -r -u "$created")
		rm -f "$created"
		# Only empty ones: what others put there stays.
		echo "$dirs" | while read -r d; do
			[ -n "$d" ] && rmdir "$d" 2>/dev/null || true
		done
	fi
	echo "hutch removed; restart containerd to unload the runtime handler \"hutch\""
	;;
*)
	echo "install-node.sh: unknown mode \"$mode\": want install or uninstall" >&2
	exit 2
	;;
esac
