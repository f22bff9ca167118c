package main

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hutch.dev/hutch/assembly/hostproc"
)

// The test binary is also the helper (HUTCH_HELPER_TEST=main) and the hutch
// the helper execs (HUTCH_HELPER_TEST=serve: it accepts one connection on
// fd 3 and writes its PID to it).
func TestMain(m *testing.M) {
	switch os.Getenv("HUTCH_HELPER_TEST") {
	case "main":
		main()
		os.Exit(0)
	case "serve":
		l, err := net.FileListener(os.NewFile(3, "listener"))
		if err != nil {
			os.Exit(3)
		}
		c, err := l.Accept()
		if err != nil {
			os.Exit(4)
		}
		c.Write([]byte(strconv.Itoa(os.Getpid()) + "\n"))
		c.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helper(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	c := exec.Command(os.Args[0], args...)
	c.Env = append(os.Environ(), "HUTCH_HELPER_TEST=main")
	c.Stderr = os.Stderr
	return c
}

// self is this process as a -sandbox flag: a sandbox that stays up.
func self(t *testing.T) string {
	t.Helper()
	return process(t, os.Getpid())
}

func process(t *testing.T, pid int) string {
	t.Helper()
	start, err := hostproc.Start(pid)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(pid) + ":" + strconv.FormatUint(start, 10)
}

func waitExit(t *testing.T, c *exec.Cmd, within time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		c.Process.Kill()
		t.Fatalf("%v still runs after %s", c.Args[:2], within)
		return nil
	}
}

// At the deadline the watchdog becomes the command after "--", in the
// same process, and not before.
func TestWatchdogExecsAtDeadline(t *testing.T) {
	out := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	deadline := start.Add(700 * time.Millisecond)
	c := helper(t, "lifetime-watchdog", "-deadline", deadline.Format(time.RFC3339Nano), "-sandbox", self(t),
		"--", "/bin/sh", "-c", `echo $$ > "$0"`, out)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, c, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 700*time.Millisecond {
		t.Fatalf("the command ran %s after the start, before the deadline", d)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the command did not run at the deadline: %v", err)
	}
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(c.Process.Pid) {
		t.Fatalf("the command ran as PID %s, want the helper's %d", got, c.Process.Pid)
	}
}

func listenTCP(t *testing.T) (*net.TCPListener, *os.File) {
	t.Helper()
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); f.Close() })
	return l, f
}

// The forwarder becomes hutch's forwarder at the first connection, in the
// same process, with the listener, which accepts that connection.
func TestForwarderExecsAtFirstConnection(t *testing.T) {
	l, f := listenTCP(t)
	// env execs in turn, keeping the PID.
	c := helper(t, "port-forward", "-listeners", "1", "-sandbox", self(t), "--", "/usr/bin/env", "HUTCH_HELPER_TEST=serve", os.Args[0])
	c.ExtraFiles = []*os.File{f}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	time.Sleep(300 * time.Millisecond)
	cl, err := os.ReadFile("/proc/" + strconv.Itoa(c.Process.Pid) + "/cmdline")
	if err != nil || !strings.Contains(string(cl), "port-forward") {
		t.Fatalf("before any connection the helper is %q (%v), want it waiting", cl, err)
	}
	conn, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("no answer on the forwarded listener: %v", err)
	}
	if got := strings.TrimSpace(line); got != strconv.Itoa(c.Process.Pid) {
		t.Fatalf("accepted by PID %s, want the helper's %d", got, c.Process.Pid)
	}
	if err := waitExit(t, c, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func listenUnix(t *testing.T) (string, *os.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	t.Cleanup(func() { f.Close() })
	return path, f
}

// SIGTERM ends a waiting forwarder, which removes its UNIX socket, as
// hutch's forwarder does.
func TestForwarderTermRemovesSocket(t *testing.T) {
	path, f := listenUnix(t)
	c := helper(t, "port-forward", "-listeners", "1", "-sandbox", self(t), "--", "/bin/false")
	c.ExtraFiles = []*os.File{f}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	c.Process.Signal(syscall.SIGTERM)
	if err := waitExit(t, c, 5*time.Second); err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket %s left after SIGTERM (%v)", path, err)
	}
}

// A forwarder whose sandbox's process is gone ends and removes its UNIX
// socket without running the command.
func TestForwarderEndsWithSandbox(t *testing.T) {
	path, f := listenUnix(t)
	sb := exec.Command("sleep", "600")
	if err := sb.Start(); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	c := helper(t, "port-forward", "-listeners", "1", "-sandbox", process(t, sb.Process.Pid),
		"--", "/bin/sh", "-c", `touch "$0"`, marker)
	c.ExtraFiles = []*os.File{f}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	sb.Process.Kill()
	sb.Wait()
	if err := waitExit(t, c, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket %s left (%v)", path, err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the forwarder ran its command for a sandbox that is gone")
	}
}

// The helper links none of what makes hutch large.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, bad := range []string{"github.com/moby/buildkit", "github.com/containerd/containerd", "google.golang.org/grpc",
			"google.golang.org/protobuf", "hutch.dev/hutch/engine", "hutch.dev/hutch/overlay", "hutch.dev/hutch/registry"} {
			if p == bad || strings.HasPrefix(p, bad+"/") {
				t.Errorf("hutch-helper links %s", p)
			}
		}
	}
}
