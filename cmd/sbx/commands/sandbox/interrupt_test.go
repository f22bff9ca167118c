package sandbox

import (
	"context"
	"syscall"
	"testing"
	"time"
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
	got := make(chan struct{})
	go func() {
		// As the engine does for a running command.
		for s := range in.fwd {
			if s == syscall.SIGHUP {
				close(got)
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
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
