package clix

import (
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// brokenPipe receives SIGPIPE once DeferBrokenPipe has been called.
var brokenPipe = make(chan os.Signal, 1)

// deferred tells whether DeferBrokenPipe has been called.
var deferred atomic.Bool

// DeferBrokenPipe makes a write to this process's stdout or stderr whose
// reader has gone (`sbx run --rm ... | head -1`) fail instead of ending
// the process at once, so that the command can finish what it must (its
// sandbox's removal) first. EndIfBrokenPipe then ends it as a pipeline's
// writer ends.
func DeferBrokenPipe() {
	deferred.Store(true)
	signal.Notify(brokenPipe, syscall.SIGPIPE)
}

// signalDelivery bounds the wait for a SIGPIPE already raised to reach
// brokenPipe: it takes os/signal's goroutine a turn of the scheduler, and
// a command whose reader went without a failed write (`| head -1` of one
// line) waits that long for nothing.
const signalDelivery = 100 * time.Millisecond

// EndIfBrokenPipe ends this process by SIGPIPE, as a write to a pipe
// without a reader ends a program, if one of its writes found its stdout
// or stderr without a reader since DeferBrokenPipe.
func EndIfBrokenPipe() {
	if !deferred.Load() {
		return
	}
	broken := readerGone()
	if len(broken) == 0 {
		return
	}
	// A failed write raised SIGPIPE before it returned, but os/signal's
	// goroutine passes it on to brokenPipe in its own time: it runs
	// while this one waits. Without a reader, a command that wrote
	// nothing since (its output was empty) sends none.
	select {
	case <-brokenPipe:
	case <-time.After(signalDelivery):
		return
	}
	signal.Reset(syscall.SIGPIPE)
	for _, f := range broken {
		// A write now ends the process (the Go runtime's rule for
		// stdout and stderr).
		f.Write([]byte{0}) //nolint:errcheck // it does not return
	}
}

// readerGone returns those of stdout and stderr whose reader has gone. The
// write end of a pipe without a reader polls as an error; a socket whose
// peer has closed polls as hung up, and as an error as well if the peer
// left data unread.
func readerGone() []*os.File {
	var gone []*os.File
	for _, f := range []*os.File{os.Stdout, os.Stderr} {
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLOUT}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
			gone = append(gone, f)
		}
	}
	return gone
}
