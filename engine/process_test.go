package engine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// runscEngine opens an engine over the binaries in HUTCH_BIN with a running
// busybox sandbox, removed at the end of the test. It skips unless
// HUTCH_INTEGRATION=1 and HUTCH_BIN are set, and needs root.
func runscEngine(t *testing.T) (*Engine, string) {
	t.Helper()
	bin := os.Getenv("HUTCH_BIN")
	if os.Getenv("HUTCH_INTEGRATION") == "" || bin == "" {
		t.Skip("needs runsc: set HUTCH_INTEGRATION=1 and HUTCH_BIN to the built bin/ directory")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the runsc tests of the engine run as root")
	}
	e, err := Open(Options{
		Root:                t.TempDir(),
		RunscPath:           filepath.Join(bin, "runsc"),
		InitPath:            filepath.Join(bin, "hutch-init"),
		DefaultImageArchive: filepath.Join(bin, "images", "busybox.tar"),
		HutchPath:           filepath.Join(bin, "hutch"),
	})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := e.Create(context.Background(), CreateRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Remove(context.Background(), sb.ID, true); err != nil {
			t.Errorf("remove sandbox: %v", err)
		}
	})
	return e, sb.ID
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: not within 10s", what)
}

func TestStartRunsc(t *testing.T) {
	e, id := runscEngine(t)
	ctx := context.Background()

	t.Run("pid, output, status", func(t *testing.T) {
		var out syncBuffer
		p, err := e.Start(ctx, id, ExecRequest{Args: []string{"sh", "-c", "echo $$; exit 5"}, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		code, err := p.Wait()
		if code != 5 || err != nil {
			t.Fatalf("status %d, %v; want 5", code, err)
		}
		if got := strings.TrimSpace(out.String()); p.Pid() == 0 || got != strconv.Itoa(p.Pid()) {
			t.Fatalf("Pid() %d, the shell says its PID is %q", p.Pid(), got)
		}
		// Wait again: the same answer.
		if code, _ := p.Wait(); code != 5 {
			t.Fatalf("second Wait: %d", code)
		}
		if err := p.Signal(syscall.SIGTERM); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("signal after the end: %v, want not found", err)
		}
	})

	t.Run("not found", func(t *testing.T) {
		p, err := e.Start(ctx, id, ExecRequest{Args: []string{"no-such-command"}})
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != ExitNotFound || err != nil || p.Pid() != 0 {
			t.Fatalf("status %d, %v, pid %d; want 127 and no PID", code, err, p.Pid())
		}
	})

	t.Run("input and signal", func(t *testing.T) {
		r, w := io.Pipe()
		var out syncBuffer
		p, err := e.Start(ctx, id, ExecRequest{Args: []string{"sh", "-c", "read x; echo got $x; sleep 600"}, Stdin: r, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, "hello\n")
		waitFor(t, "the command reads its input", func() bool { return out.String() == "got hello\n" })
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); code != 128+int(syscall.SIGTERM) || err != nil {
			t.Fatalf("status %d, %v; want 143", code, err)
		}
		w.Close()
	})

	t.Run("context ends it", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		p, err := e.Start(cctx, id, ExecRequest{Args: []string{"sleep", "600"}})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Done():
			t.Fatal("ended before its context")
		case <-time.After(100 * time.Millisecond):
		}
		cancel()
		if code, err := p.Wait(); code != ExitTimeout || !errors.Is(err, ErrTimeout) {
			t.Fatalf("status %d, %v; want 124 and ErrTimeout", code, err)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		p, err := e.Start(ctx, id, ExecRequest{Args: []string{"sleep", "600"}, Timeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		code, err := p.Wait()
		if code != ExitTimeout || !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "after 200ms") {
			t.Fatalf("status %d, %v; want 124 after 200ms", code, err)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		r, w := io.Pipe()
		var out syncBuffer
		p, err := e.Start(ctx, id, ExecRequest{Args: []string{"sh"}, TTY: true, Size: WinSize{Rows: 20, Cols: 70}, Stdin: r, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if p.Pid() == 0 {
			t.Fatal("no PID for a command on a terminal")
		}
		if err := p.Resize(WinSize{Rows: 44, Cols: 132}); err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, "stty size\n")
		waitFor(t, "stty reports the new size", func() bool { return strings.Contains(out.String(), "44 132") })
		// SIGKILL cannot go through runsc exec: it reaches the shell.
		if err := p.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			p.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("SIGKILL did not end the command on a terminal")
		}
		if code, _ := p.Wait(); code != 128+int(syscall.SIGKILL) {
			t.Fatalf("status %d, want 137", code)
		}
		// The shell itself is gone, not only runsc exec.
		waitFor(t, "the shell leaves the sandbox", func() bool {
			ps, err := e.Processes(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range ps {
				if q.PID == p.Pid() {
					return false
				}
			}
			return true
		})
		if err := p.Resize(WinSize{Rows: 1, Cols: 1}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("resize after the end: %v", err)
		}
	})

	t.Run("resize without a terminal", func(t *testing.T) {
		p, err := e.Start(ctx, id, ExecRequest{Args: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Resize(WinSize{Rows: 1, Cols: 1}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("resize: %v, want failed precondition", err)
		}
		p.Wait()
	})

	t.Run("detach refused", func(t *testing.T) {
		if _, err := e.Start(ctx, id, ExecRequest{Args: []string{"true"}, Detach: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("start detached: %v", err)
		}
	})
}
