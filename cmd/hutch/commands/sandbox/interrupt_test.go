package sandbox

import (
	"context"
	"syscall"
	"testing"
	"time"

	"hutch.dev/hutch/engine"
)

func awaitDone(t *testing.T, in *interrupt) {
	t.Helper()
	select {
	case <-in.ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the signal did not end the context")
	}
}

// A signal with no command running ends the context, with the signal as
// its cause.
func TestInterruptBeforeCommand(t *testing.T) {
	in := catchSignals(context.Background())
	defer in.stop()
	syscall.Kill(syscall.Getpid(), syscall.SIGHUP)
	awaitDone(t, in)
	if c := in.cause(); c == nil || c.sig != syscall.SIGHUP || in.commandRan() {
		t.Fatalf("cause %v, command ran %v", c, in.commandRan())
	}
}

// While a command takes signals, the first goes to it and the context
// lives on; the next ends the context.
func TestInterruptForwardsOnceThenAborts(t *testing.T) {
	in := catchSignals(context.Background())
	defer in.stop()
	var req engine.ExecRequest
	defer in.forward(&req)()
	got := make(chan struct{})
	go func() {
		// As the engine does for a running command.
		for s := range req.Signals {
			if s == syscall.SIGHUP {
				close(got)
			}
		}
	}()
	req.Started()
	syscall.Kill(syscall.Getpid(), syscall.SIGHUP)
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the signal did not reach the command")
	}
	if in.ctx.Err() != nil || !in.commandRan() {
		t.Fatalf("after one signal to a running command: ctx %v, command ran %v", in.ctx.Err(), in.commandRan())
	}
	syscall.Kill(syscall.Getpid(), syscall.SIGHUP)
	awaitDone(t, in)
	if c := in.cause(); c == nil || c.sig != syscall.SIGHUP {
		t.Fatalf("cause %v", c)
	}
}

// A signal that comes once the command runs reaches it even if the
// engine's reader is not waiting at that instant (a loaded host).
func TestInterruptForwardsToSlowReader(t *testing.T) {
	in := catchSignals(context.Background())
	defer in.stop()
	var req engine.ExecRequest
	ended := in.forward(&req)
	req.Started()
	syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
	time.Sleep(100 * time.Millisecond)
	if in.ctx.Err() != nil {
		t.Fatalf("a signal to a running command ended hutch's context: %v", context.Cause(in.ctx))
	}
	select {
	case s := <-req.Signals:
		if s != syscall.SIGTERM {
			t.Fatalf("got %v", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the signal never reached the command")
	}
	// Once Exec has returned, a signal ends the context.
	ended()
	syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
	awaitDone(t, in)
}
