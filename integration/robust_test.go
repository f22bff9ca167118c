package integration

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// waitFor polls cond for up to 30 s: a bound for progress, not a timing
// assertion.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached within 30s")
}

// Twenty sandboxes created at once, each exec'd ten times, all removed:
// nothing of any of them remains.
func TestConcurrentSandboxes(t *testing.T) {
	e := newEnv(t)
	e.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	const n, execs = 20, 10
	ids := make([]string, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := e.run(nil, "create", "--image", "busybox", "--name", fmt.Sprintf("c%d", i))
			if r.code != 0 {
				errs <- fmt.Errorf("create %d: %s", i, r)
				return
			}
			ids[i] = strings.TrimSpace(r.stdout)
			for j := 0; j < execs; j++ {
				want := fmt.Sprintf("%d-%d", i, j)
				r := e.run(nil, "exec", ids[i], "--", "echo", want)
				if r.code != 0 || r.stdout != want+"\n" {
					errs <- fmt.Errorf("sandbox %d exec %d: %s", i, j, r)
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	ls := e.list()
	if len(ls) != n {
		t.Fatalf("ls shows %d sandboxes, want %d", len(ls), n)
	}

	// With 20 random hex IDs two must share a first character.
	first := map[byte]int{}
	for _, id := range ids {
		first[id[0]]++
	}
	for c, k := range first {
		if k > 1 {
			assertOneLineError(t, e.run(nil, "exec", string(c), "--", "true"), "ambiguous")
			break
		}
	}

	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			if r := e.run(nil, "rm", "-f", id); r.code != 0 {
				t.Errorf("rm -f %s: %s", id, r)
			}
		}(ids[i])
	}
	wg.Wait()
	for _, id := range ids {
		e.assertClean(id)
	}
	if ls := e.list(); len(ls) != 0 {
		t.Fatalf("after rm, ls shows %d sandboxes", len(ls))
	}
}

// Bad input: one line naming the problem, exit 125, nothing left behind.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	stopped := e.create()
	e.ok("stop", stopped)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown image", []string{"create", "--image", "nosuchimage"}, `"nosuchimage:latest" not found`},
		{"bad image name", []string{"create", "--image", "UPPER/../x"}, "UPPER/../x"},
		{"malformed memory", []string{"create", "--memory", "12q"}, "--memory"},
		{"malformed disk", []string{"run", "--disk", "lots", "--", "true"}, "--disk"},
		{"malformed cpus", []string{"create", "--cpus", "many"}, "--cpus"},
		{"unknown network", []string{"create", "--net", "bogus"}, "--net"},
		{"unknown flag", []string{"create", "--bogus"}, "bogus"},
		{"unknown ID", []string{"exec", "0123456789ab", "--", "true"}, "no such sandbox: 0123456789ab"},
		{"unknown ID rm", []string{"rm", "nosuch"}, "no such sandbox: nosuch"},
		{"path as ID", []string{"inspect", "../../etc"}, "../../etc"},
		{"exec into stopped", []string{"exec", stopped, "--", "true"}, "not running"},
		{"exec without command", []string{"exec", stopped}, "usage"},
		{"bad env", []string{"create", "--env", "NOEQUALS"}, "NOEQUALS"},
		{"runsc missing", []string{"--runsc", "/nonexistent/runsc", "run", "--", "true"}, "/nonexistent/runsc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.list()
			assertOneLineError(t, e.run(nil, tc.args...), tc.want)
			if after := e.list(); len(after) != len(before) {
				t.Fatalf("a failed command changed the sandbox list: %d -> %d", len(before), len(after))
			}
			tmp, _ := filepath.Glob(filepath.Join(e.root, "images", "rootfs", ".tmp*"))
			if len(tmp) > 0 {
				t.Fatalf("partial rootfs left: %v", tmp)
			}
		})
	}
	e.ok("rm", stopped)
	e.assertClean(stopped)

	// runsc missing from beside hutch and from $PATH too.
	lone := t.TempDir()
	copyFile(t, filepath.Join(e.bin, "hutch"), filepath.Join(lone, "hutch"))
	c := exec.Command(filepath.Join(lone, "hutch"), "run", "--", "true")
	c.Env = []string{"HUTCH_ROOT=" + e.root, "PATH=/nonexistent"}
	out, err := c.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 || !strings.Contains(string(out), "runsc not found") {
		t.Fatalf("hutch without runsc: %v: %s", err, out)
	}
}

// sandboxDirs lists the sandbox records under the env's root.
func (e *env) sandboxDirs() []string {
	e.waitRemovals()
	m, _ := filepath.Glob(filepath.Join(e.root, "sandboxes", "*"))
	return m
}

