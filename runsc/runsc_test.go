package runsc

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// testRunsc returns a wrapper over the built runsc with a fresh state
// directory. Under `make test` (HUTCH_INTEGRATION=1) a missing runsc or
// missing root fails the test rather than skipping it.
func testRunsc(t *testing.T) *Runsc {
	t.Helper()
	if os.Getenv("HUTCH_INTEGRATION") == "" {
		t.Skip("needs runsc: run through `make test` (HUTCH_INTEGRATION=1)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("needs root")
	}
	bin := os.Getenv("HUTCH_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../bin")
	}
	path := filepath.Join(bin, "runsc")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("runsc not built: %v", err)
	}
	dir := t.TempDir()
	return &Runsc{
		Path: path, Root: filepath.Join(dir, "state"), Network: "none", GoferNetNS: "new",
		Overlay: "root:dir=" + dir + ",size=64m",
	}
}

// busyboxBundle writes a bundle whose rootfs is Debian's busybox-static
// and whose init runs script.
func busyboxBundle(t *testing.T, script string) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox-static not installed: %v", err)
	}
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"bin", "tmp", "proc", "dev", "sys", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "cat", "echo", "sleep", "true", "mv"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	s := Spec(SpecConfig{
		Rootfs:   rootfs,
		Hostname: "t",
		Process: specs.Process{
			Args: []string{"/bin/sh", "-c", script},
			Env:  []string{"PATH=/bin"},
			Cwd:  "/",
		},
	})
	if err := WriteBundle(bundle, s); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(bundle, "config.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config.json must be private: %v %v", fi.Mode(), err)
	}
	return bundle
}

