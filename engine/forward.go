package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/hashicorp/yamux"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/policy"
	runsc "sbx.dev/sbx/runsc-sandbox"
	"sbx.dev/sbx/runsc-sandbox/agent"
)

// Port forwarding publishes a TCP port of a sandbox on the host. It is not
// egress and needs no network in the sandbox: a connection accepted on the
// host becomes a stream of one yamux session carried over the stdin and
// stdout of one `runsc exec` of the sandbox's agent ("portmux"), which
// dials the port on the sandbox's 127.0.0.1. One exec serves every
// connection; when it dies (the sandbox was paused and resumed, say) the
// next connection starts another.

// PortMapping publishes a sandbox port on the host.
type PortMapping = policy.PortMapping

// PortListener is a bound host listener and the sandbox port it forwards
// to.
type PortListener struct {
	Listener *net.TCPListener
	Port     uint16
}

// Mapping is the mapping l serves, with the host port it actually got.
func (l PortListener) Mapping() PortMapping {
	a := l.Listener.Addr().(*net.TCPAddr)
	return PortMapping{HostIP: a.IP.String(), HostPort: uint16(a.Port), Port: l.Port}
}

// ListenPorts binds every mapping on the host, or none: on error the ones
// bound are closed.
func ListenPorts(ms []PortMapping) ([]PortListener, error) {
	var out []PortListener
	for _, m := range ms {
		l, err := net.Listen("tcp", m.HostAddr())
		if err != nil {
			for _, o := range out {
				o.Listener.Close()
			}
			return nil, fmt.Errorf("publish %s: %w: %w", m, err, errdefs.ErrUnavailable)
		}
		out = append(out, PortListener{Listener: l.(*net.TCPListener), Port: m.Port})
	}
	return out, nil
}

// Forward serves connections accepted on ls, forwarding each to its port
// in sandbox ref, until ctx ends (nil) or the sandbox stops running (an
// error). It closes the listeners when it returns.
func (e *Engine) Forward(ctx context.Context, ref string, ls []PortListener) error {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &forwarder{e: e, sb: sb, ctx: ctx}
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
			if cur, err := e.load(sb.ID); err != nil || cur.State != StateRunning {
				stopped = fmt.Errorf("sandbox %s is no longer running: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
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
	e   *Engine
	sb  *record
	ctx context.Context

	mu   sync.Mutex // guards sess and stop
	sess *yamux.Session
	stop func() // ends the current session's exec
}

func (f *forwarder) serve(l PortListener) {
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := l.Listener.AcceptTCP()
		if err != nil {
			if f.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				log.G(f.ctx).WithError(err).Warn("port forward: accept")
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			f.handle(c, l.Port)
		}()
	}
}

func (f *forwarder) handle(c *net.TCPConn, port uint16) {
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
	agent.Join(c, st)
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

// pipeConn is the host's end of the agent's stdin and stdout.
type pipeConn struct {
	io.Reader
	io.Writer
	closers []io.Closer
}

func (p *pipeConn) Close() error {
	for _, c := range p.closers {
		c.Close()
	}
	return nil
}

func (f *forwarder) startLocked() error {
	if f.stop != nil {
		f.stop()
	}
	sess, stop, err := f.e.agentSession(f.ctx, f.sb, "portmux", "", agent.PortMuxConfig())
	if err != nil {
		return err
	}
	f.sess, f.stop = sess, stop
	return nil
}

// agentSession runs the sandbox's agent in mode (portmux, supervise) as
// user ("" for root) under one runsc exec, and returns a yamux session
// over its stdin and stdout. It lasts until stop, ctx's end or the
// agent's exit.
func (e *Engine) agentSession(ctx context.Context, sb *record, mode, user string, cfg *yamux.Config) (*yamux.Session, func(), error) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(ctx)
	var errBuf capBuffer
	var p *runsc.ExecProcess
	var err error
	if user == "" {
		p, err = e.agentProcess(ctx, sb, []string{mode}, inR, outW, &errBuf)
	} else {
		var proc specs.Process
		if proc, err = e.process(sb, ExecRequest{Args: []string{agent.MountPath, mode}, User: user}); err == nil {
			p, err = e.runscFor(sb).Exec(ctx, sb.ID, proc, runsc.ExecOpts{Stdin: inR, Stdout: outW, Stderr: &errBuf})
		}
	}
	if err != nil {
		cancel()
		return nil, nil, err
	}
	go func() {
		p.Wait() //nolint:errcheck // the session ends with it
		outW.Close()
		inR.Close()
	}()
	sess, err := yamux.Client(&pipeConn{Reader: outR, Writer: inW, closers: []io.Closer{inW, outR}}, cfg)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return sess, func() { sess.Close(); cancel() }, nil
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stop != nil {
		f.stop()
	}
}

// ForwarderRef is a detached forwarder process of a sandbox.
type ForwarderRef struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// ForwarderArgs are the arguments the engine runs Options.SbxPath
// with for a sandbox's published ports: it must serve the listeners it
// inherits as fds 3, 4, ... (in the order of the mappings) with Forward,
// as `sbx port-forward --inherited` does.
func (e *Engine) ForwarderArgs(sb *record, ms []PortMapping) []string {
	args := []string{"--root", e.opts.Root, "--runsc", e.opts.RunscPath, "port-forward", "--inherited", sb.ID}
	for _, m := range ms {
		args = append(args, m.HostAddr()+":"+strconv.Itoa(int(m.Port)))
	}
	return args
}

// startForwarder starts sb's detached forwarder on ls. It survives the
// caller and ends with the sandbox (stop, rm) or when the sandbox stops.
func (e *Engine) startForwarder(sb *record, ls []PortListener) error {
	exe := e.opts.SbxPath
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return err
		}
	}
	var ms []PortMapping
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, l := range ls {
		ms = append(ms, l.Mapping())
		f, err := l.Listener.File()
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	logf, err := os.OpenFile(filepath.Join(e.sandboxDir(sb.ID), "forwarder.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(exe, e.ForwarderArgs(sb, ms)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = files
	// Its own session: no terminal's signal reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start port forwarder: %w", err)
	}
	start, err := procStartTime(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	sb.Ports = ms
	sb.Forwarder = &ForwarderRef{Pid: cmd.Process.Pid, Start: start}
	// It outlives a CLI that exits now; a long-lived caller reaps it.
	go cmd.Wait() //nolint:errcheck // its status is of no use
	return nil
}

// stopForwarder ends sb's detached forwarder, if it runs.
func stopForwarder(sb *record) {
	fw := sb.Forwarder
	if fw == nil || !sameProcess(fw.Pid, fw.Start) {
		return
	}
	syscall.Kill(fw.Pid, syscall.SIGTERM) //nolint:errcheck // it may be gone
	for i := 0; i < 100 && sameProcess(fw.Pid, fw.Start); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if sameProcess(fw.Pid, fw.Start) {
		syscall.Kill(fw.Pid, syscall.SIGKILL) //nolint:errcheck // it may be gone
	}
}