// A create that fails at any step leaves nothing behind.
func TestFailedCreateLeavesNothing(t *testing.T) {
	e := newEnv(t)
	realRunsc := filepath.Join(e.bin, "runsc")
	for _, tc := range []struct {
		name string
		// script is a runsc stand-in that fails one step, then behaves.
		script string
	}{
		// hutch creates and starts a sandbox with one `runsc run --detach`.
		{"runsc run killed while creating", `case " $* " in *" run "*)
  "$REAL" "$@" & p=$!; sleep 0.05; kill -9 $p; kill -9 $$;; esac
exec "$REAL" "$@"`},
		{"runsc run killed once the sandbox runs", `case " $* " in *" run "*)
  case " $* " in *" --detach "*) "$REAL" "$@"; kill -9 $$;; esac
  # run --rm: runsc run waits for the command; the sandbox boots in
  # well under 0.15 s on an idle machine, and the command runs 0.3 s.
  "$REAL" "$@" & p=$!; sleep 0.15; kill -9 $p; kill -9 $$;; esac
exec "$REAL" "$@"`},
		{"runsc run fails", `case " $* " in *" run "*) echo "run: injected failure" >&2; exit 1;; esac
exec "$REAL" "$@"`},
		// runsc killed once the sandbox runs, and runsc delete unable to
		// act on its state: the sandbox's processes and runsc's files
		// still go.
		{"runsc delete fails", `case " $* " in *" delete "*) echo "delete: cannot act on this state" >&2; exit 1;; esac
case " $* " in *" run "*)
  case " $* " in *" --detach "*) "$REAL" "$@"; kill -9 $$;; esac
  "$REAL" "$@" & p=$!; sleep 0.15; kill -9 $p; kill -9 $$;; esac
exec "$REAL" "$@"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			wrapper, calls := filepath.Join(dir, "runsc"), filepath.Join(dir, "calls")
			// The stand-in notes every call, so the test knows the ID of
			// the sandbox that failed and checks only what is its own.
			script := "#!/bin/sh\nREAL=" + realRunsc + "\necho \"$*\" >> " + calls + "\n" + tc.script + "\n"
			if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			r := e.run(nil, "--runsc", wrapper, "create", "--image", "busybox", "--name", "doomed")
			if r.code != 125 {
				t.Fatalf("create with a failing runsc should fail with 125: %s", r)
			}
			if strings.Contains(tc.script, "injected failure") && !strings.Contains(r.stderr, "injected failure") {
				t.Fatalf("runsc's own message should reach the user: %s", r)
			}
			assertFailedCleanly(t, e, createdID(t, calls))

			// run --rm runs `runsc run` attached, with the command as
			// the init: the same failures end it with 125 (before the
			// sandbox runs) or 137 (after), never the command's status.
			os.Remove(calls)
			r = e.run(nil, "--runsc", wrapper, "run", "--rm", "--image", "busybox", "--", "sh", "-c", "sleep 0.3; echo done")
			if (r.code != 125 && r.code != 137) || strings.Contains(r.stdout, "done") {
				t.Fatalf("run --rm with a failing runsc should fail with 125 or 137 before its command ends: %s", r)
			}
			if strings.Contains(tc.script, "injected failure") && (r.code != 125 || !strings.Contains(r.stderr, "injected failure")) {
				t.Fatalf("runsc's own message should reach the user, with 125: %s", r)
			}
			assertFailedCleanly(t, e, createdID(t, calls))
		})
	}
}

// assertFailedCleanly checks that the failed sandbox id left nothing.
func assertFailedCleanly(t *testing.T, e *env, id string) {
	t.Helper()
	waitFor(t, func() bool { return len(processesMentioning(id)) == 0 })
	sub := *e
	sub.t = t
	sub.assertClean(id)
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("sandbox state left behind: %v", d)
	}
}

// createdID is the container ID of the `runsc run` call logged in calls.
func createdID(t *testing.T, calls string) string {
	t.Helper()
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && slices.Contains(f, "run") {
			return f[len(f)-1]
		}
	}
	t.Fatalf("no runsc run call in:\n%s", b)
	return ""
}

// sandboxCgroups is the set of sandbox cgroup directories on the host, in
// any hierarchy (v1 controllers or v2).
func sandboxCgroups() map[string]bool {
	set := map[string]bool{}
	for _, pat := range []string{"/sys/fs/cgroup/*/hutch/*", "/sys/fs/cgroup/hutch/*"} {
		m, _ := filepath.Glob(pat)
		for _, d := range m {
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				set[d] = true
			}
		}
	}
	return set
}

// A full disk during create (the state root on a tiny tmpfs) fails
// cleanly, and the store still works once there is room again.
func TestFullDiskCreate(t *testing.T) {
	e := newEnv(t)
	e.root = filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(e.root, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", e.root).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		e.removeAll()
		exec.Command("umount", "-l", e.root).Run()
	})
	e.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	// Fill the disk but for a few KiB: the rootfs unpack cannot fit.
	filler := filepath.Join(e.root, "filler")
	exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=64k").Run()
	var st syscall.Statfs_t
	syscall.Statfs(e.root, &st)
	if free := st.Bavail * uint64(st.Bsize); free > 256<<10 {
		t.Fatalf("could not fill the tmpfs: %d bytes free", free)
	}
	for _, args := range [][]string{{"create", "--image", "busybox"}, {"run", "--rm", "--image", "busybox", "--", "true"}} {
		r := e.run(nil, args...)
		if r.code != 125 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Fatalf("%s on a full disk: want one error line and exit 125, got %s", args[0], r)
		}
	}
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("sandbox state left on a full disk: %v", d)
	}
	tmp, _ := filepath.Glob(filepath.Join(e.root, "images", "rootfs", ".tmp*"))
	chains, _ := filepath.Glob(filepath.Join(e.root, "images", "rootfs", "*"))
	if len(tmp) > 0 || len(chains) > 0 {
		t.Fatalf("partial rootfs left on a full disk: %v %v", tmp, chains)
	}
	if len(processesMentioning(e.root)) > 0 {
		t.Fatalf("processes left: %v", processesMentioning(e.root))
	}
	os.Remove(filler)
	id := e.create()
	if out := e.ok("exec", id, "--", "echo", "recovered"); out != "recovered\n" {
		t.Fatalf("after freeing space: %q", out)
	}
}

// `hutch run --rm ... | head -1`: the reader of the command's output goes
// first. If the command writes more, its writes fail and it ends, its
// sandbox is removed, and hutch then ends by SIGPIPE, as a pipeline's writer
// does. If it writes nothing more, nothing was lost: hutch exits with the
// command's status, as the command would in a pipeline
// (`sh -c 'echo y; sleep 1' | head -1` exits 0). `hutch exec` alike.
func TestRunRmBrokenPipe(t *testing.T) {
	e := newEnv(t)
	running := e.create()
	for _, c := range []struct {
		name, script   string
		stderr, socket bool
		// full: the reader goes once hutch's write waits for room in
		// its buffer. A socket's reader that goes with data unread
		// then fails that write with ECONNRESET, not EPIPE.
		full bool
		// lost: the command writes after the reader has gone.
		lost bool
	}{
		{"stdout", "yes", false, false, false, true},
		{"stderr", "yes >&2", true, false, false, true},
		// A socket is copied to, not spliced into (libuv gives a child
		// one for its stdio).
		{"stdout, a socket", "yes", false, true, false, true},
		{"stdout, a full socket", "yes", false, true, true, true},
		{"stdout, a full pipe", "yes", false, false, true, true},
		{"stdout, all read", "echo y; sleep 1", false, false, false, false},
		{"stderr, all read", "echo y >&2; sleep 1", true, false, false, false},
		{"stdout, a socket, all read", "echo y; sleep 1", false, true, false, false},
	} {
		for _, verb := range [][]string{{"run", "--rm", "--image", "busybox"}, {"exec", running}} {
			name := verb[0] + ", " + c.name
			cmd := e.cmd(nil, append(verb, "--", "sh", "-c", c.script)...)
			var out io.ReadCloser
			var err error
			switch {
			case c.socket:
				fds, serr := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
				if serr != nil {
					t.Fatal(serr)
				}
				theirs := os.NewFile(uintptr(fds[1]), "stdout")
				cmd.Stdout, out = theirs, os.NewFile(uintptr(fds[0]), "reader")
				defer theirs.Close()
			case c.stderr:
				out, err = cmd.StderrPipe()
			default:
				out, err = cmd.StdoutPipe()
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if c.socket {
				cmd.Stdout.(*os.File).Close()
			}
			buf := make([]byte, 2)
			if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "y\n" {
				t.Fatalf("%s: first output %q, %v", name, buf, err)
			}
			if c.full {
				// yes fills the buffer in far less.
				time.Sleep(500 * time.Millisecond)
			}
			out.Close()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("%s: hutch went on for 30 s after its output's reader had gone", name)
			}
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			switch {
			case !ok:
				t.Fatalf("%s: no wait status", name)
			case c.lost && (!ws.Signaled() || ws.Signal() != syscall.SIGPIPE):
				t.Errorf("%s: hutch ended with %v, want killed by SIGPIPE", name, cmd.ProcessState)
			case !c.lost && !ws.Exited():
				t.Errorf("%s: hutch ended with %v, want the command's exit status 0, no output having been lost", name, cmd.ProcessState)
			case !c.lost && ws.ExitStatus() != 0:
				t.Errorf("%s: hutch exited %d, want the command's status 0", name, ws.ExitStatus())
			}
		}
		if left := e.ok("ls", "-q"); strings.TrimSpace(left) != running {
			t.Fatalf("%s: sandboxes left after run --rm: %q", c.name, left)
		}
		if ents, err := os.ReadDir(filepath.Join(e.root, "sandboxes")); err != nil || len(ents) != 1 {
			t.Fatalf("%s: the state root holds %d sandbox directories (%v)", c.name, len(ents), err)
		}
	}
}
