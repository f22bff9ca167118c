#!/bin/sh
# The entrypoint of sbx's node installer image (bin/images/sbx-installer.tar,
# run by daemonset.yaml and uninstall.yaml): it installs or removes sbx on
# the node it runs on with install-node.sh, into the host's / mounted at
# $HOST, has containerd load the change, and sets or removes the node's
# label sbx.dev/runtime, which the RuntimeClass's nodeSelector asks for.
# Then it stays (the DaemonSet's pod is Ready once the node is done):
# after an install, as sbx's node service (sbx-node serve) when the node
# key file is there, else asleep.
#
#   installer.sh install     install sbx, restart containerd if the runtime
#                            handler "sbx" is new or its drop-in changed, wait
#                            until the kubelet reports the handler, label
#   installer.sh uninstall   unlabel, remove sbx, restart containerd, wait
#                            until the handler is gone
#
#   HOST                the host's / in this container (default /host)
#   CONTAINERD_RESTART  the host command that restarts containerd, run in the
#                       host's namespaces (those of HOST_PID, so the pod
#                       needs hostPID); default: systemctl restart containerd.
#                       Empty: the operator restarts containerd; the
#                       installer waits for it.
#   HOST_PID            a host process whose namespaces CONTAINERD_RESTART
#                       runs in (default 1, the host's init)
#   WAIT                how long to wait for the runtime handler (default 10m)
#   NODE_KEY_FILE       the node service's key (64 hex digits); unset or
#                       missing: no node service
#   CONTAINERD_SOCKET   containerd's socket on the host (default
#                       /run/containerd/containerd.sock)
#   CHECKPOINT_DIR      the checkpoints' directory on the host, the shim's
#                       checkpoint_dir (default /var/lib/sbx/checkpoints)
#   PREFIX, SBX_ETC, CONTAINERD_CONF_D, CONTAINERD_CONFIG: as install-node.sh
set -eu
# The installer's own programs (sbx-node) come first.
PATH=/sbx/bin:$PATH

mode=${1:-install}
HOST=${HOST:-/host}
CONTAINERD_RESTART=${CONTAINERD_RESTART-systemctl restart containerd}
HOST_PID=${HOST_PID:-1}
WAIT=${WAIT:-10m}
CONTAINERD_CONF_D=${CONTAINERD_CONF_D:-/etc/containerd/conf.d}
dropin="$HOST$CONTAINERD_CONF_D/sbx.toml"
label=sbx.dev/runtime
ready=/run/sbx-installer/done

say() { echo "sbx-installer ($NODE_NAME): $*"; }

restart_containerd() {
	if [ -z "$CONTAINERD_RESTART" ]; then
		say "restart containerd on the node to $1 the runtime handler \"sbx\"; waiting"
		return
	fi
	say "restarting containerd: $CONTAINERD_RESTART"
	nsenter --target "$HOST_PID" --mount --uts --ipc --net --pid -- sh -c "$CONTAINERD_RESTART"
}

rm -f "$ready"
case $mode in
install)
	before=$(cat "$dropin" 2>/dev/null || true)
	ROOT=$HOST BIN_DIR=/sbx/bin sh /sbx/install-node.sh install
	after=$(cat "$dropin")
	# Restart only for a new or changed handler; an error reading the node
	# ends the pod (no restart loop).
	have=yes
	sbx-node has-handler sbx || { rc=$?; [ "$rc" = 1 ] || exit "$rc"; have=no; }
	if [ "$before" != "$after" ] || [ "$have" = no ]; then
		restart_containerd load
	fi
	sbx-node wait-handler sbx present "$WAIT"
	sbx-node label "$label=true"
	say "sbx installed; node labelled $label=true"
	;;
uninstall)
	# Unlabel first: no new sbx pods come here while sbx goes.
	sbx-node label "$label-"
	ROOT=$HOST sh /sbx/install-node.sh uninstall
	restart_containerd unload
	sbx-node wait-handler sbx absent "$WAIT"
	say "sbx removed; node unlabelled"
	;;
*)
	echo "installer.sh: unknown mode \"$mode\": want install or uninstall" >&2
	exit 2
	;;
esac
mkdir -p "$(dirname "$ready")"
touch "$ready"
if [ "$mode" = install ]; then
	if [ -n "${NODE_KEY_FILE:-}" ] && [ -e "$NODE_KEY_FILE" ]; then
		say "running the node service"
		exec sbx-node serve --key-file "$NODE_KEY_FILE" --host-root "$HOST" \
			--containerd "$HOST${CONTAINERD_SOCKET:-/run/containerd/containerd.sock}" \
			--checkpoint-dir "${CHECKPOINT_DIR:-/var/lib/sbx/checkpoints}"
	fi
	say "no node key (${NODE_KEY_FILE:-NODE_KEY_FILE unset}): no node service; sbx serve cannot pause sandboxes on this node"
fi
# Stay, so that the DaemonSet's pod stays Ready; SIGTERM ends it at once.
trap 'exit 0' TERM INT
while :; do
	sleep 3600 &
	wait $! || true
done
