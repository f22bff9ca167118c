package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The README's main job: a command runs inside gVisor and its output,
// separated by stream, and exit status come back.
func TestRunInGVisor(t *testing.T) {
	e := newEnv(t)
	r := e.run(nil, "run", "--rm", "--image", "busybox", "--", "sh", "-c", "uname -sr; echo to-stdout; echo to-stderr >&2; exit 3")
	if r.code != 3 {
		t.Fatalf("want the command's exit status 3, got %s", r)
	}
	if !strings.Contains(r.stdout, "gvisor") || !strings.Contains(r.stdout, "to-stdout\n") || strings.Contains(r.stdout, "to-stderr") {
		t.Fatalf("stdout should carry gVisor's uname and only stdout: %s", r)
	}
	if r.stderr != "to-stderr\n" {
		t.Fatalf("stderr should be exactly the command's stderr: %s", r)
	}
	if got := e.list(); len(got) != 0 {
		t.Fatalf("run --rm left sandboxes: %+v", got)
	}
}

func TestExecStatuses(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"ok", []string{"true"}, 0},
		{"own status", []string{"sh", "-c", "exit 42"}, 42},
		{"not found", []string{"no-such-command"}, 127},
		{"not found by path", []string{"/no/such/file"}, 127},
		{"not executable", []string{"/etc/passwd"}, 126},
		{"killed by signal", []string{"sh", "-c", "kill -9 $$"}, 137},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.run(nil, append([]string{"exec", id, "--"}, tc.args...)...)
			if r.code != tc.want {
				t.Fatalf("want exit %d, got %s", tc.want, r)
			}
		})
	}
}

func TestExecEnvWorkdirUser(t *testing.T) {
	e := newEnv(t)
	id := e.create("--env", "FROM_CREATE=c", "--workdir", "/tmp")
	out := e.ok("exec", "--env", "FROM_EXEC=x", id, "--", "sh", "-c", `echo "$FROM_CREATE $FROM_EXEC"; pwd; id -u; echo $HOME`)
	if out != "c x\n/tmp\n0\n/root\n" {
		t.Fatalf("create env + exec env, create workdir, root user: got %q", out)
	}
	out = e.ok("exec", "--workdir", "/home", "--user", "user", id, "--", "sh", "-c", `pwd; id -u; id -g; echo $HOME`)
	if out != "/home\n1000\n1000\n/home/user\n" {
		t.Fatalf("--workdir /home --user user: got %q", out)
	}
	out = e.ok("exec", "--user", "1234:5678", id, "--", "sh", "-c", `id -u; id -g`)
	if out != "1234\n5678\n" {
		t.Fatalf("--user 1234:5678: got %q", out)
	}
	// The sandbox's writes land in its own overlay, not in the shared
	// image rootfs.
	e.ok("exec", id, "--", "sh", "-c", "echo changed > /etc/motd-hutch")
	if _, err := os.Stat(filepath.Join(e.inspect(id).Rootfs, "etc", "motd-hutch")); err == nil {
		t.Fatal("a sandbox write reached the shared image rootfs")
	}
}

// Without -i the command gets no stdin; with it, stdin streams in both
// directions while the command runs.
func TestExecStdinStreams(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	r := e.run(strings.NewReader("ignored\n"), "exec", id, "--", "cat")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("without -i, cat must see an empty stdin: %s", r)
	}
	c := e.cmd(nil, "exec", "-i", id, "--", "sh", "-c", "echo first; read line; echo got:$line")
	stdin, _ := c.StdinPipe()
	stdout, _ := c.StdoutPipe()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first line: %q, %v", line, err)
	}
	// The command is still waiting for input: its first line streamed
	// out before it finished.
	fmt.Fprintln(stdin, "second")
	stdin.Close()
	rest, _ := io.ReadAll(rd)
	if err := c.Wait(); err != nil {
		t.Fatalf("exec -i: %v", err)
	}
	if string(rest) != "got:second\n" {
		t.Fatalf("reply to stdin: %q", rest)
	}
}

