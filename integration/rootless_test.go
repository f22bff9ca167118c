package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An unprivileged user runs sandboxes with the same commands: gVisor under
// a user namespace, state under the user's XDG data directory.
func TestRootless(t *testing.T) {
	e := newRootlessEnv(t).withDefaultRoot()
	r := e.run(nil, "run", "--rm", "--image", "busybox", "--", "sh", "-c", "echo hi; uname -r; id -u")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "hi\n") || !strings.Contains(r.stdout, "gvisor") || !strings.HasSuffix(r.stdout, "\n0\n") {
		t.Fatalf("rootless run: %s", r)
	}
	// The command's status and runsc's reasons for not starting it come
	// through the same way without root.
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"sh", "-c", "echo out; exit 42"}, 42, ""},
		{[]string{"no-such-command"}, 127, "hutch: no-such-command: command not found\n"},
	} {
		if r := e.run(nil, append([]string{"run", "--rm", "--image", "busybox", "--"}, tc.args...)...); r.code != tc.code || r.stderr != tc.stderr {
			t.Fatalf("rootless run --rm %v: want %d and stderr %q, got %s", tc.args, tc.code, tc.stderr, r)
		}
	}
	if _, err := os.Stat(filepath.Join(e.root, "images")); err != nil {
		t.Fatalf("state is not under $XDG_DATA_HOME/hutch (%s): %v", e.root, err)
	}
	id := e.create()
	out := e.ok("exec", id, "--", "sh", "-c", "echo data > /root/f && cat /root/f")
	if out != "data\n" {
		t.Fatalf("rootless exec: %q", out)
	}
	if r := e.run(nil, "exec", id, "--", "no-such-command"); r.code != 127 {
		t.Fatalf("rootless not-found: %s", r)
	}
	if ls := e.list(); len(ls) != 1 || ls[0].State != "running" {
		t.Fatalf("rootless ls: %+v", ls)
	}
	checked := 0
	for _, p := range processesMentioning(id) {
		pid := strings.TrimSuffix(strings.Fields(p)[1], ":")
		switch uid := procUID(pid); uid {
		case "":
			// Gone since it was listed.
		case "0":
			t.Fatalf("a rootless sandbox process runs as host root: %s", p)
		default:
			checked++
		}
	}
	if checked == 0 {
		t.Fatalf("no host process of sandbox %s was found to check", id)
	}
	assertOneLineError(t, e.run(nil, "create", "--memory", "1g"), "--memory")
	// Without the builder's binaries beside hutch, builds say what is
	// missing (rootless builds: rootless_build_test.go).
	ctxDir := filepath.Join(e.root, "..", "ctx")
	os.MkdirAll(ctxDir, 0o755)
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM scratch\nCOPY Dockerfile /\n"), 0o644)
	assertOneLineError(t, e.run(nil, "image", "build", "-t", "x", ctxDir), "buildkitd missing")
	assertOneLineError(t, e.run(nil, "run", "--rm", "--", "true"), "--image busybox")
	e.ok("rm", "-f", id)
	e.assertClean(id)
}

// procUID is the real UID of a host process.
func procUID(pid string) string {
	b, _ := os.ReadFile("/proc/" + pid + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Uid:") {
			return strings.Fields(l)[1]
		}
	}
	return ""
}