func startSandbox(t *testing.T, r *Runsc, id, bundle string) {
	t.Helper()
	ctx := context.Background()
	if err := r.Create(ctx, id, bundle, CreateOpts{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { r.Delete(context.Background(), id, true) })
	if err := r.Start(ctx, id); err != nil {
		t.Fatalf("start: %v", err)
	}
}

func execOut(t *testing.T, r *Runsc, id string, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	p, err := r.Exec(context.Background(), id, specs.Process{Args: args, Env: []string{"PATH=/bin"}, Cwd: "/"}, ExecOpts{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("exec %v: status %d, %v: %s", args, code, err, errb.String())
	}
	return out.String()
}

// counterScript counts in /count, ten times a second, from init, replacing
// the file whole so that a reader never sees it half written. Not in /tmp:
// gVisor mounts a tmpfs there, outside the overlay's upper layer.
const counterScript = `i=0; while true; do i=$((i+1)); echo $i > /count.new; mv /count.new /count; sleep 0.1; done`

func readCount(t *testing.T, r *Runsc, id string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(execOut(t, r, id, "sh", "-c", "cat /count 2>/dev/null || echo 0")))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitCountAbove polls until the counter passes n (bounded, not timed).
func waitCountAbove(t *testing.T, r *Runsc, id string, n int) int {
	t.Helper()
	for i := 0; i < 300; i++ {
		if c := readCount(t, r, id); c > n {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("counter never passed %d", n)
	return 0
}

func TestLifecycle(t *testing.T) {
	r := testRunsc(t)
	ctx := context.Background()
	bundle := busyboxBundle(t, counterScript)
	const id = "lifecycle"
	if r.Exists(id) {
		t.Fatal("Exists before create")
	}
	startSandbox(t, r, id, bundle)
	st, err := r.State(ctx, id)
	if err != nil || st.Status != StatusRunning || st.Pid == 0 {
		t.Fatalf("state: %+v %v", st, err)
	}
	waitCountAbove(t, r, id, 0)

	ps, err := r.Ps(ctx, id)
	if err != nil || len(ps) < 2 || ps[0].PID != 1 || ps[0].Cmd != "sh" {
		t.Fatalf("ps: %+v %v", ps, err)
	}

	// Output streams through pipes even when the caller hands a regular
	// file: runsc must never write to it directly.
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.Exec(ctx, id, specs.Process{Args: []string{"sh", "-c", "echo one; echo two >&2; echo three"}, Env: []string{"PATH=/bin"}, Cwd: "/"}, ExecOpts{Stdout: f, Stderr: f})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("exec: %d %v", code, err)
	}
	b, _ := os.ReadFile(f.Name())
	if got := string(b); strings.Count(got, "\n") != 3 || !strings.Contains(got, "one\n") || !strings.Contains(got, "three\n") {
		t.Fatalf("output to a regular file was garbled: %q", got)
	}

	// A command that cannot start is told apart from one that ran.
	p, err = r.Exec(ctx, id, specs.Process{Args: []string{"/no/such"}, Env: []string{"PATH=/bin"}, Cwd: "/"}, ExecOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("exec of a missing file: %v, want ErrNotStarted", err)
	}

	// Cancelling the context kills the process inside the sandbox.
	cctx, cancel := context.WithCancel(ctx)
	p, err = r.Exec(cctx, id, specs.Process{Args: []string{"sleep", "600"}, Env: []string{"PATH=/bin"}, Cwd: "/"}, ExecOpts{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if _, err := p.Pid(); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if code, _ := p.Wait(); code != 128+int(syscall.SIGKILL) || !p.TimedOut() {
		t.Fatalf("cancelled exec: status %d, timed out %v", code, p.TimedOut())
	}

	// The sandbox exits with its init, so wait must be under way first.
	type waited struct {
		ws  WaitStatus
		err error
	}
	done := make(chan waited, 1)
	go func() {
		ws, err := r.Wait(ctx, id, 0)
		done <- waited{ws, err}
	}()
	time.Sleep(100 * time.Millisecond) // let runsc wait connect; a late one fails below, never passes wrongly
	if err := r.Kill(ctx, id, syscall.SIGKILL, KillOpts{}); err != nil {
		t.Fatal(err)
	}
	if w := <-done; w.err != nil || w.ws.ExitStatus != 128+int(syscall.SIGKILL) {
		t.Fatalf("wait: %+v %v", w.ws, w.err)
	}
	if err := r.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if r.Exists(id) {
		t.Fatal("Exists after delete")
	}
	if err := r.Delete(ctx, id, false); err != nil {
		t.Fatalf("deleting a deleted container must succeed: %v", err)
	}
}

// The sandbox's writes come out as a tar of gVisor's overlay upper layer,
// and a checkpoint restores into a new sandbox whose init keeps counting.
func TestTarCheckpointRestore(t *testing.T) {
	r := testRunsc(t)
	ctx := context.Background()
	bundle := busyboxBundle(t, counterScript)
	startSandbox(t, r, "ckpt", bundle)
	before := waitCountAbove(t, r, "ckpt", 2)

	upper := filepath.Join(t.TempDir(), "upper.tar")
	if err := r.TarRootfsUpper(ctx, "ckpt", upper); err != nil {
		t.Fatal(err)
	}
	if !tarHas(t, upper, "count") {
		t.Fatal("rootfs-upper tar lacks the file the sandbox wrote")
	}

	img := t.TempDir()
	if err := r.Checkpoint(ctx, "ckpt", img, CheckpointOpts{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, "ckpt", true); err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(ctx, "restored", bundle, img, RestoreOpts{Detach: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Delete(context.Background(), "restored", true) })
	after := readCount(t, r, "restored")
	if after < before {
		t.Fatalf("restored counter %d is behind the checkpointed %d", after, before)
	}
	waitCountAbove(t, r, "restored", after)
}

func tarHas(t *testing.T, file, name string) bool {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimPrefix(h.Name, "/") == name || strings.TrimPrefix(h.Name, "./") == name {
			return true
		}
	}
}

func TestMissingBinary(t *testing.T) {
	r := &Runsc{Path: "/nonexistent/runsc", Root: t.TempDir()}
	err := r.Start(context.Background(), "x")
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/runsc") {
		t.Fatalf("want an error naming the missing binary, got %v", err)
	}
}

func TestRunscEnvKeepsOnlyWhatRunscReads(t *testing.T) {
	env := runscEnv([]string{"PATH=/bin", "AWS_SECRET_ACCESS_KEY=s3cret", "USER=root", "HUTCH_TOKEN=x", "XDG_RUNTIME_DIR=/run/user/0"})
	want := []string{"PATH=/bin", "USER=root", "XDG_RUNTIME_DIR=/run/user/0"}
	if !slices.Equal(env, want) {
		t.Errorf("runscEnv = %q, want %q", env, want)
	}
	if env := runscEnv([]string{"TOKEN=x"}); len(env) != 1 || !strings.HasPrefix(env[0], "PATH=") {
		t.Errorf("runscEnv without PATH = %q, want only a default PATH", env)
	}
}

// What runsc printed is cut to the line that says what failed.
func TestErrorMessage(t *testing.T) {
	for _, tc := range []struct{ stderr, want string }{
		{"sandbox is not running\n", "runsc kill: sandbox is not running"},
		{"I1201 08:44:02.000000   1 main.go:1] starting\nloading container: file does not exist\n", "runsc kill: loading container: file does not exist"},
		{"checkpoint failed: checkpointing container \"c\": encoding error: type \"waiter.ChannelNotifier\" is not known:\n" +
			"goroutine 190 [running]:\ngvisor.dev/gvisor/pkg/state.safely.func1()\n\tgvisor.dev/gvisor/pkg/state/state.go:309 +0x19e\n" +
			"gvisor.dev/gvisor/pkg/urpc.(*Server).handleOne(...)\n\tgvisor.dev/gvisor/pkg/urpc/urpc.go:472 +0x6b\n",
			"runsc kill: checkpoint failed: checkpointing container \"c\": encoding error: type \"waiter.ChannelNotifier\" is not known"},
	} {
		e := &Error{Sub: "kill", Status: 1, Stderr: tc.stderr, Err: errors.New("exit status 1")}
		if got := e.Error(); got != tc.want {
			t.Errorf("stderr %q: got %q, want %q", tc.stderr, got, tc.want)
		}
	}
}
