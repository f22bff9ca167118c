package wire

import (
	"bytes"
	"strings"
)

// Started reports whether log, the beginning of a sandbox log, holds the
// line the init writes once it is ready: no longer dumpable (see the
// agent's initLoop) and listening for spawn requests, or having failed to
// listen.
func Started(log []byte) bool {
	for _, line := range bytes.Split(log, []byte("\n")) {
		f := strings.SplitN(string(line), " ", 3)
		if len(f) == 3 && f[1] == "init" && (f[2] == "started" || strings.HasPrefix(f[2], "cannot take spawn requests")) {
			return true
		}
	}
	return false
}
