package clix

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// brokenPipe receives SIGPIPE once DeferBrokenPipe has been called.
var brokenPipe = make(chan os.Signal, 1)

// DeferBrokenPipe makes a write to this process's stdout or stderr whose
// reader has gone (`sbx run --rm ... | head -1`) fail instead of ending
// the process at once, so that the command can finish what it must (its
// sandbox's removal) first. EndIfBrokenPipe then ends it as a pipeline's
// writer ends.
func DeferBrokenPipe() { signal.Notify(brokenPipe, syscall.SIGPIPE) }

// EndIfBrokenPipe ends this process by SIGPIPE, as a write to a pipe
// without a reader ends a program, if one of its writes found its stdout
// or stderr without a reader since DeferBrokenPipe.
func EndIfBrokenPipe() {
	select {
	case <-brokenPipe:
	default:
		return
	}
	signal.Reset(syscall.SIGPIPE)
	for _, f := range []*os.File{os.Stdout, os.Stderr} {
		// The write end of a pipe whose reader has gone polls as an
		// error; a write to it now ends the process (the Go runtime's
		// rule for stdout and stderr).
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLOUT}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 && fds[0].Revents&unix.POLLERR != 0 {
			f.Write([]byte{0}) //nolint:errcheck // it does not return
		}
	}
}
