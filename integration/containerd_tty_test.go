package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// termOn runs bin/name with args on a pty the test holds, of rows x cols,
// as a person's terminal.
func (c *ctrd) termOn(rows, cols uint16, name string, args ...string) *term {
	c.t.Helper()
	return runOnTerm(c.t, exec.Command(filepath.Join(c.bin, name), args...), rows, cols, nil)
}

// checkPodTerminal drives an interactive shell of a pod's container on
// tm, a 30x100 terminal: its terminal is one of the sandbox's devpts, its
// size is the caller's and follows it, ^C interrupts the foreground
// command only, and the shell's exit status 7 comes back: the caller
// exits wantCode and shows wantText. ps lists the container's processes.
func checkPodTerminal(t *testing.T, tm *term, ps func() string, wantCode int, wantText string) {
	t.Helper()
	// (Markers are split with "" so that the echo of what is typed does
	// not match them.)
	tm.send(`case $(tty) in /dev/pts/[0-9]*) echo on-""pts $(tty);; *) echo not-""pts $(tty);; esac` + "\r")
	tm.expect("on-pts /dev/pts/")
	tm.send(`echo size""=$(stty size)` + "\r")
	tm.expect("size=30 100")

	// The caller's terminal changes size: ctr or crictl passes it on.
	if err := pty.Setsize(tm.ptmx, &pty.Winsize{Rows: 45, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		tm.send(`echo size""=$(stty size)` + "\r")
		if tm.has("size=45 132") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new size never reached the terminal; it shows:\n%s", tm.out.String())
		}
	}

	tm.send("sleep 300\r")
	waitFor(t, func() bool { return strings.Contains(ps(), "sleep 300") })
	time.Sleep(300 * time.Millisecond) // until the shell has given it the terminal
	tm.send("\x03")
	tm.send(`echo status""=$?` + "\r")
	tm.expect("status=130")
	if strings.Contains(ps(), "sleep 300") {
		t.Fatal("^C did not stop sleep 300")
	}
	tm.send(`echo al""ive` + "\r")
	tm.expect("alive")

	tm.send("exit 7\r")
	if code := tm.wait(); code != wantCode {
		t.Fatalf("exited %d, want %d; terminal:\n%s", code, wantCode, tm.out.String())
	}
	if wantText != "" {
		tm.expect(wantText)
	}
	tm.assertCooked()
}

// has reports whether s appears in the output after what expects
// consumed, consuming it if so.
func (tm *term) has(s string) bool {
	time.Sleep(300 * time.Millisecond)
	tm.mu.Lock()
	defer tm.mu.Unlock()
	rest := tm.out.String()[tm.seen:]
	if i := strings.Index(rest, s); i >= 0 {
		tm.seen += i + len(s)
		return true
	}
	return false
}

// ctr task exec -t runs its command on a terminal of the sandbox's own
// devpts, held by hutch's agent: see checkPodTerminal.
func TestContainerdExecTerminal(t *testing.T) {
	c := newContainerd(t)
	c.importBusybox("default")
	c.ctrOK("default", "run", "-d", "--runtime", hutchRuntime, "busybox:latest", "ttys", "sh", "-c", "while true; do sleep 1; done")
	ps := func() string { return c.ctrOK("default", "task", "exec", "--exec-id", "ps", "ttys", "ps") }

	tm := c.termOn(30, 100, "ctr", "-a", c.sock, "task", "exec", "-t", "--exec-id", "shell", "ttys", "sh")
	checkPodTerminal(t, tm, ps, 7, "")

	// A command that ends by itself: its output and status.
	tm = c.termOn(30, 100, "ctr", "-a", c.sock, "task", "exec", "-t", "--exec-id", "once", "ttys", "sh", "-c", "tty; exit 4")
	tm.expect("/dev/pts/")
	if code := tm.wait(); code != 4 {
		t.Fatalf("exec -t sh -c 'exit 4' exited %d; terminal:\n%s", code, tm.out.String())
	}

	// A kill of the exec reaches its command.
	tm = c.termOn(30, 100, "ctr", "-a", c.sock, "task", "exec", "-t", "--exec-id", "killed", "ttys", "sleep", "301")
	waitFor(t, func() bool { return strings.Contains(ps(), "sleep 301") })
	c.ctrOK("default", "task", "kill", "--exec-id", "killed", "-s", "SIGTERM", "ttys")
	if code := tm.wait(); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exec -t killed with SIGTERM exited %d; terminal:\n%s", code, tm.out.String())
	}

	// The agent is the host's binary, read-only to the pod, root or not.
	before, err := os.ReadFile(filepath.Join(c.bin, "hutch-init"))
	if err != nil {
		t.Fatal(err)
	}
	r := c.ctr("default", "task", "exec", "--exec-id", "w", "ttys", "sh", "-c",
		"echo x >> /.hutch/hutch-init; cp /bin/sh /.hutch/hutch-init; rm -f /.hutch/hutch-init; chmod 777 /.hutch/hutch-init; ls -l /.hutch/hutch-init")
	if after, _ := os.ReadFile(filepath.Join(c.bin, "hutch-init")); !bytes.Equal(before, after) {
		t.Fatalf("a pod changed the host's hutch-init: %s", r)
	}
	if !strings.Contains(r.stdout, "-rwxr-xr-x") || !strings.Contains(r.stderr, "Read-only file system") {
		t.Fatalf("writes to /.hutch/hutch-init inside the pod: want them refused (read-only), got %s", r)
	}

	c.ctrOK("default", "task", "kill", "-s", "SIGKILL", "ttys")
	waitFor(t, func() bool { return strings.Contains(c.ctrOK("default", "task", "ls"), "STOPPED") })
	c.ctrOK("default", "task", "rm", "ttys")
	c.ctrOK("default", "container", "rm", "ttys")
	c.assertClean("ttys")
}

// crictl exec -it (kubectl exec -it's path through CRI) gets the same
// terminal, in a container with a read-only root filesystem.
func TestContainerdCRIExecTerminal(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	podCfg := c.podConfig("ttypod", nil, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	ctrCfg := c.writeJSON("ctr-ttys.json", `{"metadata":{"name":"ttys"},"image":{"image":"`+criBusyboxImage+`"},
"command":["sh","-c","while true; do sleep 1; done"],"log_path":"ttys.log","linux":{"security_context":{"readonly_rootfs":true}}}`)
	ctr := c.crictlOK("create", pod, ctrCfg, podCfg)
	c.crictlOK("start", ctr)
	ep := "unix://" + c.sock
	ps := func() string { return c.crictlOK("exec", ctr, "ps") }

	tm := c.termOn(30, 100, "crictl", "--config", "/dev/null", "-r", ep, "-i", ep, "exec", "-it", ctr, "sh")
	// crictl exits 1 for any failure, and names the status.
	checkPodTerminal(t, tm, ps, 1, "exit code 7")

	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, ctr)
}
