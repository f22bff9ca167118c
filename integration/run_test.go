package integration

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `hutch run --rm` hands its command to the sandbox's init, which starts it
// at boot. The command must still behave as an exec'd one would: these
// tests check what differs in how it is started.

// startFirstLine starts hutch with args and returns it once the command
// inside has printed its first line, which is returned too.
func (e *env) startFirstLine(t *testing.T, args ...string) (*exec.Cmd, *bufio.Reader, string) {
	t.Helper()
	c := e.cmd(nil, args...)
	stderr := &bytes.Buffer{}
	c.Stderr = stderr
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatalf("no first line from hutch %v (%v); stderr %q", args, err, stderr)
	}
	return c, rd, line
}

// startRun is startFirstLine of `hutch run --rm` of args.
func (e *env) startRun(t *testing.T, args ...string) (*exec.Cmd, *bufio.Reader, string) {
	t.Helper()
	return e.startFirstLine(t, append([]string{"run", "--rm", "--image", "busybox", "--"}, args...)...)
}

// runStderr is what a command started by startFirstLine wrote on stderr.
func runStderr(c *exec.Cmd) string { return c.Stderr.(*bytes.Buffer).String() }

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// While its command runs, a run --rm sandbox is an ordinary running
// sandbox (ls, exec) that refuses to be paused or forked; a signal to hutch
// reaches the command; afterwards nothing is left.
func TestRunRmWhileRunning(t *testing.T) {
	e := newEnv(t)
	c, rd, line := e.startRun(t, "sh", "-c", `trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.1; done`)
	if line != "ready\n" {
		t.Fatalf("first line %q", line)
	}
	ls := e.list()
	if len(ls) != 1 || ls[0].State != "running" {
		t.Fatalf("ls while run --rm runs: %+v", ls)
	}
	id := ls[0].ID
	if out := e.ok("exec", id, "--", "sh", "-c", "ps -o args | grep -c 'while :'"); strings.TrimSpace(out) == "0" {
		t.Fatalf("exec into the run --rm sandbox does not see its command")
	}
	assertOneLineError(t, e.run(nil, "pause", id), "cannot be paused")
	assertOneLineError(t, e.run(nil, "fork", id), "cannot be paused or forked")
	assertOneLineError(t, e.run(nil, "exec", "-d", id, "--", "sleep", "60"), "takes no background commands")

	c.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(rd)
	err := c.Wait()
	if string(rest) != "got TERM\n" || exitCode(err) != 7 {
		t.Fatalf("after SIGTERM to hutch run: output %q, exit %d (%v); want the command's trap to run and exit 7", rest, exitCode(err), err)
	}
	e.assertClean(id)
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("sandbox state left behind: %v", d)
	}
}

// A command that leaves a background process holding its output still
// ends the run; stdin streams in; statuses are the command's.
func TestRunRmStreamsAndStatuses(t *testing.T) {
	e := newEnv(t)
	in := make([]byte, 1<<20)
	rand.Read(in)
	r := e.run(bytes.NewReader(in), "run", "--rm", "-i", "--image", "busybox", "--", "cat")
	if r.code != 0 || r.stdout != string(in) {
		t.Fatalf("run --rm -i cat of 1 MiB: exit %d, %d bytes back, stderr %q", r.code, len(r.stdout), r.stderr)
	}

	done := make(chan result, 1)
	go func() {
		done <- e.run(nil, "run", "--rm", "--image", "busybox", "--", "sh", "-c", "sleep 600 & echo started; exit 4")
	}()
	select {
	case r := <-done:
		if r.code != 4 || r.stdout != "started\n" {
			t.Fatalf("run --rm with a background child: %s", r)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run --rm waits for a background process of its command")
	}

	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"sh", "-c", "exit 42"}, 42, ""},
		{[]string{"sh", "-c", "exit 128"}, 128, ""},
		{[]string{"no-such-command"}, 127, "hutch: no-such-command: command not found\n"},
		{[]string{"/no/such/file"}, 127, "hutch: /no/such/file: no such file or directory\n"},
		{[]string{"/etc/passwd"}, 126, "hutch: /etc/passwd: permission denied\n"},
		{[]string{"/etc"}, 126, "hutch: /etc: permission denied\n"},
		{[]string{"sh", "-c", "kill -9 $$"}, 137, ""},
		{[]string{"sh", "-c", "kill -TERM $$"}, 143, ""},
	} {
		if r := e.run(nil, append([]string{"run", "--rm", "--image", "busybox", "--"}, tc.args...)...); r.code != tc.code || r.stderr != tc.stderr {
			t.Errorf("run --rm %v: want %d and stderr %q, got %s", tc.args, tc.code, tc.stderr, r)
		}
	}
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("sandbox state left behind: %v", d)
	}
}

