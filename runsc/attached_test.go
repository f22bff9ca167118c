package runsc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// runAttached runs bundle's init attached with stdin and returns its
// status, error, stdout and stderr, and the PID runsc wrote.
func runAttached(t *testing.T, r *Runsc, id, bundle, stdin string) (int, error, string, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	var in io.Reader
	if stdin != "" {
		in = strings.NewReader(stdin)
	}
	p, err := NewPipes(in, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	pidFile := filepath.Join(t.TempDir(), "pid")
	a, err := r.RunAttached(context.Background(), id, bundle, AttachedOpts{PidFile: pidFile, Stdio: p.Child})
	p.CloseChild()
	if err != nil {
		p.Close()
		t.Fatalf("run attached: %v", err)
	}
	code, werr := a.Wait()
	p.Finish(5 * time.Second)
	pid, _ := os.ReadFile(pidFile)
	return code, werr, out.String(), errb.String(), string(pid)
}

// The init's status, stdio and signals come back through runsc run; runsc's
// own failure is told apart from a command that exits 128; the container
// is gone afterwards.
func TestRunAttached(t *testing.T) {
	r := testRunsc(t)
	code, err, out, errOut, pid := runAttached(t, r, "att1",
		busyboxBundle(t, "echo out; echo err >&2; cat; exit 7"), "from stdin\n")
	if code != 7 || err != nil || out != "out\nfrom stdin\n" || errOut != "err\n" {
		t.Fatalf("attached run: status %d, %v, stdout %q, stderr %q", code, err, out, errOut)
	}
	if pid == "" {
		t.Fatal("no PID written to the pid file")
	}
	if r.Exists("att1") {
		t.Fatal("runsc run left the container's state behind")
	}
	for script, want := range map[string]int{"exit 128": 128, "kill -TERM $$": 143, "kill -KILL $$": 137, "true": 0} {
		if code, err, _, errOut, _ := runAttached(t, r, "att2", busyboxBundle(t, script), ""); code != want || err != nil {
			t.Errorf("%q: want %d, got %d, %v (stderr %q)", script, want, code, err, errOut)
		}
	}

	bundle := busyboxBundle(t, "")
	var s specs.Spec
	b, _ := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	s.Process.Args = []string{"/no/such/file"}
	if err := WriteBundle(bundle, &s); err != nil {
		t.Fatal(err)
	}
	code, err, out, errOut, _ = runAttached(t, r, "att3", bundle, "")
	var re *Error
	if !errors.As(err, &re) || !strings.Contains(re.Stderr, "failed to load /no/such/file: no such file or directory") {
		t.Fatalf("attached run of a missing file: status %d, error %v", code, err)
	}
	if out != "" || errOut != "" {
		t.Fatalf("runsc's error reached the command's stdio: stdout %q, stderr %q", out, errOut)
	}
	if r.Exists("att3") {
		t.Fatal("a failed runsc run left the container's state behind")
	}
}

// A signal for a container that is created but not started reaches its
// init once it starts, where runsc kill alone would drop it.
func TestAttachedSignalWaitsForStart(t *testing.T) {
	r := testRunsc(t)
	ctx := context.Background()
	const id = "sigwait"
	if err := r.Create(ctx, id, busyboxBundle(t, "exec sleep 30"), CreateOpts{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { r.Delete(context.Background(), id, true) })
	a := &Attached{r: r, id: id, done: make(chan struct{})}
	sent := make(chan error, 1)
	go func() { sent <- a.Signal(ctx, syscall.SIGINT) }()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-sent:
		t.Fatalf("the signal went to a container that was not started (%v)", err)
	default:
	}
	if err := r.Start(ctx, id); err != nil {
		t.Fatalf("start: %v", err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("signal: %v", err)
	}
	// SIGINT ends the init (sleep as PID 1: gVisor does not
	// shield PID 1), which stops the container.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := r.State(ctx, id)
		if err != nil || st.Status == "stopped" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the init still runs 10s after SIGINT (state %q)", st.Status)
		}
	}
}
