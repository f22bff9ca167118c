package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// An unprivileged user gets the same terminal, copies and ports.
func TestRootlessInteractive(t *testing.T) {
	e := newRootlessEnv(t).withDefaultRoot()
	id := e.create("-p", "0:8080")

	tm := e.startTerm(20, 70, "exec", "-it", id, "--", "sh", "-c", `stty size; tty; id -u; read x; exit $x`)
	tm.expect("20 70")
	tm.expect("/dev/pts/")
	tm.send("4\r")
	if code := tm.wait(); code != 4 {
		t.Fatalf("rootless exec -it exited %d, want 4", code)
	}

	// The host side of a copy is the user's: a directory they own.
	dir := filepath.Dir(e.root)
	src := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "sub", "f"), []byte("rootless\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := filepath.Walk(src, func(p string, _ os.FileInfo, _ error) error {
		return os.Lchown(p, int(e.cred.Uid), int(e.cred.Gid))
	}); err != nil {
		t.Fatal(err)
	}
	e.ok("cp", src, id+":/root/")
	e.ok("cp", id+":/root/tree", filepath.Join(dir, "back"))
	b, err := os.ReadFile(filepath.Join(dir, "back", "sub", "f"))
	fi, _ := os.Stat(filepath.Join(dir, "back", "sub", "f"))
	if err != nil || string(b) != "rootless\n" || fi.Mode().Perm() != 0o640 || fi.Sys().(*syscall.Stat_t).Uid != e.cred.Uid {
		t.Fatalf("rootless round trip: %q %v %v", b, fi, err)
	}

	port := e.ports(id).Ports[0].HostPort
	e.startHTTPDPlain(id)
	waitFor(t, func() bool {
		b, err := get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		return err == nil && strings.Contains(b, "ok")
	})
	e.ok("rm", "-f", id)
	e.assertClean(id)
}

func (e *env) startHTTPDPlain(id string) {
	e.t.Helper()
	e.ok("exec", id, "--", "sh", "-c", "mkdir -p /www && echo ok > /www/index.html")
	e.ok("exec", "-d", id, "--", "httpd", "-f", "-p", "8080", "-h", "/www")
}
