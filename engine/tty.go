package engine

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/agent/ptywire"
	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/runsc"
)

// WinSize is a terminal's size in character cells.
type WinSize = runsc.WinSize

// ShellCommand is the command of an interactive shell in a sandbox: the
// image's /bin/bash if it has one, else /bin/sh, as a login shell. Run it
// with ExecRequest.TTY.
var ShellCommand = []string{wire.MountPath, wire.ModeShell}

// A command with a terminal runs on a pty of the sandbox's own devpts:
// the sandbox's agent ("hutch-init pty", a plain exec with the command's
// user, environment and directory) opens /dev/ptmx, starts the command
// as the leader of a session on the pty's replica, and relays. Its stdout
// is the terminal's output; its stdin carries ptywire frames: what is
// typed, size changes and signals. Its exit status is the command's. See
// docs/decisions/0015-sandbox-terminals.md.

// ptyProcess makes proc run its command through the agent's pty mode on
// a terminal of size, TERM=xterm unless set.
func ptyProcess(proc specs.Process, size WinSize) specs.Process {
	hasTerm := false
	for _, kv := range proc.Env {
		if strings.HasPrefix(kv, "TERM=") {
			hasTerm = true
		}
	}
	if !hasTerm {
		proc.Env = append(append([]string(nil), proc.Env...), "TERM=xterm")
	}
	proc.Args = wire.PtyArgs(size.Rows, size.Cols, proc.Args)
	return proc
}

// ptyRelay is the host's side of a command on a sandbox terminal: the
// frames it sends the agent.
type ptyRelay struct {
	r    *io.PipeReader // the agent's stdin
	pw   *io.PipeWriter
	w    *ptywire.Writer
	done chan struct{} // closed by close
	once sync.Once
}

// newPtyRelay starts sending what is read from stdin (if set) and each
// size from resize to the agent. The stdin reader is not waited for: a
// terminal may never return from a read. Its end does not end the
// terminal's input (a terminal has no EOF).
func newPtyRelay(stdin io.Reader, resize <-chan WinSize) *ptyRelay {
	pr, pw := io.Pipe()
	t := &ptyRelay{r: pr, pw: pw, w: ptywire.NewWriter(pw), done: make(chan struct{})}
	if stdin != nil {
		go func() {
			// Half a data frame's most: a frame then fits whole in
			// one input frame of a supervised command (agent's 32 KiB).
			buf := make([]byte, ptywire.MaxData/2)
			for {
				n, err := stdin.Read(buf)
				if n > 0 && t.w.Data(buf[:n]) != nil {
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	if resize != nil {
		go func() {
			for {
				select {
				case ws, ok := <-resize:
					if !ok {
						return
					}
					if t.w.Resize(ws.Rows, ws.Cols) != nil {
						return
					}
				case <-t.done:
					return
				}
			}
		}()
	}
	return t
}

// execOpts are the options of the agent's exec: req's output, and the
// frames as its input.
func (t *ptyRelay) execOpts(req ExecRequest) runsc.ExecOpts {
	return runsc.ExecOpts{Stdin: t.r, Stdout: req.Stdout, Stderr: req.Stderr}
}

// signal delivers sig to the command's process group.
func (t *ptyRelay) signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok || s < 1 || s > ptywire.MaxSignal {
		return fmt.Errorf("signal %v: not a signal of this system: %w", sig, errdefs.ErrInvalidArgument)
	}
	return t.w.Signal(int(s))
}

// close ends the frames, once the agent has exited.
func (t *ptyRelay) close() {
	t.once.Do(func() {
		close(t.done)
		t.pw.Close()
	})
}
