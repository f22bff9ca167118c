// Command hutch-helper is the host process hutch keeps beside a sandbox that
// needs one: its DNS resolver, its lifetime watchdog and its port
// forwarder. It links only what these need (no image store, no BuildKit,
// no gRPC), so that an idle one holds a small part of what an idle hutch
// does; hutch finds it beside the hutch binary and falls back to its own
// hidden commands without it (docs/decisions/0026-sandbox-helpers.md).
//
//	hutch-helper __dns-resolver CONFIG
//	hutch-helper lifetime-watchdog -deadline T [-sandbox PID:START] -- HUTCH ARGS...
//	hutch-helper port-forward -listeners N [-sandbox PID:START] -- HUTCH ARGS...
//
// The resolver serves in this process. The watchdog and the forwarder
// wait here for what they exist for (the deadline; a connection on one of
// the listeners inherited as fds 3, 4, ...) and then replace this process
// with the hutch command after "--" (execve: the same PID and start time,
// which the sandbox's record names, and the same listeners), which does
// the work as before. Both end, doing nothing, once the sandbox's runsc
// process (PID and start time) is gone.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"hutch.dev/hutch/assembly/hostnet"
	"hutch.dev/hutch/assembly/hostproc"
)

// gcPercent keeps an idle helper's heap close to what it uses: the
// resolver's answers and the runtime's own allocations are small, and
// the default (100, with a 4 MiB floor) would let each helper's heap
// grow several times larger before its first collection.
const gcPercent = 25

func main() {
	debug.SetGCPercent(gcPercent)
	if len(os.Args) < 2 {
		fail(errors.New("usage: hutch-helper __dns-resolver|lifetime-watchdog|port-forward ARGS..."))
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "__dns-resolver":
		err = resolver(args)
	case "lifetime-watchdog":
		err = watchdog(args)
	case "port-forward":
		err = forwarder(args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "hutch-helper:", err)
	os.Exit(1)
}

// resolver is `hutch __dns-resolver CONFIG`: the sandbox's DNS resolver,
// reporting its start on fd 3 (hostnet.StartResolver).
func resolver(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: hutch-helper __dns-resolver CONFIG")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return hostnet.ServeResolver(ctx, args[0], hostnet.ReadyPipe())
}

// waitFlags are the flags of the helpers that wait and then exec hutch.
type waitFlags struct {
	fs      *flag.FlagSet
	sandbox string
	then    []string
}

func newWaitFlags(name string) *waitFlags {
	w := &waitFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	w.fs.StringVar(&w.sandbox, "sandbox", "", "PID:START of the sandbox's runsc process; the helper ends when it does")
	return w
}

func (w *waitFlags) parse(args []string) error {
	if err := w.fs.Parse(args); err != nil {
		return err
	}
	w.then = w.fs.Args()
	if len(w.then) == 0 || !strings.HasPrefix(w.then[0], "/") {
		return fmt.Errorf("%s: want -- and the absolute path of hutch with its arguments", w.fs.Name())
	}
	return nil
}

// sandboxGone reports whether the sandbox's runsc process has ended (it
// stopped, crashed or was paused): what the helper waits for is moot.
func (w *waitFlags) sandboxGone() bool {
	if w.sandbox == "" {
		return false
	}
	p, s, ok := strings.Cut(w.sandbox, ":")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(s, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 {
		return false
	}
	return !hostproc.Same(pid, start)
}

// become replaces this process with the hutch command.
func (w *waitFlags) become() error {
	err := syscall.Exec(w.then[0], w.then, os.Environ())
	return fmt.Errorf("exec %s: %w", w.then[0], err)
}

// watchdog waits for the deadline and then becomes hutch's lifetime
// watchdog, which checks the sandbox's record and pauses, stops or
// removes it.
func watchdog(args []string) error {
	w := newWaitFlags("lifetime-watchdog")
	deadline := w.fs.String("deadline", "", "the sandbox's deadline (RFC 3339)")
	if err := w.parse(args); err != nil {
		return err
	}
	d, err := time.Parse(time.RFC3339Nano, *deadline)
	if err != nil {
		return fmt.Errorf("-deadline: %w", err)
	}
	// As hutch's watchdog: no terminal's signal ends it.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
	for {
		// The wall clock, rechecked at least each minute: a host that
		// slept past the deadline acts on waking.
		wait := time.Until(d.Round(0))
		if wait <= 0 {
			return w.become()
		}
		time.Sleep(min(wait, time.Minute))
		if w.sandboxGone() {
			return nil
		}
	}
}

// forwarder waits for the first connection on the listeners inherited as
// fds 3, 4, ... and then becomes hutch's forwarder, which accepts it: a
// sandbox whose published ports are never used keeps only this process.
// On SIGTERM, SIGINT or SIGHUP it removes its UNIX sockets and ends, as
// hutch's forwarder does.
func forwarder(args []string) error {
	w := newWaitFlags("port-forward")
	n := w.fs.Int("listeners", 0, "how many listeners are inherited, from fd 3 on")
	if err := w.parse(args); err != nil {
		return err
	}
	if *n < 1 {
		return errors.New("-listeners: want at least 1")
	}
	fds := make([]unix.PollFd, *n)
	for i := range fds {
		fds[i] = unix.PollFd{Fd: int32(3 + i), Events: unix.POLLIN}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		<-sig
		unlinkSockets(fds)
		os.Exit(0)
	}()
	for {
		// Once a second, as hutch's forwarder checks its sandbox.
		ready, err := unix.Poll(fds, 1000)
		switch {
		case err != nil && !errors.Is(err, unix.EINTR):
			return fmt.Errorf("poll the listeners: %w", err)
		case ready > 0:
			for _, f := range fds {
				if f.Revents&(unix.POLLNVAL|unix.POLLERR) != 0 {
					return fmt.Errorf("listener fd %d is not usable", f.Fd)
				}
			}
			signal.Reset()
			return w.become()
		case w.sandboxGone():
			unlinkSockets(fds)
			return nil
		}
	}
}

// unlinkSockets removes the paths of the UNIX listeners among fds.
func unlinkSockets(fds []unix.PollFd) {
	for _, f := range fds {
		if sa, err := unix.Getsockname(int(f.Fd)); err == nil {
			if u, ok := sa.(*unix.SockaddrUnix); ok && strings.HasPrefix(u.Name, "/") {
				os.Remove(u.Name)
			}
		}
	}
}
