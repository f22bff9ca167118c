package clix

import (
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"hutch.dev/hutch/engine"
)

// brokenPipe receives SIGPIPE once DeferBrokenPipe has been called. What
// it receives is not read: the kernel also raises SIGPIPE when an output
// whose reader went ends with nothing lost (see engine.LostOutput).
var brokenPipe = make(chan os.Signal, 1)

// deferred tells whether DeferBrokenPipe has been called.
var deferred atomic.Bool

// DeferBrokenPipe makes a write to this process's stdout or stderr whose
// reader has gone (`hutch run --rm ... | head -1`) fail instead of ending
// the process at once, so that the command can finish what it must (its
// sandbox's removal) first. EndIfBrokenPipe then ends it as a pipeline's
// writer ends.
func DeferBrokenPipe() {
	deferred.Store(true)
	signal.Notify(brokenPipe, syscall.SIGPIPE)
}

// EndIfBrokenPipe ends this process by SIGPIPE, as a write to a pipe
// without a reader ends a program, if some of a sandbox's output was lost
// on its stdout or stderr, whose reader had gone, since DeferBrokenPipe.
func EndIfBrokenPipe() {
	if !deferred.Load() {
		return
	}
	lost := engine.LostOutput()
	if len(lost) == 0 {
		return
	}
	signal.Reset(syscall.SIGPIPE)
	for _, f := range lost {
		// A write now ends the process (the Go runtime's rule for
		// stdout and stderr).
		f.Write([]byte{0}) //nolint:errcheck // it does not return
	}
}
