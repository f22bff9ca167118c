package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// term is hutch running on a pty the test holds, as a person's terminal.
type term struct {
	t        *testing.T
	cmd      *exec.Cmd
	ptmx     *os.File // the master: what the person types and sees
	tty      *os.File // the slave, hutch's stdio, kept to read its modes
	mu       sync.Mutex
	out      bytes.Buffer
	seen     int // out is searched from here on
	readDone chan struct{}
}

func (e *env) startTerm(rows, cols uint16, args ...string) *term {
	e.t.Helper()
	return runOnTerm(e.t, e.cmd(nil, args...), rows, cols, e.cred)
}

// runOnTerm starts c on a pty the test holds, of rows x cols, as a
// person's terminal (c leads its session and has the pty as its
// controlling terminal), running as cred if set.
func runOnTerm(t *testing.T, c *exec.Cmd, rows, cols uint16, cred *syscall.Credential) *term {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		t.Fatal(err)
	}
	c.Stdin, c.Stdout, c.Stderr = tty, tty, tty
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: cred}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	tm := &term{t: t, cmd: c, ptmx: ptmx, tty: tty, readDone: make(chan struct{})}
	go func() {
		defer close(tm.readDone)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			tm.mu.Lock()
			tm.out.Write(buf[:n])
			tm.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		c.Process.Kill()
		c.Wait()
		ptmx.Close()
		tty.Close()
	})
	return tm
}

func (tm *term) send(s string) {
	tm.t.Helper()
	if _, err := tm.ptmx.Write([]byte(s)); err != nil {
		tm.t.Fatal(err)
	}
}

// expect waits until s appears in the output after what earlier expects
// consumed.
func (tm *term) expect(s string) {
	tm.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		tm.mu.Lock()
		rest := tm.out.String()[tm.seen:]
		if i := strings.Index(rest, s); i >= 0 {
			tm.seen += i + len(s)
			tm.mu.Unlock()
			return
		}
		tm.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.t.Fatalf("terminal never showed %q; it shows:\n%s", s, tm.out.String())
}

// wait waits for hutch to exit and returns its status.
func (tm *term) wait() int {
	tm.t.Helper()
	done := make(chan error, 1)
	go func() { done <- tm.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		} else if err != nil {
			tm.t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		tm.t.Fatalf("hutch did not exit; terminal shows:\n%s", tm.out.String())
	}
	return -1
}

// assertCooked checks that the terminal is back in the mode hutch found it
// in: line editing and echo on.
func (tm *term) assertCooked() {
	tm.t.Helper()
	tio, err := unix.IoctlGetTermios(int(tm.tty.Fd()), unix.TCGETS)
	if err != nil {
		tm.t.Fatal(err)
	}
	if tio.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != unix.ICANON|unix.ECHO|unix.ISIG {
		tm.t.Fatalf("terminal left in raw mode: lflag %#x", tio.Lflag)
	}
}

