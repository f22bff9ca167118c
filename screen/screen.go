// Package screen is what hutch runs in a desktop sandbox to record its
// screen: ffmpeg (Debian's, in the desktop template) grabbing the X
// display into an MP4 file in the sandbox, started and stopped by the
// CLI (`hutch record`) and serve (POST /sandboxes/{id}/recordings), and
// fetched like any file of the sandbox.
package screen

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path"
	"strings"

	"github.com/containerd/errdefs"
)

// Dir is where recordings are written in the sandbox.
const Dir = "/tmp/hutch-recordings"

// Display is the display recorded: the desktop template's.
const Display = ":0"

// NewID is a new recording's ID.
func NewID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// CheckID refuses what is not a recording's ID.
func CheckID(id string) error {
	if len(id) != 16 || strings.Trim(id, "0123456789abcdef") != "" {
		return fmt.Errorf("recording %q: not a recording ID: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// File is the path in the sandbox of recording id's video.
func File(id string) string { return path.Join(Dir, id+".mp4") }

func pidFile(id string) string { return path.Join(Dir, id+".pid") }
func logFile(id string) string { return path.Join(Dir, id+".log") }

// StartCommand starts recording id of the display at fps frames a second
// (1 to 30) in the background and returns once ffmpeg writes its file,
// or fails with ffmpeg's log. The video is H.264 in MP4, at the screen's
// size. A start that fails leaves no ffmpeg and no pid file behind.
func StartCommand(id string, fps int) []string {
	script := `set -eu
id=$1 fps=$2 display=$3 dir=$4
command -v ffmpeg >/dev/null || { echo "ffmpeg is not installed: record a sandbox of the desktop image" >&2; exit 127; }
size=$(xdpyinfo -display "$display" 2>/dev/null | sed -n 's/^ *dimensions: *\([0-9]*x[0-9]*\) pixels.*/\1/p')
[ -n "$size" ] || { echo "no screen on $display to record: record a sandbox of the desktop image" >&2; exit 1; }
mkdir -p "$dir"
out=$dir/$id.mp4
nohup ffmpeg -nostdin -loglevel error -f x11grab -video_size "$size" -framerate "$fps" -draw_mouse 1 -i "$display" \
	-c:v libx264 -preset ultrafast -pix_fmt yuv420p -movflags +frag_keyframe+empty_moov "$out" >"$dir/$id.log" 2>&1 &
echo $! >"$dir/$id.pid"
i=0
until [ -s "$out" ]; do
	i=$((i + 1))
	if ! kill -0 "$(cat "$dir/$id.pid")" 2>/dev/null; then
		rm -f "$dir/$id.pid"
		echo "ffmpeg stopped:" >&2; cat "$dir/$id.log" >&2; exit 1
	fi
	if [ "$i" -ge 100 ]; then
		kill -KILL "$(cat "$dir/$id.pid")" 2>/dev/null || true
		rm -f "$dir/$id.pid" "$out"
		echo "ffmpeg wrote nothing in 10 s:" >&2; cat "$dir/$id.log" >&2; exit 1
	fi
	sleep 0.1
done
echo "$size"`
	return []string{"/bin/sh", "-c", script, "hutch-record", id, fmt.Sprint(fps), Display, Dir}
}

// StopCommand stops recording id: ffmpeg ends its file on SIGINT. It
// prints the file's size in bytes.
func StopCommand(id string) []string {
	script := `set -eu
pidf=$1 out=$2 log=$3
[ -f "$pidf" ] || { echo "no recording $(basename "$out" .mp4) runs" >&2; exit 3; }
pid=$(cat "$pidf")
kill -INT "$pid" 2>/dev/null || true
i=0
while kill -0 "$pid" 2>/dev/null; do
	i=$((i + 1))
	[ "$i" -lt 100 ] || { kill -KILL "$pid" 2>/dev/null || true; break; }
	sleep 0.1
done
rm -f "$pidf"
[ -s "$out" ] || { echo "the recording is empty:" >&2; cat "$log" >&2; exit 1; }
wc -c <"$out"`
	return []string{"/bin/sh", "-c", script, "hutch-record", pidFile(id), File(id), logFile(id)}
}
