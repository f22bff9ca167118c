package integration

import (
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
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// flipper swaps the directory allowed/d with the symlink allowed/.spare,
// which leads to outside, over and over (renameat2 RENAME_EXCHANGE: the
// name d is always there, one or the other), as another process of the
// user's, or a sandbox with the directory mounted, could while tool calls
// run. It stops when the test ends, or after limit at most.
func flipper(t *testing.T, allowed, outside string, limit time.Duration) {
	t.Helper()
	d, spare := filepath.Join(allowed, "d"), filepath.Join(allowed, ".spare")
	if err := os.Symlink(outside, spare); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for deadline := time.Now().Add(limit); time.Now().Before(deadline); {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, d, unix.AT_FDCWD, spare, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("swap %s and %s: %v", d, spare, err)
				return
			}
			// Pacing, not synchronisation: a swap every ~100 µs, many
			// within any tool call, without taking a whole core.
			time.Sleep(100 * time.Microsecond)
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// A download whose target directory is swapped for a symlink to another
// directory while the call runs writes nothing outside the allowed
// directory: the target is resolved once into a descriptor, from the
// allowed directory's, and the copy goes through it.
func TestHostileMCPDownloadRace(t *testing.T) {
	e := newEnv(t)
	base := t.TempDir()
	allowed, outside := filepath.Join(base, "allowed"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(allowed, "d"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cs := mcpServe(t, e, "--allow-host-dir", allowed)
	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.SandboxID, "path": "/payload/hook", "content": "#!/bin/sh\necho owned\n", "mode": "0755"}, nil)

	flipper(t, allowed, outside, 5*time.Minute)
	const rounds = 300
	copied, refused := 0, 0
	for i := range rounds {
		res := callTool(t, cs, "download_file", map[string]any{"sandbox_id": sb.SandboxID, "host_path": "d", "path": "/payload/hook"})
		switch msg := toolText(res); {
		case !res.IsError:
			copied++
		case strings.Contains(msg, "outside the allowed directory"):
			refused++
		default:
			t.Fatalf("round %d: download_file: %s", i, msg)
		}
		if ents, _ := os.ReadDir(outside); len(ents) > 0 {
			t.Fatalf("round %d of %d (%d copied, %d refused): download_file wrote %s outside the allowed directory", i+1, rounds, copied, refused, filepath.Join(outside, ents[0].Name()))
		}
	}
	t.Logf("%d downloads: %d copied, %d refused, nothing outside", rounds, copied, refused)
	// Both sides of the swap were seen, or the race was not run.
	if copied == 0 || refused == 0 {
		t.Fatalf("%d copied, %d refused: want both, the swap seen either way", copied, refused)
	}
}

// An upload whose source's directory is swapped for a symlink to another
// directory while the call runs never copies that other directory's file
// into the sandbox: the source is opened once, beneath the allowed
// directory, and copied from that descriptor.
func TestHostileMCPUploadRace(t *testing.T) {
	e := newEnv(t)
	base := t.TempDir()
	allowed, outside := filepath.Join(base, "allowed"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(allowed, "d"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(allowed, "d", "f"), []byte("inside the allowed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Of the same size: a copy that stats one and reads the other
	// copies it whole.
	if err := os.WriteFile(filepath.Join(outside, "f"), []byte("SECRET of the host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cs := mcpServe(t, e, "--allow-host-dir", allowed)
	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.SandboxID, "path": "/up/.keep", "content": ""}, nil)

	flipper(t, allowed, outside, 5*time.Minute)
	const rounds = 200
	copied, refused := 0, 0
	for i := range rounds {
		res := callTool(t, cs, "upload_file", map[string]any{"sandbox_id": sb.SandboxID, "host_path": "d/f", "path": fmt.Sprintf("/up/%d", i)})
		switch msg := toolText(res); {
		case !res.IsError:
			copied++
		case strings.Contains(msg, "outside the allowed directory"):
			refused++
		default:
			t.Fatalf("round %d: upload_file: %s", i, msg)
		}
	}
	var run mcpRun
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.SandboxID, "command": "grep -l SECRET /up/* | wc -l; cat /up/* | sort | uniq -c"}, &run)
	t.Logf("%d uploads: %d copied, %d refused; in the sandbox:\n%s", rounds, copied, refused, run.Stdout)
	if n := strings.Fields(run.Stdout); len(n) == 0 || n[0] != "0" {
		t.Fatalf("upload_file copied the file outside the allowed directory into the sandbox: %s files hold it:\n%s", n[0], run.Stdout)
	}
	if copied == 0 || refused == 0 {
		t.Fatalf("%d copied, %d refused: want both, the swap seen either way", copied, refused)
	}
}

// mcpInitialize is a JSON-RPC initialize request, the first of a session.
const mcpInitialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}`

// inspectorAs runs the pinned MCP Inspector's CLI as another user of the
// host: its stdout and stderr, and whether it succeeded.
func inspectorAs(t *testing.T, cred *syscall.Credential, home string, args ...string) (string, error) {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join(mcpInspectorDir, "node_modules", ".bin", "mcp-inspector"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("MCP Inspector not installed (make mcp-inspector): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, bin, append([]string{"--cli"}, args...)...)
	c.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home}
	c.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := c.CombinedOutput()
	return string(out), err
}

// postAs sends an MCP initialize over the UNIX socket sock as another
// user of the host (perl-base is in every Debian): the HTTP answer, or why
// there was none.
func postAs(cred *syscall.Credential, sock string) string {
	c := exec.Command("perl", "-MIO::Socket::UNIX", "-e", `$s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "connect: $!\n";
print $s "POST /mcp HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: " . length($ARGV[1]) . "\r\n\r\n$ARGV[1]"; print while <$s>;`, sock, mcpInitialize)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, _ := c.CombinedOutput()
	return string(out)
}

// postInitialize sends an MCP initialize to url with the given Host
// header and Authorization: the status and body.
func postInitialize(t *testing.T, hc *http.Client, url, host, auth string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(mcpInitialize))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// `hutch mcp --transport http` serves no one but its owner: on loopback
// TCP another user of the host, with the real MCP client, is refused
// without the server's token or with a made-up one, and cannot read the
// token's file; a request naming another host or port (a web page that
// rebinds its name to 127.0.0.1) is refused even with the token. On its
// UNIX socket another user cannot connect, and is refused by its peer
// credentials once the socket's mode is opened. The owner's client works
// on both.
func TestHostileMCPHTTPTransport(t *testing.T) {
	e := newEnv(t)
	u := rootlessUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	other := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	port := freePort(t)
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	url := "http://" + listen + "/mcp"
	startMCPHTTP(t, e, "tcp", listen, listen, "--owner", "hostile-test")

	for _, c := range []struct {
		name   string
		header []string
		want   string
	}{
		{"no token", nil, "no bearer token"},
		{"a made-up token", []string{"--header", "Authorization: Bearer " + strings.Repeat("0", 40)}, "the bearer token is not this server's"},
	} {
		out, err := inspectorAs(t, other, u.HomeDir, append([]string{url, "--transport", "http", "--method", "tools/call",
			"--tool-name", "create_sandbox", "--tool-arg", "image=busybox"}, c.header...)...)
		if err == nil || strings.Contains(out, "sandbox_id") {
			t.Fatalf("user %s with %s called create_sandbox: %v\n%s", u.Username, c.name, err, out)
		}
		if !strings.Contains(out, c.want) {
			t.Errorf("user %s with %s: the client's error does not say %q:\n%s", u.Username, c.name, c.want, out)
		}
	}
	tokFile := filepath.Join(e.root, "mcp", "token")
	if fi, err := os.Stat(tokFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s: %v %v: want mode 0600", tokFile, fi, err)
	}
	if out, err := asUser(other, "read", tokFile); err == nil || !strings.Contains(out, "ermission denied") {
		t.Fatalf("user %s reading the token file: %v: %s", u.Username, err, out)
	}

	// The owner's client, with the token.
	tok := mcpToken(t, e)
	cs := mcpConnect(t, url, bearerClient(tok))
	if l := mcpList(t, cs); len(l) != 0 {
		t.Fatalf("sandboxes after the refused calls: %+v", l)
	}
	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	var run mcpRun
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.SandboxID, "command": "echo for the owner"}, &run)
	if run.Stdout != "for the owner\n" {
		t.Fatalf("run_command for the owner: %+v", run)
	}

	// Host names a rebinding page would send, with the right token.
	hc := &http.Client{Timeout: 30 * time.Second}
	for _, host := range []string{"rebind.example:" + strconv.Itoa(port), "127.0.0.1:" + strconv.Itoa(port+1), "127.0.0.1"} {
		if code, body := postInitialize(t, hc, url, host, "Bearer "+tok); code != http.StatusForbidden || !strings.Contains(body, "answers only to") {
			t.Errorf("Host %q with the token: %d %q, want 403", host, code, body)
		}
	}
	if code, body := postInitialize(t, hc, url, "localhost:"+strconv.Itoa(port), "Bearer "+tok); code != http.StatusOK {
		t.Fatalf("Host localhost:%d with the token: %d %q, want 200", port, code, body)
	}

	// The UNIX socket, at its default place in the state root.
	sock := filepath.Join(e.root, "mcp", "mcp.sock")
	startMCPHTTP(t, e, "unix", sock, "unix", "--owner", "hostile-test")
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v %v: want a socket of mode 0600", sock, fi, err)
	}
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory: %v %v: want mode 0700", fi, err)
	}
	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	us := mcpConnect(t, "http://localhost/mcp", uc)
	if l := mcpList(t, us); len(l) != 1 || l[0].SandboxID != sb.SandboxID {
		t.Fatalf("list_sandboxes through the socket: %+v: want the owner's sandbox", l)
	}
	if out := postAs(other, sock); !strings.Contains(out, "connect: Permission denied") {
		t.Fatalf("user %s through the socket: %q: want permission denied", u.Username, out)
	}
	// Its mode opened, and every directory above passable: the peer's
	// credentials still keep the other user out.
	for d := filepath.Dir(sock); d != filepath.Clean(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	out := postAs(other, sock)
	if !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "uid "+u.Uid+" may not use this server") || strings.Contains(out, "protocolVersion") {
		t.Fatalf("user %s through a socket opened to all: %q: want 403", u.Username, out)
	}
	if l := mcpList(t, us); len(l) != 1 {
		t.Fatalf("list_sandboxes after: %+v", l)
	}
}