// hutch shell: a command typed into the shell runs in the sandbox, the
// window size follows the caller's terminal, ^C interrupts the foreground
// command, and the shell's exit status is hutch's.
func TestShellOnPty(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	tm := e.startTerm(30, 100, "shell", id)

	tm.send("echo out-$((6*7)) $(hostname)\r")
	tm.expect("out-42 " + id[:12])

	tm.send("stty size\r")
	tm.expect("30 100")

	// A resize of the caller's terminal reaches the sandbox's pty, and
	// SIGWINCH reaches the program in its foreground.
	// (Markers are split with "" so that the echo of what is typed
	// does not match them.)
	tm.send(`sh -c 'trap "echo win""ch; stty size" WINCH; echo rea""dy; while sleep 0.2; do :; done'` + "\r")
	tm.expect("ready")
	if err := pty.Setsize(tm.ptmx, &pty.Winsize{Rows: 45, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	tm.expect("winch")
	tm.expect("45 132")

	// ^C interrupts it as it would on the host: SIGINT, status 130.
	// (A shell drops the rest of a command line a ^C interrupted, so
	// the status is asked for on the next line.)
	tm.send("\x03")
	tm.send("echo status=$?\r")
	tm.expect("status=130")
	tm.send("sleep 300\r")
	waitFor(t, func() bool { return strings.Contains(e.ok("exec", id, "--", "ps", "-o", "args"), "sleep 300") })
	tm.send("\x03")
	tm.send("echo status=$?\r")
	tm.expect("status=130")
	if strings.Contains(e.ok("exec", id, "--", "ps", "-o", "args"), "sleep 300") {
		t.Fatal("^C did not stop sleep 300")
	}

	tm.send("exit 7\r")
	if code := tm.wait(); code != 7 {
		t.Fatalf("hutch shell exited %d, want the shell's 7; terminal:\n%s", code, tm.out.String())
	}
	tm.assertCooked()
}

// exec -it and run -it: the command gets a terminal and its exit status
// comes back; the caller's terminal is restored.
func TestExecAndRunWithTTY(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	tm := e.startTerm(24, 80, "exec", "-it", id, "--", "sh", "-c", `[ -t 0 ] && [ -t 1 ] && echo on-a-""tty; read x; exit $x`)
	tm.expect("on-a-tty")
	tm.send("5\r")
	if code := tm.wait(); code != 5 {
		t.Fatalf("exec -it exited %d, want 5", code)
	}
	tm.assertCooked()

	tm = e.startTerm(24, 80, "run", "--rm", "-it", "--image", "busybox", "--", "sh", "-c", "stty size; exit 3")
	tm.expect("24 80")
	if code := tm.wait(); code != 3 {
		t.Fatalf("run -it exited %d, want 3", code)
	}
	tm.assertCooked()

	// A command that cannot start reports 127 on a terminal too.
	tm = e.startTerm(24, 80, "exec", "-it", id, "--", "no-such-command")
	if code := tm.wait(); code != 127 {
		t.Fatalf("exec -it of a missing command exited %d, want 127", code)
	}
	tm.assertCooked()

	// -i -t without a terminal on stdin is a usage error.
	r := e.run(strings.NewReader(""), "exec", "-it", id, "--", "true")
	assertOneLineError(t, r, "terminal")
}

// The terminal is one of the sandbox's own: `tty` names a /dev/pts
// device, job control works (^Z stops the foreground job, bg and fg move
// it), ^C and ^\ reach the foreground job only and the shell lives on,
// and a command killed by a signal reports 128+N.
func TestSandboxTerminal(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	tm := e.startTerm(24, 80, "shell", id)

	// (Markers are split with "" so that the echo of what is typed
	// does not match them.)
	tm.send(`case $(tty) in /dev/pts/[0-9]*) echo on-""pts;; *) echo not-""pts;; esac` + "\r")
	tm.expect("on-pts")

	tm.send("sleep 100\r")
	waitFor(t, func() bool { return strings.Contains(e.ok("exec", id, "--", "ps", "-o", "stat,args"), "sleep 100") })
	tm.send("\x1a")
	tm.expect("Stopped")
	waitFor(t, func() bool { return psState(e, id, "sleep 100") == "T" })
	tm.send("jobs\r")
	tm.expect("Stopped")
	tm.send("bg\r")
	waitFor(t, func() bool { return psState(e, id, "sleep 100") == "S" })
	tm.send("jobs\r")
	tm.expect("Running")
	tm.send("fg\r")
	tm.expect("sleep 100")
	time.Sleep(300 * time.Millisecond) // until the shell has given it the terminal
	tm.send("\x03")
	tm.send("echo status=$?\r")
	tm.expect("status=130")
	if psState(e, id, "sleep 100") != "" {
		t.Fatal("^C after fg did not end sleep 100")
	}

	tm.send("sleep 200\r")
	waitFor(t, func() bool { return psState(e, id, "sleep 200") != "" })
	tm.send("\x1c")
	tm.send("echo status=$?\r")
	tm.expect("status=131")
	tm.send(`echo al""ive-$$` + "\r")
	tm.expect("alive-")

	tm.send("exit 3\r")
	if code := tm.wait(); code != 3 {
		t.Fatalf("hutch shell exited %d, want 3", code)
	}
	tm.assertCooked()

	// A full-screen program draws on the terminal (top's header, in the
	// terminal's alternate screen), takes a key and gives the terminal
	// back.
	tm = e.startTerm(30, 100, "exec", "-it", id, "--", "top", "-d", "1")
	tm.expect("oad average") // busybox says Load, procps load
	tm.expect("\x1b[")
	tm.send("q")
	if code := tm.wait(); code != 0 {
		t.Fatalf("top exited %d after q, want 0", code)
	}
	tm.assertCooked()

	// A command that a signal ends: 128+N.
	tm = e.startTerm(24, 80, "exec", "-it", id, "--", "sh", "-c", "kill -TERM $$")
	if code := tm.wait(); code != 143 {
		t.Fatalf("exec -it of a command killed by SIGTERM exited %d, want 143", code)
	}
	tm.assertCooked()
}

// psState is the state letter (R, S, T...) of the process of the
// sandbox whose arguments are args, or "" if there is none.
func psState(e *env, id, args string) string {
	for _, l := range strings.Split(e.ok("exec", id, "--", "ps", "-o", "stat,args"), "\n") {
		f := strings.Fields(l)
		// busybox's ps puts {COMM} before the arguments when the two
		// differ, as they do for an applet busybox's shell re-executes
		// through /proc/self/exe ("{exe} sleep 100").
		if len(f) > 2 && strings.HasPrefix(f[1], "{") && strings.HasSuffix(f[1], "}") {
			f = append(f[:1], f[2:]...)
		}
		if len(f) > 1 && strings.Join(f[1:], " ") == args {
			return f[0][:1]
		}
	}
	return ""
}

// On the default image: Python finds its terminal's name, and the
// terminal belongs to the user the command runs as. (gVisor's /proc does
// not give a process's terminal: `ps` shows none.)
func TestSandboxTerminalBase(t *testing.T) {
	e := newEnv(t)
	e.root = baseArchive(t)
	id := e.create("--image", "base", "--net", "none")
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })
	tm := e.startTerm(24, 80, "exec", "-it", id, "--", "sh", "-c",
		`python3 -c 'import os; print("name=" + os.ttyname(0))'; stat -c 'owner=%U' "$(tty)"`)
	tm.expect("name=/dev/pts/")
	tm.expect("owner=user")
	if code := tm.wait(); code != 0 {
		t.Fatalf("exec -it exited %d; terminal:\n%s", code, tm.out.String())
	}
	tm.assertCooked()
}
