package shim

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/agent/ptywire"
	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/runsc"
)

// An exec with a terminal runs on a pty of the sandbox's own devpts when
// its container has the agent (the pod's hutch-init, mounted by
// assembly.AgentMount): the shim runs `hutch-init pty -- CMD` as a plain
// exec, with the process's user, environment and directory. The agent
// opens /dev/ptmx, starts CMD as the leader of a session on the pty's
// replica, copies the pty's output to its stdout (containerd's stdout
// fifo) and takes ptywire frames on its stdin: the shim turns containerd's
// stdin fifo into data frames, ResizePty into resize frames and Kill into
// signal frames for CMD's process group. Its exit status is CMD's. See
// docs/decisions/0015-sandbox-terminals.md.

// agentTerminal says whether c's execs with a terminal run through the
// agent.
func (s *service) agentTerminal(c *container) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pod != nil && s.pod.agent != "" && assembly.HasAgent(c.spec)
}

// agentPtyProcess is p run through the agent's pty mode: a plain exec,
// TERM=xterm unless p sets TERM, on a terminal of p's console size if
// it has one.
func agentPtyProcess(p specs.Process) specs.Process {
	hasTerm := false
	for _, kv := range p.Env {
		if strings.HasPrefix(kv, "TERM=") {
			hasTerm = true
		}
	}
	if !hasTerm {
		p.Env = append(append([]string(nil), p.Env...), "TERM=xterm")
	}
	var rows, cols uint16
	if p.ConsoleSize != nil {
		rows, cols = uint16(p.ConsoleSize.Height), uint16(p.ConsoleSize.Width)
	}
	p.Args = wire.PtyArgs(rows, cols, p.Args)
	p.Terminal, p.ConsoleSize = false, nil
	return p
}

// agentRelay is the shim's side of a terminal the agent holds.
type agentRelay struct {
	frames *ptywire.Writer
	pr     *io.PipeReader // the agent's stdin
	pw     *io.PipeWriter
	out    io.WriteCloser // containerd's stdout fifo; nil for none
	once   sync.Once
}

// newAgentTTY opens containerd's fifos and starts turning what comes on
// stdin into data frames. The end of stdin ends the input, not the
// terminal (a terminal has no EOF): the frames end when the process has
// exited (Close).
func newAgentTTY(ctx context.Context, s stdio) (*ttyIO, error) {
	pr, pw := io.Pipe()
	a := &agentRelay{frames: ptywire.NewWriter(pw), pr: pr, pw: pw}
	t := &ttyIO{agent: a}
	if s.Stdout != "" {
		w, err := openOutput(ctx, s.Stdout)
		if err != nil {
			t.Close()
			return nil, err
		}
		a.out = &lockedWriter{w: w}
	}
	if s.Stdin != "" {
		in, err := openInput(s.Stdin)
		if err != nil {
			t.Close()
			return nil, err
		}
		t.in = in
		go a.relayInput(in)
	}
	return t, nil
}

// relayInput sends what comes from in as data frames until in ends or
// the frames do.
func (a *agentRelay) relayInput(in io.Reader) {
	// Half a data frame's most, as engine's relay sends.
	buf := make([]byte, ptywire.MaxData/2)
	for {
		n, err := in.Read(buf)
		if n > 0 && a.frames.Data(buf[:n]) != nil {
			return
		}
		if err != nil {
			return
		}
	}
}

// execOpts are the options of the agent's exec: the frames as its stdin,
// its output (the terminal's, and its own complaints) to containerd's
// stdout.
func (a *agentRelay) execOpts(drain time.Duration) runsc.ExecOpts {
	o := runsc.ExecOpts{Stdin: a.pr, IODrain: drain}
	if a.out != nil {
		o.Stdout, o.Stderr = a.out, a.out
	}
	return o
}

// resize sends the terminal's new size: w columns, h rows.
func (a *agentRelay) resize(w, h uint32) error {
	if w > 0xffff || h > 0xffff {
		return fmt.Errorf("window size %dx%d out of range: %w", w, h, errdefs.ErrInvalidArgument)
	}
	return a.frames.Resize(uint16(h), uint16(w))
}

// signal sends sig to the command's process group.
func (a *agentRelay) signal(sig syscall.Signal) error {
	return a.frames.Signal(int(sig))
}

// close ends the frames (the agent hangs the terminal up if it still
// runs) and closes containerd's stdout.
func (a *agentRelay) close() {
	a.once.Do(func() {
		a.pw.Close()
		if a.out != nil {
			a.out.Close()
		}
	})
}

// lockedWriter serializes the agent's stdout and stderr, both written to
// containerd's stdout fifo.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.WriteCloser
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Close closes w, unlocked: a write stuck on a full fifo then fails.
func (l *lockedWriter) Close() error { return l.w.Close() }