// The command of run --rm gets what an exec'd one gets: the seccomp
// filter, capabilities, user and groups, environment and directory.
func TestRunRmProcessMatchesExec(t *testing.T) {
	e := newEnv(t)
	show := []string{"sh", "-c", `grep -E '^(Seccomp|NoNewPrivs|Cap[A-Za-z]+|Groups):' /proc/self/status; id; pwd; env | grep -v '^HOSTNAME=' | sort`}
	for _, user := range []string{"", "1000:1000", "nobody"} {
		create := []string{"--env", "EXTRA=1", "--workdir", "/tmp"}
		var as []string
		if user != "" {
			as = []string{"--user", user}
		}
		id := e.create(create...)
		want := e.ok(append(append(append([]string{"exec"}, as...), id, "--"), show...)...)
		e.ok("rm", "-f", id)
		got := e.ok(append(append(append(append([]string{"run", "--rm", "--image", "busybox"}, create...), as...), "--"), show...)...)
		if got != want || !strings.Contains(got, "Seccomp:\t2") {
			t.Errorf("user %q: run --rm's command sees\n%s\nan exec'd one\n%s", user, got, want)
		}
	}
}

// A bad user and a memory bomb fail the way they fail for exec, and leave
// nothing behind.
func TestRunRmFailures(t *testing.T) {
	e := newEnv(t)
	assertOneLineError(t, e.run(nil, "run", "--rm", "--image", "busybox", "--user", "nosuchuser", "--", "true"), "nosuchuser")
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("a refused run left state behind: %v", d)
	}
	r := e.run(nil, "run", "--rm", "--image", "busybox", "--memory", "128m", "--", "sh", "-c",
		"head -c 1000m /dev/zero | tail > /dev/null; echo survived")
	if r.code != 137 || !strings.Contains(r.stderr, "out of memory") || strings.Contains(r.stdout, "survived") {
		t.Fatalf("memory bomb under run --rm: want exit 137 with the reason, got %s", r)
	}
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("run --rm of a memory bomb left state behind: %v", d)
	}
	if left := processesMentioning(e.root); len(left) != 0 {
		t.Fatalf("processes left: %v", left)
	}
}

// A command whose sandbox is stopped under it ends with 137, for exec and
// for run --rm alike.
func TestCommandWhoseSandboxStops(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	c, _, line := e.startFirstLine(t, "exec", id, "--", "sh", "-c", "echo ready; sleep 600")
	if line != "ready\n" {
		t.Fatalf("first line %q", line)
	}
	e.ok("stop", id)
	err := c.Wait()
	// stop kills the sandbox's processes first: the command dies of
	// SIGKILL, as it would on a host shutting down.
	if exitCode(err) != 137 {
		t.Fatalf("exec whose sandbox stopped: exit %d, stderr %q", exitCode(err), runStderr(c))
	}
	e.ok("rm", id)
	e.assertClean(id)

	run, _, _ := e.startRun(t, "sh", "-c", "echo ready; sleep 600")
	ls := e.list()
	if len(ls) != 1 {
		t.Fatalf("ls while run --rm runs: %+v", ls)
	}
	e.ok("rm", "-f", ls[0].ID)
	// Its init is killed with it and cannot report: hutch says what
	// happened.
	if err := run.Wait(); exitCode(err) != 137 || !strings.Contains(runStderr(run), "stopped while sh ran") {
		t.Fatalf("run --rm whose sandbox was removed: exit %d (%v), stderr %q", exitCode(err), err, runStderr(run))
	}
	e.assertClean(ls[0].ID)
}

