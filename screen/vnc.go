package screen

import "strconv"

// VNCPort is the port of the screen's VNC server (x11vnc) on the
// sandbox's 127.0.0.1: it is never a public preview. hutch serve bridges
// WebSocket clients (noVNC, the console's screen view) to it, and only
// with the sandbox's stream token.
const VNCPort = 5909

// vncScript starts x11vnc on the display, serving RFB without a password
// on 127.0.0.1:PORT only, unless something listens there already, and
// returns once it listens (or fails with x11vnc's log).
const vncScript = `set -eu
display=$1 port=$2
command -v x11vnc >/dev/null || { echo "x11vnc is not installed: view the screen of a sandbox of the desktop image" >&2; exit 127; }
xdpyinfo -display "$display" >/dev/null 2>&1 || { echo "no screen on $display: view the screen of a sandbox of the desktop image" >&2; exit 1; }
hex=$(printf '%04X' "$port")
listening() { grep -q "^ *[0-9]*: 0100007F:$hex 00000000:0000 0A" /proc/net/tcp; }
listening && exit 0
log=/tmp/hutch-x11vnc.log
# Two starts at once: the second x11vnc cannot bind, the first serves.
x11vnc -display "$display" -localhost -rfbport "$port" -shared -forever -nopw -quiet -bg -o "$log" >/dev/null 2>&1 ||
	{ sleep 0.5; listening && exit 0; cat "$log" >&2; exit 1; }
i=0
until listening; do
	i=$((i+1))
	[ "$i" -lt 100 ] || { echo "x11vnc did not listen on $port in 10 s" >&2; cat "$log" >&2; exit 1; }
	sleep 0.1
done
`

// VNCStartCommand starts the VNC server of display (see VNCPort), or
// finds it running.
func VNCStartCommand(display string) []string {
	return []string{"/bin/sh", "-c", vncScript, "sh", display, strconv.Itoa(VNCPort)}
}
