// Package integration runs hutch end to end: the built binaries against real
// runsc, as root and as an unprivileged user.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hutch.dev/hutch/assembly/hostnet"
)

// requiresRoot fails the test when the suite runs under `make test`
// (HUTCH_INTEGRATION=1) without root, and skips it otherwise: a skip must
// never stand in for a pass in CI.
func requiresRoot(t *testing.T) {
	t.Helper()
	if os.Getenv("HUTCH_INTEGRATION") == "" {
		t.Skip("integration test: run through `make test` (HUTCH_INTEGRATION=1)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("integration tests need root (they also create an unprivileged user for the rootless cases)")
	}
}

// binDir holds the built hutch, hutch-init, runsc and images/.
func binDir(t *testing.T) string {
	t.Helper()
	d := os.Getenv("HUTCH_BIN")
	if d == "" {
		d, _ = filepath.Abs("../bin")
	}
	if _, err := os.Stat(filepath.Join(d, "hutch")); err != nil {
		t.Fatalf("hutch binary not built in %s (run `make build`): %v", d, err)
	}
	return d
}

// result is one finished hutch invocation.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout: %q\nstderr: %q", r.code, r.stdout, r.stderr)
}

// env is one test's hutch: its binaries, its own state root, and the user it
// runs as (nil: root).
type env struct {
	t     *testing.T
	bin   string
	root  string
	cred  *syscall.Credential
	extra []string
}

// newEnv gives a root test its own state root, removed (with every sandbox
// in it) at the end of the test.
func newEnv(t *testing.T) *env {
	requiresRoot(t)
	e := &env{t: t, bin: binDir(t), root: t.TempDir()}
	t.Cleanup(e.removeAll)
	return e
}

func (e *env) removeAll() {
	out := e.run(nil, "ls", "-q")
	for _, id := range strings.Fields(out.stdout) {
		e.run(nil, "rm", "-f", id)
	}
	e.stopBuilder()
}

// builderPid is the PID of the buildkitd supervisor hutch started for the
// env's root, or 0.
func (e *env) builderPid() int {
	b, err := os.ReadFile(filepath.Join(e.root, "buildkit", "supervisor.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// stopBuilder stops the env's buildkitd, if hutch started one, and waits
// until nothing of it runs: no daemon outlives its test.
func (e *env) stopBuilder() {
	if pid := e.builderPid(); pid > 0 {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	dir := filepath.Join(e.root, "buildkit")
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if len(processesMentioning(dir)) == 0 {
			return
		}
	}
	e.t.Errorf("buildkitd of %s still runs:\n%s", dir, strings.Join(processesMentioning(dir), "\n"))
}

func (e *env) cmd(stdin io.Reader, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(e.bin, "hutch"), args...)
	c.Env = append(os.Environ(), "HUTCH_ROOT="+e.root)
	c.Env = append(c.Env, e.extra...)
	c.Stdin = stdin
	if e.cred != nil {
		c.SysProcAttr = &syscall.SysProcAttr{Credential: e.cred}
	}
	return c
}

// run runs hutch to completion.
func (e *env) run(stdin io.Reader, args ...string) result {
	e.t.Helper()
	c := e.cmd(stdin, args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("hutch %v: %v", args, err)
	}
	return r
}

// ok runs hutch and fails the test unless it exits 0.
func (e *env) ok(args ...string) string {
	e.t.Helper()
	r := e.run(nil, args...)
	if r.code != 0 {
		e.t.Fatalf("hutch %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

// create makes a sandbox on the busybox test image (unless args name
// another) and returns its ID. Tests of the default image pass --image base.
func (e *env) create(args ...string) string {
	e.t.Helper()
	for _, a := range args {
		if a == "--image" {
			return strings.TrimSpace(e.ok(append([]string{"create"}, args...)...))
		}
	}
	return strings.TrimSpace(e.ok(append([]string{"create", "--image", "busybox"}, args...)...))
}

// sandboxRecord is the part of `hutch inspect` the tests read.
type sandboxRecord struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	State  string `json:"state"`
	Pid    int    `json:"pid"`
	Rootfs string `json:"rootfs"`
	IP     string `json:"ip"`
}

func (e *env) inspect(id string) sandboxRecord {
	e.t.Helper()
	var sb sandboxRecord
	e.inspectInto(id, &sb)
	return sb
}

// inspectInto decodes `hutch inspect id` into v, the fields a test reads.
func (e *env) inspectInto(id string, v any) {
	e.t.Helper()
	if err := json.Unmarshal([]byte(e.ok("inspect", "--format", "debug", id)), v); err != nil {
		e.t.Fatalf("inspect %s: %v", id, err)
	}
}

func (e *env) list() []sandboxRecord {
	e.t.Helper()
	var all []sandboxRecord
	if err := json.Unmarshal([]byte(e.ok("ls", "--format", "json")), &all); err != nil {
		e.t.Fatalf("ls --format json: %v", err)
	}
	return all
}

// leftovers lists what sandbox id left on the host: processes, mounts,
// cgroups, state. Empty means clean.
func (e *env) leftovers(id string) []string {
	e.waitRemovals()
	var left []string
	left = append(left, processesMentioning(id)...)
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mounts), "\n") {
		if strings.Contains(l, id) {
			left = append(left, "mount: "+l)
		}
	}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/hutch/" + id)
	cg2, _ := filepath.Glob("/sys/fs/cgroup/hutch/" + id)
	for _, c := range append(cg, cg2...) {
		left = append(left, "cgroup: "+c)
	}
	for _, p := range []string{
		filepath.Join(e.root, "sandboxes", id),
		filepath.Join(e.root, "images", "leases", id),
	} {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, "state: "+p)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(e.root, "runsc", id+"*")); len(m) > 0 {
		left = append(left, "runsc state: "+strings.Join(m, " "))
	}
	if e.cred == nil {
		left = append(left, hostnet.Leftovers(context.Background(), id)...)
	}
	return left
}

// waitRemovals waits (at most 10 s) until no detached hutch of the
// test's state root is finishing a removal `hutch run --rm` began: the
// run returns with the command's status, before its sandbox's teardown
// has ended.
func (e *env) waitRemovals() {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		busy := e.removalsPending()
		for _, p := range processesMentioning(e.root) {
			busy = busy || strings.Contains(p, " __remove ")
		}
		if !busy {
			return
		}
	}
}

