package integration

import (
	"os"
	"strings"
	"testing"
)

// tunMode sets /dev/net/tun's mode for the test and puts it back after.
func tunMode(t *testing.T, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat("/dev/net/tun")
	if err != nil {
		t.Fatal(err)
	}
	old := fi.Mode().Perm()
	if err := os.Chmod("/dev/net/tun", mode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod("/dev/net/tun", old) })
}

// doctorLine is the line of doctor's report about name, and its fix
// line if it has one.
func doctorLine(t *testing.T, out, name string) (string, string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if f := strings.Fields(l); len(f) >= 2 && f[1] == name {
			if i+1 < len(lines) && strings.Contains(lines[i+1], "fix:") {
				return l, lines[i+1]
			}
			return l, ""
		}
	}
	t.Fatalf("doctor lists no %s:\n%s", name, out)
	return "", ""
}

// Where the user may not open /dev/net/tun (this host's 0600; udev's
// default is 0666), doctor says so with the fix, and a create with a
// network is refused naming the device and the fix, leaving nothing;
// once it is usable, doctor says the network works.
func TestRootlessNetworkNeedsTun(t *testing.T) {
	e := newRootlessEnv(t)
	tunMode(t, 0o600)
	r := e.run(nil, "doctor")
	line, fix := doctorLine(t, r.stdout, "netstack")
	if !strings.HasPrefix(line, "note") || !strings.Contains(line, "/dev/net/tun is not usable by this user (mode 0600)") ||
		!strings.Contains(fix, "chmod 0666 /dev/net/tun") {
		t.Fatalf("doctor's netstack with /dev/net/tun 0600: %q %q\n%s", line, fix, r)
	}
	for _, args := range [][]string{
		{"create", "--image", "busybox", "--net", "open"},
		{"run", "--rm", "--image", "busybox", "--net", "allow", "--allow", "example.test:443", "--", "true"},
	} {
		r := e.run(nil, args...)
		assertOneLineError(t, r, "/dev/net/tun is not usable by this user (mode 0600)")
		assertOneLineError(t, r, "chmod 0666 /dev/net/tun")
	}
	if ls := e.list(); len(ls) != 0 {
		t.Fatalf("refused creates left sandboxes: %+v", ls)
	}

	usableTun(t)
	r = e.run(nil, "doctor")
	if line, _ := doctorLine(t, r.stdout, "netstack"); !strings.HasPrefix(line, "ok") || !strings.Contains(line, "slirp4netns") {
		t.Fatalf("doctor's netstack with a usable /dev/net/tun: %q\n%s", line, r)
	}
}
