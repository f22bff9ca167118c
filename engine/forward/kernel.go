package forward

import (
	"context"
	"errors"
	"net"
	"os"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/urpc"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/runsc"
)

// The sandbox's own kernel makes a forwarded connection: runsc's port
// forward, on the sandbox's control socket (docs/decisions/0033, 0034).

// kernelForwards is whether a sandbox's runsc forwards ports itself.
type kernelForwards int

const (
	kernelUnknown kernelForwards = iota
	kernelYes
	kernelNo
)

// kernelForward joins c to port on the sandbox's 127.0.0.1 through the
// sandbox's own kernel: c itself (handOver), or with a runsc that cannot
// take it, a socket pair (kernelConn). It reports false, leaving c alone,
// when the sandbox's runsc cannot: then the agent carries this
// connection and every later one.
func (f *forwarder) kernelForward(c net.Conn, port uint16) bool {
	if f.handOver(c, port) {
		return true
	}
	sc, ok, err := f.kernelConn(port, func() { c.Close() })
	if !ok {
		return false
	}
	if err != nil {
		// Nothing listens on the port, or the sandbox is gone: the
		// client sees its connection closed, as with the agent.
		c.Close()
		return true
	}
	stop := context.AfterFunc(f.ctx, func() { c.Close(); sc.Close() })
	defer stop()
	joinConns(c.(wire.HalfCloser), sc)
	return true
}

// handOver hands c itself to the sandbox's kernel, which connects it to
// port on the sandbox's 127.0.0.1 and copies between the two: the host
// copies nothing, and c is closed here either way (the sandbox holds the
// connection; a refused one ends). It reports false, leaving c alone,
// when the sandbox's runsc cannot take a connection (a runsc without
// tools/runsc/portforward.patch, or one from before PortForwardSocket):
// then no later connection is handed over either.
//
// A connection handed over lasts until either end closes it, or the
// sandbox stops or saves its state (pause, fork); not until this
// forwarder stops, which only stops taking new ones.
func (f *forwarder) handOver(c net.Conn, port uint16) bool {
	fc, ok := c.(interface{ File() (*os.File, error) })
	f.mu.Lock()
	sockets := f.sockets
	f.mu.Unlock()
	if !ok || sockets == kernelNo {
		return false
	}
	ctl, err := f.control()
	if err != nil {
		log.G(f.ctx).WithError(err).Warn("port forward")
		c.Close()
		return true
	}
	file, err := fc.File()
	if err != nil {
		log.G(f.ctx).WithError(err).Warn("port forward")
		c.Close()
		return true
	}
	err = runsc.PortForwardSocket(f.ctx, ctl, f.sb.ID(), port, file)
	file.Close()
	f.answered(ctl, err, &f.sockets)
	if errors.Is(err, runsc.ErrNoPortForward) {
		return false
	}
	if err != nil {
		// Nothing listens on the port, or the sandbox is gone: the
		// client sees its connection closed.
		log.G(f.ctx).WithError(err).Debug("port forward: not connected")
	}
	c.Close()
	return true
}

// control returns the sandbox's control socket, looked up once while it
// answers.
func (f *forwarder) control() (*runsc.Control, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctl == nil {
		sock, err := f.sb.ControlSocket()
		if err != nil {
			return nil, err
		}
		f.ctl = runsc.NewControl(sock)
	}
	return f.ctl, nil
}

// answered records what a port forward call on ctl said: in *can,
// whether the sandbox's runsc has that call, once it answers; a call not
// answered (the sandbox stopping, or gone) drops ctl, to be looked up
// again.
func (f *forwarder) answered(ctl *runsc.Control, err error, can *kernelForwards) {
	var re urpc.RemoteError
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case errors.Is(err, runsc.ErrNoPortForward):
		*can = kernelNo
	case err == nil:
		*can = kernelYes
	case errors.As(err, &re):
	default:
		if f.ctl == ctl {
			f.ctl = nil
			ctl.Close()
		}
	}
}

// kernelConn connects to port on the sandbox's 127.0.0.1 through the
// sandbox's own kernel (runsc's port forward, over its control socket)
// and returns the host's end: the sandbox's end of a socket pair is
// handed to the sentry, which connects and copies between the two on its
// own goroutines; no process of the sandbox takes part. ok is false when
// the sandbox's runsc cannot (nothing was done). With failed set, once
// the sandbox has forwarded a connection, it returns before the sandbox
// has connected, so that the first bytes wait in the pair; failed runs
// (and the connection closes) if it does not.
func (f *forwarder) kernelConn(port uint16, failed func()) (sc *net.UnixConn, ok bool, err error) {
	f.mu.Lock()
	known := f.kernel
	f.mu.Unlock()
	if known == kernelNo {
		return nil, false, nil
	}
	ctl, err := f.control()
	if err != nil {
		log.G(f.ctx).WithError(err).Warn("port forward")
		return nil, true, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, true, err
	}
	theirs, ours := os.NewFile(uintptr(fds[0]), "port-forward"), os.NewFile(uintptr(fds[1]), "port-forward")
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		theirs.Close()
		return nil, true, err
	}
	sc = c.(*net.UnixConn)
	call := func() error {
		err := runsc.PortForward(f.ctx, ctl, f.sb.ID(), port, theirs)
		theirs.Close()
		f.answered(ctl, err, &f.kernel)
		if err != nil && !errors.Is(err, runsc.ErrNoPortForward) {
			log.G(f.ctx).WithError(err).Debug("port forward: not connected")
		}
		return err
	}
	if known == kernelYes && failed != nil {
		go func() {
			if call() != nil {
				sc.Close()
				failed()
			}
		}()
		return sc, true, nil
	}
	if err := call(); err != nil {
		sc.Close()
		return nil, !errors.Is(err, runsc.ErrNoPortForward), err
	}
	return sc, true, nil
}