// A 1 GiB output streams through hutch in constant memory.
func TestExecLargeOutputConstantMemory(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	c := e.cmd(nil, "exec", id, "--", "head", "-c", "1073741824", "/dev/zero")
	stdout, _ := c.StdoutPipe()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// hutch's own peak resident memory (VmHWM), read until it exits: the
	// rusage of wait4 would also count a runsc child, which exec may
	// start when the control socket cannot serve it.
	peak := watchPeakMemory(c.Process.Pid)
	n, err := io.Copy(io.Discard, stdout)
	if err != nil {
		t.Fatal(err)
	}
	hwm := peak()
	if err := c.Wait(); err != nil {
		t.Fatalf("exec: %v", err)
	}
	if n != 1<<30 {
		t.Fatalf("got %d bytes, want %d", n, 1<<30)
	}
	if hwm == 0 {
		t.Fatal("could not read hutch's peak memory from /proc")
	}
	if hwm > 64<<20 {
		t.Fatalf("hutch used %d MiB of memory to stream 1 GiB; want constant memory (< 64 MiB)", hwm>>20)
	}
}

func TestExecTimeout(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	r := e.run(nil, "exec", "--timeout", "1s", id, "--", "sleep", "600")
	if r.code != 124 || !strings.Contains(r.stderr, "timed out") {
		t.Fatalf("want exit 124 and a message saying it timed out: %s", r)
	}
	ps := e.ok("exec", id, "--", "ps", "-o", "args")
	if strings.Contains(ps, "sleep 600") {
		t.Fatalf("the timed-out command still runs:\n%s", ps)
	}
}

// A signal to `hutch exec` reaches the command inside the sandbox, which
// decides what to do with it; its status is the command's.
func TestExecForwardsSignals(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	c, rd, line := e.startFirstLine(t, "exec", id, "--", "sh", "-c",
		`trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.1; done`)
	if line != "ready\n" {
		t.Fatalf("first line %q", line)
	}
	c.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(rd)
	err := c.Wait()
	code := exitCode(err)
	if string(rest) != "got TERM\n" || code != 7 {
		t.Fatalf("after SIGTERM to hutch exec: output %q, exit %d (%v); want the command's trap to run and exit 7", rest, code, err)
	}
	if ps := e.ok("exec", id, "--", "ps", "-o", "args"); strings.Contains(ps, "while") {
		t.Fatalf("the signalled command still runs:\n%s", ps)
	}
}

// State lives in files: every command is a new process, sandboxes run
// between them, and stop/rm work from any of them.
func TestLifecycleAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	id := e.create("--name", "keeper", "--label", "team=a")
	if got := e.inspect("keeper"); got.ID != id || got.State != "running" {
		t.Fatalf("inspect by name: %+v", got)
	}
	if got := e.inspect(id[:6]); got.ID != id {
		t.Fatalf("inspect by ID prefix: %+v", got)
	}
	e.ok("exec", "keeper", "--", "sh", "-c", "echo kept > /root/note")
	if out := e.ok("exec", id, "--", "cat", "/root/note"); out != "kept\n" {
		t.Fatalf("a file written by one exec is gone for the next: %q", out)
	}
	if r := e.run(nil, "create", "--image", "busybox", "--name", "keeper"); r.code != 125 || !strings.Contains(r.stderr, "keeper") {
		t.Fatalf("a second sandbox with the same name: %s", r)
	}
	if r := e.run(nil, "rm", id); r.code != 125 || !strings.Contains(r.stderr, "running") {
		t.Fatalf("rm of a running sandbox without -f must refuse: %s", r)
	}
	e.ok("stop", id)
	ls := e.list()
	if len(ls) != 1 || ls[0].State != "stopped" {
		t.Fatalf("after stop, ls: %+v", ls)
	}
	if left := processesMentioning(id); len(left) > 0 {
		t.Fatalf("stop left processes: %v", left)
	}
	r := e.run(nil, "exec", id, "--", "true")
	assertOneLineError(t, r, "not running")
	e.ok("rm", id)
	e.assertClean(id)
}

// A host reboot kills every process of a sandbox; hutch then reports it as
// stopped and rm cleans it up.
func TestSandboxDiesUnderneath(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	for _, p := range processesMentioning(id) {
		var pid int
		fmt.Sscanf(p, "process %d:", &pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	waitFor(t, func() bool { return len(processesMentioning(id)) == 0 })
	if got := e.inspect(id); got.State != "stopped" {
		t.Fatalf("after its processes died, state = %q, want stopped", got.State)
	}
	assertOneLineError(t, e.run(nil, "exec", id, "--", "true"), "not running")
	e.ok("rm", id)
	e.assertClean(id)
}
