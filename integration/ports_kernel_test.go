package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// halfClose sends n bytes to addr, ends its writing (a half close) and
// returns all that comes back.
func halfClose(addr string, n int) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck // a fresh connection
	if _, err := c.Write(make([]byte, n)); err != nil {
		return "", err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// readAll returns what addr sends before it closes the connection.
func readAll(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck // a fresh connection
	b, err := io.ReadAll(c)
	return string(b), err
}

// checkForwarding checks, through a sandbox's published ports, a server
// that answers once its client has ended its writing (busybox nc running
// wc -c, on 9000), a server that speaks first and closes (nc running
// echo, on 9001), and httpd's files (on 8080), 50 requests at once. nc
// takes its connections one by one (its backlog is one, and a burst
// would wait for TCP's retransmissions, as it would on any network).
func checkForwarding(t *testing.T, e *env, runscFlags []string, id string, hostPorts map[int]int) {
	t.Helper()
	e.ok(append(runscFlags, "exec", "-d", id, "--", "nc", "-ll", "-p", "9000", "-e", "wc", "-c")...)
	e.ok(append(runscFlags, "exec", "-d", id, "--", "nc", "-ll", "-p", "9001", "-e", "echo", "banner")...)
	sum := e.startHTTPD(id)
	counted := fmt.Sprintf("127.0.0.1:%d", hostPorts[9000])
	waitFor(t, func() bool { s, err := halfClose(counted, 1); return err == nil && s == "1\n" })
	for _, n := range []int{0, 1, 65536, 100000, 3 << 20} {
		if s, err := halfClose(counted, n); err != nil || strings.TrimSpace(s) != fmt.Sprint(n) {
			t.Errorf("sent %d bytes and a half close: got %q, %v", n, s, err)
		}
		if s, err := readAll(fmt.Sprintf("127.0.0.1:%d", hostPorts[9001])); err != nil || s != "banner\n" {
			t.Errorf("a server that speaks first: got %q, %v", s, err)
		}
	}
	checkServed(t, fmt.Sprintf("http://127.0.0.1:%d", hostPorts[8080]), id, sum)
}

// checkOpenAcrossCheckpoints holds a forwarded connection open (to nc
// running wc -c, which waits for its end) while the sandbox is forked,
// then paused: both succeed, the pause ends the connection, and the port
// answers again after the resume.
//
// The host's end of the connection is held by the forwarder when relay
// is set (it copies between the client and the sandbox), else by the
// sandbox alone: the forwarder handed it over and copies nothing.
func checkOpenAcrossCheckpoints(t *testing.T, e *env, runscFlags []string, id, addr string, relay bool) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("open")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // made inside the sandbox
	if holders := connHolders(t, c); len(holders) != 1 || strings.Contains(holders[0], "port-forward") != relay {
		t.Errorf("the host's end of a forwarded connection is held by %q; want one holder, the forwarder if it relays (%v)", holders, relay)
	}
	for _, copyID := range strings.Fields(e.ok(append(runscFlags, "fork", id)...)) {
		defer e.run(nil, "rm", "-f", copyID)
	}
	e.ok(append(runscFlags, "pause", id)...)
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a live connection
	if _, err := c.Read(make([]byte, 16)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a forwarded connection open across a pause: read %v, want its end", err)
	}
	e.ok(append(runscFlags, "resume", id)...)
	waitFor(t, func() bool { s, err := halfClose(addr, 5); return err == nil && s == "5\n" })
}

// connHolders returns the command lines (arguments joined by spaces),
// each once, of the processes that hold the host's end of c, a TCP
// connection over IPv4 loopback: the socket whose local address is c's
// remote one. Processes with no command line are left out: the sentry's
// systrap stubs share its descriptors.
func connHolders(t *testing.T, c net.Conn) []string {
	t.Helper()
	hexAddr := func(a net.Addr) string {
		ta := a.(*net.TCPAddr)
		ip := ta.IP.To4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ta.Port)
	}
	local, remote := hexAddr(c.RemoteAddr()), hexAddr(c.LocalAddr())
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	inode := ""
	for _, line := range strings.Split(string(table), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 9 && f[1] == local && f[2] == remote {
			inode = f[9]
		}
	}
	if inode == "" {
		t.Fatalf("no socket %s -> %s in /proc/net/tcp", local, remote)
	}
	var holders []string
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && link == "socket:["+inode+"]" {
			cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(fd)), "cmdline"))
			if h := strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")); h != "" && !slices.Contains(holders, h) {
				holders = append(holders, h)
			}
		}
	}
	return holders
}

