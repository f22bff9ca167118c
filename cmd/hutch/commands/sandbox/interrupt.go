package sandbox

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// interrupted is why an interrupt's context ended: a signal that found no
// command to take it.
type interrupted struct{ sig syscall.Signal }

func (i *interrupted) Error() string { return "interrupted by " + signalName(i.sig) }

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	}
	return s.String()
}

// interrupt is what create, run and exec do with SIGINT, SIGTERM, SIGHUP
// and SIGQUIT: while a command runs, the first of them goes to it (its
// end is hutch's); before it runs, after it has ended, or once one has gone
// to it, a signal ends ctx, which aborts whatever hutch is doing and kills
// the command, and hutch removes what it made.
type interrupt struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	// fwd is the command's ExecRequest.Signals; it holds one signal, so
	// the first goes to the command whether or not the engine is reading
	// at that instant.
	fwd  chan os.Signal
	sigs chan os.Signal
	done chan struct{}
	// running is set while the engine forwards fwd to a command (from its
	// ExecRequest.Started until Exec returns).
	running atomic.Bool
	// forwarded is set once a signal went to the command.
	forwarded atomic.Bool
}

// catchSignals starts an interrupt under parent; stop ends it.
func catchSignals(parent context.Context) *interrupt {
	ctx, cancel := context.WithCancelCause(parent)
	in := &interrupt{ctx: ctx, cancel: cancel, fwd: make(chan os.Signal, 1), sigs: notifySignals(), done: make(chan struct{})}
	go in.loop()
	return in
}

func (in *interrupt) loop() {
	for {
		select {
		case s := <-in.sigs:
			if in.running.Load() && !in.forwarded.Swap(true) {
				// The engine reads fwd while the command runs; the
				// first signal is the only one sent, so it never
				// blocks.
				in.fwd <- s
				continue
			}
			sig, _ := s.(syscall.Signal)
			in.cancel(&interrupted{sig: sig})
		case <-in.done:
			return
		}
	}
}

// forward sets req up to take the first signal while its command runs;
// the returned func is called once Exec has returned.
func (in *interrupt) forward(req *engine.ExecRequest) (ended func()) {
	req.Signals = in.fwd
	req.Started = func() { in.running.Store(true) }
	return func() { in.running.Store(false) }
}

// stop restores the default handling of the signals.
func (in *interrupt) stop() {
	signal.Stop(in.sigs)
	close(in.done)
	in.cancel(nil)
}

// cause is the signal that ended ctx, or nil.
func (in *interrupt) cause() *interrupted {
	var i *interrupted
	if errors.As(context.Cause(in.ctx), &i) {
		return i
	}
	return nil
}

// exit is the status of a command that was interrupted, as a shell
// reports a process a signal ended: 128+N.
func (in *interrupt) exit() error {
	i := in.cause()
	return clix.Exit(128+int(i.sig), i)
}

// commandRan reports whether a signal went to a running command.
func (in *interrupt) commandRan() bool { return in.forwarded.Load() }
