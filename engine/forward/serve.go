package forward

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/hashicorp/yamux"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/runsc"
)

// Sandbox is the sandbox that connections are forwarded into, as the
// engine gives it.
type Sandbox interface {
	// ID is the sandbox's ID, as runsc knows it.
	ID() string
	// ShortID names the sandbox in errors.
	ShortID() string
	// ControlSocket is the path of the sandbox's runsc control socket.
	ControlSocket() (string, error)
	// PortMux runs the sandbox's agent as a port multiplexer ("portmux")
	// and returns a yamux session with it, which lasts until stop, ctx's
	// end or the agent's exit. Each stream of the session begins with
	// the port it is for, two bytes big-endian.
	PortMux(ctx context.Context) (sess *yamux.Session, stop func(), err error)
}

// Serve serves connections accepted on ls, forwarding each to its port
// in sb, until ctx ends (nil) or running, checked every second, reports
// an error, which Serve returns. With direct (the address the host
// reaches the sandbox at; "" if it cannot) a connection is dialled there
// first. It closes the listeners when it returns.
func Serve(ctx context.Context, sb Sandbox, direct string, ls []Listener, running func() error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &forwarder{sb: sb, ctx: ctx, direct: direct}
	defer f.close()
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.serve(l)
		}()
	}
	// A forwarder outlives no sandbox: it checks that its sandbox runs.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var stopped error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			if stopped = running(); stopped != nil {
				break loop
			}
		}
	}
	for _, l := range ls {
		l.Listener.Close()
	}
	cancel()
	wg.Wait()
	return stopped
}

type forwarder struct {
	sb  Sandbox
	ctx context.Context
	// direct is the sandbox's address on its link, "" if the host
	// cannot reach it (no link, or a rootless one).
	direct string

	mu   sync.Mutex // guards sess, stop, ctl, kernel and sockets
	sess *yamux.Session
	stop func() // ends the current session's exec
	// ctl is the sandbox's control socket, once looked up; kernel,
	// whether its runsc forwards ports itself, once known; sockets,
	// whether it takes the client's connection itself.
	ctl     *runsc.Control
	kernel  kernelForwards
	sockets kernelForwards
}

func (f *forwarder) serve(l Listener) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if f.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				log.G(f.ctx).WithError(err).Warn("port forward: accept")
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return
		}
		if uc, ok := c.(*net.UnixConn); ok && !PeerIsOwner(uc) {
			log.G(f.ctx).Warn("port forward: refused a connection from another user")
			c.Close()
			continue
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			f.handle(c, l.Port)
		}()
	}
}

// directDialTimeout bounds a dial of the sandbox's address: it answers at
// once, with a connection or a refusal, unless something is amiss.
const directDialTimeout = time.Second

func (f *forwarder) handle(c net.Conn, port uint16) {
	if ip := f.direct; ip != "" {
		d := net.Dialer{Timeout: directDialTimeout}
		sc, err := d.DialContext(f.ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(int(port))))
		if err == nil {
			stop := context.AfterFunc(f.ctx, func() { c.Close(); sc.Close() })
			defer stop()
			joinConns(c.(wire.HalfCloser), sc.(*net.TCPConn))
			return
		}
		// Refused: nothing listens on the sandbox's address, maybe
		// on its 127.0.0.1, which the agent reaches.
		log.G(f.ctx).WithError(err).Debug("port forward: direct dial failed, through the agent")
	}
	if f.kernelForward(c, port) {
		return
	}
	st, err := f.open()
	if err != nil {
		log.G(f.ctx).WithError(err).Warn("port forward: open a stream into the sandbox")
		c.Close()
		return
	}
	var hdr [2]byte
	binary.BigEndian.PutUint16(hdr[:], port)
	if _, err := st.Write(hdr[:]); err != nil {
		c.Close()
		st.Close()
		return
	}
	stop := context.AfterFunc(f.ctx, func() { c.Close(); st.Close() })
	defer stop()
	// TCP and UNIX listeners both give connections that half close.
	wire.Join(c.(wire.HalfCloser), st)
}

// joinConns copies between two connections both ways, passing on each
// direction's end as a half close, and closes both when both directions
// are done. Between two TCP connections the kernel moves the data
// (splice(2)).
func joinConns(a, b wire.HalfCloser) {
	var wg sync.WaitGroup
	wg.Add(2)
	pass := func(dst, src wire.HalfCloser) {
		defer wg.Done()
		io.Copy(dst, src) //nolint:errcheck // either end may go away
		dst.CloseWrite()
	}
	go pass(a, b)
	go pass(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// open opens a stream on the session, starting a session (an exec of the
// agent's portmux) if there is none or the last one ended.
func (f *forwarder) open() (*yamux.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for try := 0; try < 2; try++ {
		if f.sess == nil || f.sess.IsClosed() {
			if err := f.startLocked(); err != nil {
				return nil, err
			}
		}
		st, err := f.sess.OpenStream()
		if err == nil {
			return st, nil
		}
		f.sess.Close()
	}
	return nil, fmt.Errorf("port forward into sandbox %s: the agent does not answer", f.sb.ShortID())
}

func (f *forwarder) startLocked() error {
	if f.stop != nil {
		f.stop()
	}
	sess, stop, err := f.sb.PortMux(f.ctx)
	if err != nil {
		return err
	}
	f.sess, f.stop = sess, stop
	return nil
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stop != nil {
		f.stop()
	}
	if f.ctl != nil {
		f.ctl.Close()
	}
}