// A sandbox with no network is reached through its own kernel: the
// sentry makes each forwarded connection and copies it, and no process in
// the sandbox relays it. Half closes pass both ways, large bodies arrive
// whole, concurrent connections are kept apart. A runsc without
// tools/runsc/portforward.patch gets the agent's relay instead, with the
// same results.
func TestForwardThroughSandboxKernel(t *testing.T) {
	e := newEnv(t)
	unpatched := filepath.Join(e.bin, "runsc-unpatched")
	if _, err := os.Stat(unpatched); err != nil {
		t.Fatalf("%v (`make test` builds it)", err)
	}
	for _, tc := range []struct {
		name       string
		runscFlags []string
		relay      bool // the agent's portmux relays
		// deep: a root whose control sockets' paths are too long for a
		// socket address, which runsc reaches through /proc.
		deep bool
	}{
		{"hutch's runsc", nil, false, false},
		{"hutch's runsc, a deep root", nil, false, true},
		{"runsc without the patch", []string{"--runsc", unpatched}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sub := *e
			sub.t = t
			if tc.deep {
				sub.root = filepath.Join(e.root, strings.Repeat("d", 120))
				t.Cleanup(sub.removeAll)
			}
			e := &sub
			args := append(append([]string{}, tc.runscFlags...), "create", "--image", "busybox", "--net", "none")
			for _, p := range []int{9000, 9001, 8080} {
				args = append(args, "-p", fmt.Sprintf("127.0.0.1:0:%d", p))
			}
			id := strings.TrimSpace(e.ok(args...))
			hostPorts := map[int]int{}
			for _, p := range e.ports(id).Ports {
				hostPorts[p.Port] = p.HostPort
			}
			checkForwarding(t, e, tc.runscFlags, id, hostPorts)
			ps := e.ok(append(tc.runscFlags, "exec", id, "--", "ps")...)
			if relay := strings.Contains(ps, "portmux"); relay != tc.relay {
				t.Errorf("the agent's relay running: %v, want %v:\n%s", relay, tc.relay, ps)
			}
			checkOpenAcrossCheckpoints(t, e, tc.runscFlags, id, fmt.Sprintf("127.0.0.1:%d", hostPorts[9000]), tc.relay)
			e.ok("rm", "-f", id)
			e.assertClean(id)
		})
	}
}

// A hostile server that listens with the smallest backlog and never
// accepts: once its backlog is full, the sandbox's kernel drops the SYNs
// of the forwarded connections that follow, and their connects wait.
// The sandbox's control still answers at once (exec, rm), and rm ends
// them.
func TestHostileServerHoldsForwardedConnections(t *testing.T) {
	e := newEnv(t)
	id := e.create("--net", "none", "-p", "127.0.0.1:0:7000")
	hostPort := e.ports(id).Ports[0].HostPort
	e.ok("cp", buildProbe(t), id+":/probe")
	e.ok("exec", "-d", id, "--", "/probe", "listen-no-accept", "7000")
	waitFor(t, func() bool { return e.run(nil, "exec", id, "--", "test", "-e", "/tmp/listening").code == 0 })
	// The backlog fills; no connection is ever accepted.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 16 {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", hostPort), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	time.Sleep(2 * time.Second) // the forwarder has asked the sandbox for each
	start := time.Now()
	done := make(chan result, 1)
	go func() { done <- e.run(nil, "exec", id, "--", "echo", "answered") }()
	select {
	case r := <-done:
		if r.code != 0 || r.stdout != "answered\n" {
			t.Fatalf("exec beside waiting forwarded connections: %s", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("exec did not answer within 30 s while forwarded connections waited")
	}
	t.Logf("exec answered in %v", time.Since(start))
	// A checkpoint while the connects wait: they end, the fork and the
	// pause succeed, and the sandbox and its copy answer afterwards.
	copies := strings.Fields(e.ok("fork", id))
	for _, c := range copies {
		defer e.run(nil, "rm", "-f", c)
	}
	if len(copies) != 1 {
		t.Fatalf("fork: got copies %q", copies)
	}
	e.ok("pause", id)
	e.ok("resume", id)
	for _, s := range []string{id, copies[0]} {
		if out := e.ok("exec", s, "--", "echo", "answered"); out != "answered\n" {
			t.Errorf("exec into %s after the checkpoint: %q", s, out)
		}
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
}
