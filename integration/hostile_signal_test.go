package integration

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// interruptBound is how soon hutch must end after SIGTERM, whatever it was
// doing.
const interruptBound = 10 * time.Second

// noted is a hutch started with a runsc stand-in that notes every call, so
// that the test knows every sandbox it began.
type noted struct {
	c              *exec.Cmd
	calls          string
	stdout, stderr bytes.Buffer
	done           chan error
}

// startNoted starts hutch args with a runsc that notes its calls and runs
// the real one; before exec'ing it, the stand-in runs slow, a shell
// command given the call's arguments in "$*".
func (e *env) startNoted(t *testing.T, slow string, args ...string) *noted {
	t.Helper()
	dir := t.TempDir()
	n := &noted{calls: filepath.Join(dir, "calls"), done: make(chan error, 1)}
	wrapper := filepath.Join(dir, "runsc")
	script := "#!/bin/sh\necho \"$*\" >> " + n.calls + "\n" + slow + "\nexec " + filepath.Join(e.bin, "runsc") + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	n.c = e.cmd(nil, append([]string{"--runsc", wrapper}, args...)...)
	n.c.Stdout, n.c.Stderr = &n.stdout, &n.stderr
	if err := n.c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.done <- n.c.Wait() }()
	t.Cleanup(func() {
		n.c.Process.Kill()
		<-n.done
	})
	return n
}

// called reports whether runsc was called with sub (run, exec...).
func (n *noted) called(sub string) bool {
	b, _ := os.ReadFile(n.calls)
	for _, l := range strings.Split(string(b), "\n") {
		if slices.Contains(strings.Fields(l), sub) {
			return true
		}
	}
	return false
}

// await waits until cond holds, failing the test if hutch ends or 60 s
// pass first.
func (n *noted) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-n.done:
			n.done <- err
			t.Fatalf("hutch ended before %s: %v\nstdout %q\nstderr %q", what, err, n.stdout.String(), n.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 60s", what)
		}
	}
}

// terminate sends SIGTERM to hutch and returns its exit status once it has
// ended, failing the test if that takes longer than interruptBound.
func (n *noted) terminate(t *testing.T) int {
	t.Helper()
	n.c.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-n.done:
		n.done <- err
		if ee, ok := err.(*exec.ExitError); ok && !ee.Exited() {
			// Ended by the signal itself: nothing of hutch's ran.
			return -int(ee.Sys().(syscall.WaitStatus).Signal())
		}
		return exitCode(err)
	case <-time.After(interruptBound):
		t.Fatalf("hutch did not end within %s of SIGTERM\nstderr %q", interruptBound, n.stderr.String())
	}
	return 0
}

var sandboxIDRe = regexp.MustCompile(`\b[0-9a-f]{32}\b`)

// assertNothingLeft checks that no sandbox hutch began left anything on
// the host: process, mount, cgroup, network, runsc state, record, lease.
func (n *noted) assertNothingLeft(t *testing.T, e *env) {
	t.Helper()
	b, _ := os.ReadFile(n.calls)
	ids := sandboxIDRe.FindAllString(string(b), -1)
	for _, d := range e.sandboxDirs() {
		ids = append(ids, filepath.Base(d))
	}
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		assertFailedCleanly(t, e, id)
	}
	if all := e.list(); len(all) != 0 {
		t.Fatalf("sandboxes left after an interrupted hutch: %+v", all)
	}
}

// SIGTERM while a create's or run's setup command runs (sleep 30) ends
// hutch at once with 143 and removes the half-made sandbox.
func TestHostileSignalDuringSetup(t *testing.T) {
	e := newEnv(t)
	for _, args := range [][]string{
		{"create", "--image", "busybox", "--setup", "sleep 30"},
		{"run", "--rm", "--image", "busybox", "--setup", "sleep 30", "--", "true"},
		{"run", "--image", "busybox", "--setup", "sleep 30", "--", "true"},
	} {
		t.Run(strings.Join(args[:2], " "), func(t *testing.T) {
			n := e.startNoted(t, "", args...)
			n.await(t, "setup command", func() bool {
				dirs := e.sandboxDirs()
				if len(dirs) == 0 {
					return false
				}
				time.Sleep(100 * time.Millisecond)
				r := e.run(nil, "ps", filepath.Base(dirs[0]))
				return strings.Contains(r.stdout, "sleep")
			})
			if code := n.terminate(t); code != 128+int(syscall.SIGTERM) {
				t.Fatalf("hutch %s after SIGTERM: exit %d, stderr %q; want 143", strings.Join(args, " "), code, n.stderr.String())
			}
			if !strings.Contains(n.stderr.String(), "interrupted by SIGTERM") {
				t.Fatalf("stderr %q does not say why hutch ended", n.stderr.String())
			}
			n.assertNothingLeft(t, e)
		})
	}
}

// SIGTERM to run --rm right after it started a sandbox whose command has
// not started yet (runsc is slow to start it: 15 s here, forever for an
// image whose start blocks) ends hutch at once with 143, not once the
// command runs, and removes the sandbox.
func TestHostileSignalBeforeCommandStarts(t *testing.T) {
	e := newEnv(t)
	// Only the attached runsc run: the one that starts the command.
	slow := `case " $* " in *" --detach "*) ;; *" run "*) sleep 15;; esac`
	n := e.startNoted(t, slow, "run", "--rm", "--image", "busybox", "--", "sleep", "30")
	n.await(t, "runsc run", func() bool { return n.called("run") })
	if code := n.terminate(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("hutch run --rm after SIGTERM: exit %d, stderr %q; want 143", code, n.stderr.String())
	}
	n.assertNothingLeft(t, e)
}

// SIGTERM at random moments of a create or run --rm with a network and a
// published port (image, rootfs, cgroup, netns and nftables, runsc,
// forwarder) ends hutch within the bound: either the sandbox was made
// before the signal (create printed its ID) or nothing of it is left.
func TestHostileSignalDuringCreate(t *testing.T) {
	e := newEnv(t)
	interrupted := 0
	for i := 0; i < 12; i++ {
		delay := time.Duration(rand.IntN(300)) * time.Millisecond
		args := []string{"create", "--image", "busybox", "--net", "open", "-p", "0:80"}
		if i%2 == 1 {
			args = []string{"run", "--rm", "--image", "busybox", "--net", "open", "-p", "0:80", "--", "sleep", "30"}
		}
		n := e.startNoted(t, "", args...)
		time.Sleep(delay)
		code := n.terminate(t)
		t.Logf("%s, SIGTERM after %s: exit %d", args[0], delay, code)
		switch {
		case code == 0 && args[0] == "create":
			// Made before the signal: an ordinary sandbox.
			id := strings.TrimSpace(n.stdout.String())
			if !sandboxIDRe.MatchString(id) {
				t.Fatalf("create exited 0 without an ID: %q", n.stdout.String())
			}
			e.ok("rm", "-f", id)
		case code == -int(syscall.SIGTERM):
			// Before hutch handles signals: it made nothing.
		case code == 128+int(syscall.SIGTERM):
			interrupted++
		default:
			t.Fatalf("hutch %s after SIGTERM at %s: exit %d, stderr %q", args[0], delay, code, n.stderr.String())
		}
		n.assertNothingLeft(t, e)
	}
	if interrupted == 0 {
		t.Fatal("no SIGTERM came while hutch was making a sandbox")
	}
}
