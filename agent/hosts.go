package agent

import (
	"errors"
	"io/fs"
	"os"
)

// hostsPath is the file the C library reads before DNS ("files dns" in
// nsswitch.conf).
const hostsPath = "/etc/hosts"

// hostsContent is what the init writes there when the image has none:
// localhost on both loopback addresses, as Debian's own /etc/hosts has.
const hostsContent = "127.0.0.1\tlocalhost\n" +
	"::1\tlocalhost ip6-localhost ip6-loopback\n"

// ensureHosts gives a sandbox whose image has no /etc/hosts one, so that
// localhost resolves with or without network. gVisor makes none, and
// images made for Docker carry none (Docker mounts its own): without it a
// client dialling localhost (a dev server's, noVNC's proxy, curl) fails
// where 127.0.0.1 works. The file is the sandbox's own, in its root's
// upper layer, so root may change it as in any container; an image's own
// file, or a read-only root, is left as it is.
func ensureHosts() {
	if _, err := os.Lstat(hostsPath); !errors.Is(err, fs.ErrNotExist) {
		return
	}
	if fi, err := os.Stat("/etc"); err != nil || !fi.IsDir() {
		return
	}
	f, err := os.OpenFile(hostsPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return
	}
	_, werr := f.WriteString(hostsContent)
	if cerr := f.Close(); werr != nil || cerr != nil {
		os.Remove(hostsPath)
	}
}
