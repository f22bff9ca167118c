package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/runsc"
)

// Command is a command that Start started in a sandbox, or that a
// Supervisor started or attached to. Its methods are safe for concurrent
// use.
type Command struct {
	e    *Engine
	sb   *record
	proc specs.Process
	req  ExecRequest
	ep   *runsc.ExecProcess // nil for a supervised command
	sv   *supervisedCmd     // set for a supervised command
	tty  bool               // the command runs on a terminal
	pty  *ptyRelay          // its terminal's input, for a command of Start

	// resize carries Resize's sizes to the pty; nil when the command has
	// no terminal or the caller gave ExecRequest.Resize.
	resize chan WinSize

	pid atomic.Int64 // inside the sandbox; 0 until seen, or if it never started

	done chan struct{} // closed once code and err are final
	code int
	err  error
}

// Start starts req in sandbox ref and returns once the command runs, or
// once it is known that it could not start: Wait then reports why, with
// the statuses Exec reports. req.Detach is refused: a command in the
// background belongs to the sandbox's init, not to the caller.
//
// ctx bounds the command's life, not just its start: when ctx ends before
// the command does, the command is killed and Wait reports ExitTimeout
// with ErrTimeout, as for ExecRequest.Timeout. A caller that lets the
// command outlive a request gives it a context of its own.
func (e *Engine) Start(ctx context.Context, ref string, req ExecRequest) (*Command, error) {
	if req.Detach {
		return nil, fmt.Errorf("start: a detached command has no process to wait for (use Exec): %w", errdefs.ErrInvalidArgument)
	}
	sb, proc, err := e.prepareExec(ctx, ref, req)
	if err != nil {
		return nil, err
	}
	p := &Command{e: e, sb: sb, proc: proc, req: req, tty: req.TTY, done: make(chan struct{})}
	resize := req.Resize
	if req.TTY && resize == nil {
		p.resize = make(chan WinSize)
		resize = p.resize
	}
	cancel := context.CancelFunc(func() {})
	if req.Timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
	}
	opts := runsc.ExecOpts{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr}
	if req.TTY {
		p.pty = newPtyRelay(req.Stdin, resize)
		opts = p.pty.execOpts(req)
	}
	begin, stopSignals := holdSignals(p, req.Signals, req.Started)
	p.ep, err = e.runscFor(sb).Exec(ctx, sb.ID, proc, opts)
	if err != nil {
		stopSignals()
		cancel()
		if p.pty != nil {
			p.pty.close()
		}
		return nil, err
	}
	begin()
	go func() {
		defer close(p.done)
		defer cancel()
		code, err := p.ep.Wait()
		stopSignals()
		if p.pty != nil {
			p.pty.close()
		}
		p.code, p.err = p.result(ctx, code, err)
	}()
	p.pid.Store(int64(p.awaitPid()))
	return p, nil
}

// awaitPid returns the command's PID inside the sandbox once runsc knows
// it, or 0 if the command ended without one being seen (it could not
// start, or on a terminal it ended within milliseconds).
func (p *Command) awaitPid() int {
	for {
		if pid, err := p.ep.Pid(); err == nil {
			return pid
		}
		select {
		case <-p.done:
			return 0
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// result turns the status of runsc's process into Exec's.
func (p *Command) result(ctx context.Context, code int, err error) (int, error) {
	e, sb, cmd := p.e, p.sb, p.req.Args[0]
	if p.ep.TimedOut() {
		if p.req.Timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ExitTimeout, fmt.Errorf("%s: %w after %s and was killed", cmd, ErrTimeout, p.req.Timeout)
		}
		return ExitTimeout, fmt.Errorf("%s: %w: its context ended (%v) and it was killed", cmd, ErrTimeout, ctx.Err())
	}
	if errors.Is(err, runsc.ErrNotStarted) {
		return e.whyNotStarted(context.Background(), sb, p.proc), nil
	}
	if errors.Is(err, runsc.ErrSandboxGone) {
		return e.stoppedUnder(sb, cmd)
	}
	// A sandbox killed for memory takes its processes with it: only an
	// abnormal end can mean that.
	if code >= 128 || err != nil {
		if now, lerr := e.load(sb.ID); lerr == nil && now.OOMKilled {
			return ExitOOMKilled, oomError(now)
		}
	}
	return code, err
}

// Pid returns the command's PID inside the sandbox: 0 if it never
// started (Wait says why), or, rarely, if it ran on a terminal and had
// ended before its PID could be read.
func (p *Command) Pid() int {
	return int(p.pid.Load())
}

// Signal delivers sig to the command. After the command has ended it
// fails with ErrNotFound.
func (p *Command) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s has exited: %w", p.req.Args[0], errdefs.ErrNotFound)
	default:
	}
	if p.pty != nil {
		// The agent that holds the terminal delivers it to the
		// command's process group.
		return p.pty.signal(sig)
	}
	if p.sv != nil {
		s, ok := sig.(syscall.Signal)
		if !ok {
			return fmt.Errorf("signal %v: not a signal of this system: %w", sig, errdefs.ErrInvalidArgument)
		}
		return p.sv.s.signal(int(p.pid.Load()), s)
	}
	return p.ep.Signal(sig)
}

// Resize sets the size of the command's terminal. It fails with
// ErrFailedPrecondition if the command has no terminal or its sizes come
// from ExecRequest.Resize, and with ErrNotFound once it has ended.
func (p *Command) Resize(ws WinSize) error {
	if !p.tty {
		return fmt.Errorf("%s does not run on a terminal: %w", p.req.Args[0], errdefs.ErrFailedPrecondition)
	}
	if p.resize == nil {
		return fmt.Errorf("%s takes its terminal sizes from ExecRequest.Resize: %w", p.req.Args[0], errdefs.ErrFailedPrecondition)
	}
	select {
	case p.resize <- ws:
		return nil
	case <-p.done:
		return fmt.Errorf("%s has exited: %w", p.req.Args[0], errdefs.ErrNotFound)
	}
}

// Wait waits for the command to end, and for its output to have been
// written, and returns what Exec returns. It may be called any number of
// times, from any goroutine.
func (p *Command) Wait() (int, error) {
	<-p.done
	return p.code, p.err
}

// Done is closed when the command has ended and Wait returns at once.
func (p *Command) Done() <-chan struct{} {
	return p.done
}

// forwardSignals delivers sigs to the running command p until stop is
// called, and calls started once it does.
func forwardSignals(p *Command, sigs <-chan os.Signal, started func()) (stop func()) {
	begin, stop := holdSignals(p, sigs, started)
	begin()
	return stop
}

// holdSignals takes sigs for command p from now on, and calls started at
// once, so that a caller sends the command the signals that come while it
// is still being started: it may already run, and print, before the call
// that starts it returns. They are delivered once begin is called; stop
// ends the forwarding, and a command that never began gets none.
func holdSignals(p *Command, sigs <-chan os.Signal, started func()) (begin, stop func()) {
	if sigs == nil {
		if started != nil {
			started()
		}
		return func() {}, func() {}
	}
	ready, done := make(chan struct{}), make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				select {
				case <-ready:
				case <-done:
					return
				}
				p.Signal(s) //nolint:errcheck // the process may have exited
			case <-done:
				return
			}
		}
	}()
	if started != nil {
		started()
	}
	return func() { close(ready) }, func() { close(done) }
}
