#!/bin/sh
# The entrypoint of hutch's node installer image (bin/images/hutch-installer.tar,
# run by daemonset.yaml and uninstall.yaml): it installs or removes hutch on
# the node it runs on with install-node.sh, into the host's / mounted at
# $HOST, has containerd load the change, and sets or removes the node's
# label hutch.dev/runtime, which the RuntimeClass's nodeSelector asks for.
# Then it stays (the DaemonSet's pod is Ready once the node is done):
# after an install, as hutch's node service (hutch-node serve) when the node
# key file is there, else asleep.
#
#   installer.sh install     install hutch, restart containerd if the runtime
#                            handler "hutch" is new or its drop-in changed, wait
#                            until the kubelet reports the handler, label
#   installer.sh uninstall   unlabel, remove hutch, restart containerd, wait
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
#                       checkpoint_dir (default /var/lib/hutch/checkpoints)
#   PREFIX, HUTCH_ETC, CONTAINERD_CONF_D, CONTAINERD_CONFIG: as install-node.sh
set -eu
# The installer's own programs (hutch-node) come first.
PATH=/hutch/bin:$PATH

mode=${1:-install}
HOST=${HOST:-/host}
CONTAINERD_RESTART=${CONTAINERD_RESTART-systemctl restart containerd}
HOST_PID=${HOST_PID:-1}
WAIT=${WAIT:-10m}
CONTAINERD_CONF_D=${CONTAINERD_CONF_D:-/etc/containerd/conf.d}
dropin="$HOST$CONTAINERD_CONF_D/hutch.toml"
label=hutch.dev/runtime
ready=/run/hutch-installer/done

say() { echo "hutch-installer ($NODE_NAME): $*"; }

restart_containerd() {
	if [ -z "$CONTAINERD_RESTART" ]; then
		say "restart containerd on the node to $1 the runtime handler \"hutch\"; waiting"
		return
	fi
	say "restarting containerd: $CONTAINERD_RESTART"
	nsenter --target "$HOST_PID" --mount --uts --ipc --net --pid -- sh -c "$CONTAINERD_RESTART"
}

rm -f "$ready"
case $mode in
install)
	before=$(cat "$dropin" 2>/dev/null || true)
	ROOT=$HOST BIN_DIR=/hutch/bin sh /hutch/install-node.sh install
	after=$(cat "$dropin")
	# Restart only for a new or changed handler; an error reading the node
	# ends the pod (no restart loop).
	have=yes
	hutch-node has-handler hutch || { rc=$?; [ "$rc" = 1 ] || exit "$rc"; have=no; }
	if [ "$before" != "$after" ] || [ "$have" = no ]; then
		restart_containerd load
	fi
	hutch-node wait-handler hutch present "$WAIT"
	hutch-node label "$label=true"
	say "hutch installed; node labelled $label=true"
	;;
uninstall)
	# Unlabel first: no new hutch pods come here while hutch goes.
	hutch-node label "$label-"
	ROOT=$HOST sh /hutch/install-node.sh uninstall
	restart_containerd unload
	hutch-node wait-handler hutch absent "$WAIT"
	say "hutch removed; node unlabelled"
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
		exec hutch-node serve --key-file "$NODE_KEY_FILE" --host-root "$HOST" \
			--containerd "$HOST${CONTAINERD_SOCKET:-/run/containerd/containerd.sock}" \
			--checkpoint-dir "${CHECKPOINT_DIR:-/var/lib/hutch/checkpoints}"
	fi
	say "no node key (${NODE_KEY_FILE:-NODE_KEY_FILE unset}): no node service; hutch serve cannot pause sandboxes on this node"
fi
# Stay, so that the DaemonSet's pod stays Ready; SIGTERM ends it at once.
trap 'exit 0' TERM INT
while :; do
	sleep 3600 &
	wait $! || true
done