// removalsPending reports whether a sandbox directory of the state root
// holds a removal's record (removing.json).
func (e *env) removalsPending() bool {
	m, _ := filepath.Glob(filepath.Join(e.root, "sandboxes", "*", "removing.json"))
	return len(m) > 0
}

// processesMentioning lists host processes whose command line has s.
func processesMentioning(s string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	self := strconv.Itoa(os.Getpid())
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(s)) {
			continue
		}
		pid := filepath.Base(filepath.Dir(p))
		if pid == self {
			continue
		}
		out = append(out, "process "+pid+": "+strings.ReplaceAll(string(b), "\x00", " "))
	}
	return out
}

func (e *env) assertClean(id string) {
	e.t.Helper()
	if left := e.leftovers(id); len(left) > 0 {
		e.t.Fatalf("sandbox %s left behind:\n%s", id, strings.Join(left, "\n"))
	}
}

// assertOneLineError checks a bad-input failure: exit 125 and one line on
// stderr naming want.
func assertOneLineError(t *testing.T, r result, want string) {
	t.Helper()
	if r.code != 125 {
		t.Fatalf("want exit 125, got %s", r)
	}
	msg := strings.TrimSuffix(r.stderr, "\n")
	if msg == "" || strings.Contains(msg, "\n") {
		t.Fatalf("want one line on stderr, got %q", r.stderr)
	}
	if !strings.Contains(msg, want) {
		t.Fatalf("stderr %q does not name %q", msg, want)
	}
}

// rootlessUser returns the unprivileged test user, creating it if needed.
func rootlessUser(t *testing.T) *user.User {
	t.Helper()
	return testUser(t, "hutchtest")
}

// testUser is the unprivileged user name, created if needed.
func testUser(t *testing.T, name string) *user.User {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		if out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
			t.Fatalf("useradd %s: %v: %s", name, err, out)
		}
		if u, err = user.Lookup(name); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// newRootlessEnv runs hutch as the unprivileged test user, with the binaries
// copied where that user can read them and XDG_DATA_HOME in a fresh
// directory it owns.
func newRootlessEnv(t *testing.T) *env {
	requiresRoot(t)
	return userEnv(t, rootlessUser(t), "")
}

// userEnv runs hutch as user u with the binaries in bin ("": copies of the
// test's, where u can read them) and XDG_DATA_HOME in a fresh directory
// u owns.
func userEnv(t *testing.T, u *user.User, bin string) *env {
	t.Helper()
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	base, err := os.MkdirTemp("", "hutch-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if bin == "" {
		bin = filepath.Join(base, "bin")
		src := binDir(t)
		for _, f := range []string{"hutch", "hutch-init", "runsc", "images/busybox.tar"} {
			copyFile(t, filepath.Join(src, f), filepath.Join(bin, f))
		}
	}
	data := filepath.Join(base, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, uid, gid); err != nil {
		t.Fatal(err)
	}
	e := &env{
		t: t, bin: bin, root: filepath.Join(data, "hutch"),
		cred:  &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
		extra: []string{"HOME=" + u.HomeDir, "XDG_DATA_HOME=" + data, "USER=" + u.Username, "TMPDIR=" + data},
	}
	t.Cleanup(e.removeAll)
	return e
}

// withDefaultRoot makes hutch choose its own root (no HUTCH_ROOT).
func (e *env) withDefaultRoot() *env {
	c := *e
	c.extra = append(append([]string{}, e.extra...), "HUTCH_ROOT=")
	return &c
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	fi, _ := in.Stat()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm()|0o444)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
}

// processAlive reports whether pid is a live process (not a zombie).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

func init() {
	// No test here may reach a registry off this machine: an image name
	// missing from a test's store fails at once instead of being looked
	// up on Docker Hub. The registry tests ask for --pull themselves.
	os.Setenv("HUTCH_PULL", "never")
}
