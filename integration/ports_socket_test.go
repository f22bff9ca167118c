package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// socketDir is a directory only root can write to but every user can
// pass through: what keeps another user from a socket in it is the
// socket alone.
func socketDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "hutch-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// getUnix fetches path over HTTP through the UNIX socket sock.
func getUnix(sock, path string) (string, error) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := c.Get("http://sandbox" + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%s: %s", path, resp.Status)
	}
	return string(b), nil
}

// getAsUser is getUnix as another user of the host, uid: what it read,
// or why it could not.
func getAsUser(t *testing.T, uid, gid uint32, sock string) string {
	t.Helper()
	// perl-base is in every Debian: a client as that user with no build.
	c := exec.Command("perl", "-MIO::Socket::UNIX", "-e",
		`$s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect: $!\n"; print $s "GET /index.html HTTP/1.0\r\n\r\n"; print while <$s>;`, sock)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	out, _ := c.CombinedOutput()
	return string(out)
}

// A port published on a UNIX socket (create -p unix:PATH:PORT and
// port-forward) reaches the server inside the sandbox for its owner and
// for no other user of the host, even with the socket's mode opened up;
// the socket goes with its forwarder.
func TestPublishOnUnixSocket(t *testing.T) {
	e := newEnv(t)
	u := rootlessUser(t)
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	dir := socketDir(t)
	sock := filepath.Join(dir, "web.sock")
	id := e.create("--net", "none", "-p", "unix:"+sock+":8080")
	var rec struct {
		Ports []struct {
			Socket string `json:"socket"`
			Port   int    `json:"port"`
		} `json:"ports"`
	}
	e.inspectInto(id, &rec)
	if len(rec.Ports) != 1 || rec.Ports[0].Socket != sock || rec.Ports[0].Port != 8080 {
		t.Fatalf("inspect ports: %+v", rec.Ports)
	}
	e.startHTTPD(id)
	want := "hello-from-" + id[:12] + "\n"
	waitFor(t, func() bool { b, err := getUnix(sock, "/"); return err == nil && b == want })
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v, %v; want a socket of mode 0600", sock, fi.Mode(), err)
	}

	if out := getAsUser(t, uint32(uid), uint32(gid), sock); strings.Contains(out, "hello-from") || !strings.Contains(out, "connect: Permission denied") {
		t.Fatalf("user %s reached the socket: %q", u.Username, out)
	}
	// The forwarder serves its owner only, whatever the socket's mode.
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	if out := getAsUser(t, uint32(uid), uint32(gid), sock); strings.Contains(out, "hello-from") {
		t.Fatalf("user %s was served through a socket opened to all: %q", u.Username, out)
	}
	if b, err := getUnix(sock, "/"); err != nil || b != want {
		t.Fatalf("owner through the socket: %q, %v", b, err)
	}

	// port-forward takes the same form, and removes its socket on ^C.
	fwd := filepath.Join(dir, "fwd.sock")
	c := e.cmd(nil, "port-forward", id, "unix:"+fwd+":8080")
	stdout, _ := c.StdoutPipe()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if w := "forwarding unix:" + fwd + " -> 8080\n"; line != w {
		t.Fatalf("port-forward said %q, want %q", line, w)
	}
	if b, err := getUnix(fwd, "/"); err != nil || b != want {
		t.Fatalf("through port-forward's socket: %q, %v", b, err)
	}
	if out := getAsUser(t, uint32(uid), uint32(gid), fwd); strings.Contains(out, "hello-from") {
		t.Fatalf("user %s reached port-forward's socket: %q", u.Username, out)
	}
	c.Process.Signal(syscall.SIGINT)
	if err := c.Wait(); err != nil {
		t.Fatalf("port-forward after ^C: %v", err)
	}
	if _, err := os.Lstat(fwd); err == nil {
		t.Fatalf("port-forward left its socket %s", fwd)
	}

	e.ok("rm", "-f", id)
	waitFor(t, func() bool { _, err := os.Lstat(sock); return err != nil })
	e.assertClean(id)
}

// A socket path that another user could tamper with, or that is not a
// socket, is refused with one line and exit 125, leaving nothing; a
// stale socket is replaced and one in use is left alone.
func TestPublishOnUnixSocketBadPaths(t *testing.T) {
	e := newEnv(t)
	u := rootlessUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	dir := socketDir(t)

	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	theirs := filepath.Join(dir, "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(theirs, uid, -1)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("keep me"), 0o600)
	link := filepath.Join(dir, "link.sock")
	os.Symlink(filepath.Join(dir, "elsewhere.sock"), link)
	inUse := filepath.Join(dir, "inuse.sock")
	l, err := net.Listen("unix", inUse)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	for _, tc := range []struct{ spec, want string }{
		{"unix:/tmp/web.sock:80", "writable by other users"},
		{"unix:" + open + "/web.sock:80", "writable by other users"},
		{"unix:" + theirs + "/web.sock:80", "owned by uid " + u.Uid},
		{"unix:" + file + ":80", "is not a socket"},
		{"unix:" + link + ":80", "is not a socket"},
		{"unix:" + dir + "/missing/web.sock:80", "no such file or directory"},
		{"unix:web.sock:80", "not absolute"},
		{"unix:" + dir + "/web.sock", "sandbox port"},
		{"unix:" + inUse + ":80", "listens on"},
	} {
		for _, args := range [][]string{
			{"create", "--image", "busybox", "-p", tc.spec},
			{"run", "--rm", "--image", "busybox", "-p", tc.spec, "--", "true"},
		} {
			assertOneLineError(t, e.run(nil, args...), tc.want)
		}
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Fatalf("a refused socket path changed the file there: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(dir, "elsewhere.sock")); err == nil {
		t.Fatal("a socket was made through a symlink")
	}
	if all := e.list(); len(all) != 0 {
		t.Fatalf("refused creates left sandboxes: %+v", all)
	}
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("refused creates left state: %v", d)
	}
	id := e.create()
	assertOneLineError(t, e.run(nil, "port-forward", id, "unix:"+open+"/web.sock:80"), "writable by other users")

	// A socket nothing listens on, left by a forwarder that was killed,
	// is replaced.
	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	sl.SetUnlinkOnClose(false)
	sl.Close()
	e.ok("rm", "-f", e.create("-p", "unix:"+stale+":80"))
}