// The sandbox of run --rm lives no longer than hutch: killing hutch (even with
// SIGKILL, which it cannot catch) ends the sandbox, which ls then shows
// stopped and rm cleans.
func TestRunRmDiesWithHutch(t *testing.T) {
	e := newEnv(t)
	c, _, _ := e.startRun(t, "sh", "-c", "echo ready; sleep 600")
	ls := e.list()
	if len(ls) != 1 {
		t.Fatalf("ls while run --rm runs: %+v", ls)
	}
	id := ls[0].ID
	c.Process.Kill()
	c.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for len(processesMentioning(id)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := processesMentioning(id); len(left) > 0 {
		t.Fatalf("the sandbox outlived its hutch run --rm: %v", left)
	}
	if ls := e.list(); len(ls) != 1 || ls[0].State != "stopped" {
		t.Fatalf("ls after hutch was killed: %+v", ls)
	}
	e.ok("rm", id)
	e.assertClean(id)
}

// Setup commands that are not cached yet run before the command of
// run --rm; once cached, the command starts from their result.
func TestRunRmWithSetup(t *testing.T) {
	e := newEnv(t)
	for i, want := range []string{"ran", "hit"} {
		r := e.run(nil, "run", "--rm", "--image", "busybox", "--setup", "echo prepared > /prepared", "--",
			"sh", "-c", "cat /prepared")
		if r.code != 0 || r.stdout != "prepared\n" {
			t.Fatalf("run --rm --setup (%s, run %d): %s", want, i+1, r)
		}
	}
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("sandbox state left behind: %v", d)
	}
}

// A Ctrl-C that reaches hutch while the sandbox is still being made is not
// lost: the command gets it once it runs (runsc itself drops a SIGINT to a
// container not started yet).
func TestRunRmSignalBeforeStart(t *testing.T) {
	e := newEnv(t)
	c := e.cmd(nil, "run", "--rm", "--image", "busybox", "--", "sleep", "30")
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	// hutch handles signals from before it makes the sandbox's directory;
	// the sandbox starts tens of milliseconds after that.
	for deadline := time.Now().Add(30 * time.Second); len(e.sandboxDirs()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("hutch made no sandbox directory within 30s")
		}
	}
	c.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		if exitCode(err) != 130 {
			t.Fatalf("run --rm interrupted while starting: exit %d (%v), stderr %q; want 130", exitCode(err), err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a SIGINT sent while the sandbox was being made never reached the command")
	}
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("sandbox state left behind: %v", d)
	}
}

// A port published by run --rm is served by its command, the sandbox's
// init, and goes with it.
func TestRunRmPublishesPorts(t *testing.T) {
	e := newEnv(t)
	port := freePort(t)
	c, _, line := e.startFirstLine(t, "run", "--rm", "--image", "busybox", "-p", fmt.Sprintf("%d:80", port), "--", "sh", "-c",
		"mkdir /w && echo served by pid $$ > /w/index.html && echo ready && exec httpd -f -p 80 -h /w")
	if line != "ready\n" {
		t.Fatalf("first line %q", line)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/index.html", port)
	var body string
	var err error
	for i := 0; i < 100; i++ {
		if body, err = get(url); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || body != "served by pid 1\n" {
		t.Fatalf("GET %s through run --rm -p: %q, %v", url, body, err)
	}
	c.Process.Signal(syscall.SIGTERM)
	if err := c.Wait(); exitCode(err) != 128+int(syscall.SIGTERM) {
		t.Fatalf("httpd after SIGTERM to hutch: exit %d (%v), stderr %q", exitCode(err), err, runStderr(c))
	}
	if _, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		t.Fatalf("port %d still open after run --rm ended", port)
	}
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("sandbox state left behind: %v", d)
	}
}
