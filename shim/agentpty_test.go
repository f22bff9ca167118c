package shim

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/agent/ptywire"
)

// The relay turns containerd's stdin into data frames and resizes into
// resize frames (rows first), and the end of stdin does not end the
// frames: only Close does.
func TestAgentRelay(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "stdin")
	if err := syscall.Mkfifo(in, 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(in, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	tty, err := newAgentTTY(context.Background(), stdio{Stdin: in, Stdout: filepath.Join(dir, "stdout"), Terminal: true})
	if err != nil {
		t.Fatal(err)
	}
	frames := make(chan ptywire.Frame, 16)
	go func() {
		defer close(frames)
		r := ptywire.NewReader(tty.agent.pr)
		for {
			f, err := r.Next()
			if err != nil {
				return
			}
			f.Data = append([]byte(nil), f.Data...)
			frames <- f
		}
	}()
	next := func() (ptywire.Frame, bool) {
		select {
		case f, ok := <-frames:
			return f, ok
		case <-time.After(10 * time.Second):
			t.Fatal("no frame")
		}
		return ptywire.Frame{}, false
	}

	if _, err := w.Write([]byte("ls\r\x03")); err != nil {
		t.Fatal(err)
	}
	if f, _ := next(); f.Kind != ptywire.KindData || string(f.Data) != "ls\r\x03" {
		t.Fatalf("typed input: got %+v", f)
	}
	if err := tty.Resize(132, 45); err != nil {
		t.Fatal(err)
	}
	if f, _ := next(); f.Kind != ptywire.KindResize || f.Rows != 45 || f.Cols != 132 {
		t.Fatalf("resize 132x45: got %+v", f)
	}
	if err := tty.Resize(1<<16, 1); err == nil {
		t.Fatal("a width beyond 65535 was taken")
	}
	if err := tty.agent.signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if f, _ := next(); f.Kind != ptywire.KindSignal || f.Signal != int(syscall.SIGINT) {
		t.Fatalf("signal: got %+v", f)
	}

	// stdin ends: the frames go on.
	w.Close()
	tty.CloseStdin()
	if err := tty.Resize(80, 24); err != nil {
		t.Fatal(err)
	}
	if f, _ := next(); f.Kind != ptywire.KindResize || f.Rows != 24 {
		t.Fatalf("resize after stdin's end: got %+v", f)
	}

	tty.Drain(time.Second)
	if f, ok := next(); ok {
		t.Fatalf("frame after close: %+v", f)
	}
	if err := tty.Resize(80, 24); err != nil {
		t.Fatalf("resize after the process ended: %v", err)
	}
	if err := tty.agent.signal(syscall.SIGINT); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("signal after close: got %v, want io.ErrClosedPipe", err)
	}
}

func TestAgentPtyProcess(t *testing.T) {
	p := agentPtyProcess(specs.Process{Terminal: true, Args: []string{"sh", "-l"}, Env: []string{"PATH=/bin"}})
	if want := []string{"/.hutch/hutch-init", "pty", "--", "sh", "-l"}; !slices.Equal(p.Args, want) {
		t.Errorf("args: got %q, want %q", p.Args, want)
	}
	if p.Terminal || !slices.Contains(p.Env, "TERM=xterm") {
		t.Errorf("want a plain exec with TERM=xterm, got terminal %v env %q", p.Terminal, p.Env)
	}
	p = agentPtyProcess(specs.Process{Terminal: true, Args: []string{"sh"}, Env: []string{"TERM=vt100"},
		ConsoleSize: &specs.Box{Height: 30, Width: 100}})
	if want := []string{"/.hutch/hutch-init", "pty", "--size", "30x100", "--", "sh"}; !slices.Equal(p.Args, want) {
		t.Errorf("args with a console size: got %q, want %q", p.Args, want)
	}
	if !slices.Equal(p.Env, []string{"TERM=vt100"}) || p.ConsoleSize != nil {
		t.Errorf("want the process's own TERM and no console size, got env %q size %v", p.Env, p.ConsoleSize)
	}
}
