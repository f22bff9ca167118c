package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// Port forwarding publishes a TCP port of a sandbox on the host. It is not
// egress and needs no network in the sandbox. A sandbox with a link made
// by root (network open or allow, kept by an update to none) is reached
// directly: the forwarder dials the port on the sandbox's own address,
// a connection from the host that the sandbox's firewall lets in as it
// lets in any the host opens, and splices the two connections. Otherwise,
// and for every connection that the sandbox refuses on its address (a
// server listening on its 127.0.0.1 only), the host hands the accepted
// connection to the sandbox's own kernel, which makes the connection to
// the port on its 127.0.0.1 and copies between the two (runsc's port
// forward, one call on the sandbox's control socket per connection;
// docs/decisions/0033, 0034; forward_kernel.go). With a runsc that
// cannot, a connection accepted on the host becomes a stream of one
// yamux session carried over the stdin and stdout of one `runsc exec` of
// the sandbox's agent ("portmux"), which dials the port on the sandbox's
// 127.0.0.1. One exec serves every connection; when it dies (the sandbox
// was paused and resumed, say) the next connection starts another.
// (docs/decisions/0024-direct-forwarding.md)

// PortMapping publishes a sandbox port on the host.
type PortMapping = policy.PortMapping

// PortListener is a bound host listener, a *net.TCPListener or a
// *net.UnixListener, and the sandbox port it forwards to.
type PortListener struct {
	Listener net.Listener
	Port     uint16
}

// Mapping is the mapping l serves, with the host port it actually got.
func (l PortListener) Mapping() PortMapping {
	if a, ok := l.Listener.Addr().(*net.UnixAddr); ok {
		return PortMapping{Socket: a.Name, Port: l.Port}
	}
	a := l.Listener.Addr().(*net.TCPAddr)
	return PortMapping{HostIP: a.IP.String(), HostPort: uint16(a.Port), Port: l.Port}
}

// ListenPorts binds every mapping on the host, or none: on error the ones
// bound are closed. A UNIX socket is made only in a directory no one but
// its owner (this process's user, or root) can write to, and only its
// owner can connect to it (listenSocket).
func ListenPorts(ms []PortMapping) ([]PortListener, error) {
	var out []PortListener
	for _, m := range ms {
		var l net.Listener
		var err error
		if m.Socket != "" {
			l, err = listenSocket(m)
		} else if l, err = net.Listen("tcp", m.HostAddr()); err != nil {
			err = fmt.Errorf("publish %s: %w: %w", m, err, errdefs.ErrUnavailable)
		}
		if err != nil {
			for _, o := range out {
				o.Listener.Close()
			}
			return nil, err
		}
		out = append(out, PortListener{Listener: l, Port: m.Port})
	}
	return out, nil
}

// listenSocket binds m's UNIX socket, mode 0600. Its directory must be
// one that no other user can write to, nor any directory above it but
// for sticky ones such as /tmp, all owned by this process's user or root:
// no one else can then replace the socket or move it away. An existing
// socket there that no one listens on is replaced; any other file is
// refused. The path is bound with its directory's symlinks resolved.
func listenSocket(m PortMapping) (*net.UnixListener, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("publish %s: %s: %w", m, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(m.Socket))
	if err != nil {
		return nil, bad("directory: %v", err)
	}
	if err := checkSocketDir(dir); err != nil {
		return nil, bad("%v", err)
	}
	path := filepath.Join(dir, filepath.Base(m.Socket))
	if len(path) > 107 {
		return nil, bad("path %s is too long for a UNIX socket", path)
	}
	switch fi, err := os.Lstat(path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, bad("%v", err)
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, bad("%s exists and is not a socket but %s", path, fileKind(fi.Mode()))
	default:
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("publish %s: something listens on %s already: %w", m, path, errdefs.ErrUnavailable)
		}
		// Left by a forwarder that was killed.
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("publish %s: remove a stale socket: %w", m, err)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w: %w", m, err, errdefs.ErrUnavailable)
	}
	// Before this, the mode is the umask's: the forwarder serves no
	// peer but the owner (peerIsOwner) in the meantime.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("publish %s: %w", m, err)
	}
	return l, nil
}

// fileKind names the type of a file of mode m.
func fileKind(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "a regular file"
	case fs.ModeSymlink:
		return "a symbolic link"
	case fs.ModeDir:
		return "a directory"
	}
	return "a special file (" + m.Type().String() + ")"
}

// checkSocketDir checks that dir, a path without symlinks, and the
// directories above it can be changed by no user but this process's and
// root: dir is writable by its owner only, the others too unless sticky.
func checkSocketDir(dir string) error {
	uid := uint32(os.Geteuid())
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil {
			return fmt.Errorf("directory %s: %w", d, err)
		}
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			return fmt.Errorf("%s is not a directory", d)
		case st.Uid != uid && st.Uid != 0:
			return fmt.Errorf("directory %s is owned by uid %d, not by this user or root", d, st.Uid)
		case d == dir && st.Mode&0o022 != 0:
			return fmt.Errorf("directory %s is writable by other users (mode %04o): want one only its owner can write", d, st.Mode&0o7777)
		case st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0:
			return fmt.Errorf("directory %s above the socket is writable by other users (mode %04o)", d, st.Mode&0o7777)
		}
		if d == "/" {
			return nil
		}
	}
}

// peerIsOwner reports whether the peer of c, accepted on a UNIX socket, is
// this process's user or root. The socket's mode already keeps others
// out; this holds even if its mode is changed.
func peerIsOwner(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return false
	}
	return cred.Uid == uint32(os.Geteuid()) || cred.Uid == 0
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
	// A link is made at create and kept until the sandbox stops, which
	// ends the forwarder.
	f := &forwarder{e: e, sb: sb, ctx: ctx, direct: directAddr(sb)}
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

func (f *forwarder) serve(l PortListener) {
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
		if uc, ok := c.(*net.UnixConn); ok && !peerIsOwner(uc) {
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

// directAddr is the address the host reaches sb at, or "".
func directAddr(sb *record) string {
	if !sb.Linked || sb.Rootless || sb.IP == "" {
		return ""
	}
	return sb.IP
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
	sess, stop, err := f.e.agentSession(f.ctx, f.sb, "portmux", "", wire.PortMuxConfig())
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
	// An OS pipe, not io.Pipe: the process's output is spliced into it
	// (runsc.Pipes) without passing through this process.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	if rc, err := outW.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 256<<10) }) //nolint:errcheck // a larger buffer is only faster
	}
	ctx, cancel := context.WithCancel(ctx)
	if user == "" {
		user = agentUser(ctx)
	}
	var errBuf capBuffer
	var p *runsc.ExecProcess
	var proc specs.Process
	if proc, err = e.process(sb, ExecRequest{Args: []string{wire.MountPath, mode}, User: user}); err == nil {
		// A forwarded connection waits for each frame: none is held
		// back to gather more (a supervised command's output is).
		p, err = e.runscFor(sb).Exec(ctx, sb.ID, proc, runsc.ExecOpts{Stdin: inR, Stdout: outW, Stderr: &errBuf, Interactive: mode == "portmux"})
	}
	if err != nil {
		cancel()
		outR.Close()
		outW.Close()
		return nil, nil, err
	}
	go func() {
		p.Wait() //nolint:errcheck // the session ends with it
		outW.Close()
		inR.Close()
	}()
	sess, err := yamux.Client(&pipeConn{Reader: outR, Writer: wire.CoalesceFrames(inW), closers: []io.Closer{inW, outR}}, cfg)
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
	if f.ctl != nil {
		f.ctl.Close()
	}
}

// ForwarderRef is a detached forwarder process of a sandbox.
type ForwarderRef struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// ForwarderArgs are the arguments the engine runs Options.HutchPath
// with for a sandbox's published ports: it must serve the listeners it
// inherits as fds 3, 4, ... (in the order of the mappings) with Forward,
// as `hutch port-forward --inherited` does.
func (e *Engine) ForwarderArgs(sb *record, ms []PortMapping) []string {
	args := []string{"--root", e.opts.Root, "--runsc", e.opts.RunscPath, "port-forward", "--inherited", sb.ID}
	for _, m := range ms {
		args = append(args, m.Spec())
	}
	return args
}

// startForwarder starts sb's detached forwarder on ls. It survives the
// caller and ends with the sandbox (stop, rm) or when the sandbox stops.
// With hutch-helper beside hutch, the process is hutch-helper until the first
// connection, when it execs the forwarder (the same PID).
func (e *Engine) startForwarder(sb *record, ls []PortListener) error {
	exe := e.opts.HutchPath
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
		f, err := l.Listener.(interface{ File() (*os.File, error) }).File()
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
	argv := append([]string{exe}, e.ForwarderArgs(sb, ms)...)
	if h := e.helperPath(); h != "" {
		// It holds the listeners and becomes the forwarder at the
		// first connection: published ports never used cost only it.
		argv = append([]string{h, "port-forward", "-listeners", strconv.Itoa(len(files)),
			"-sandbox", sandboxProcess(sb), "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = files
	// Its own session: no terminal's signal reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start port forwarder: %w", err)
	}
	start, err := assembly.ProcessStart(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	for _, l := range ls {
		if ul, ok := l.Listener.(*net.UnixListener); ok {
			// The forwarder's now: it removes the socket when it ends.
			ul.SetUnlinkOnClose(false)
		}
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
	if fw == nil || !assembly.SameProcess(fw.Pid, fw.Start) {
		return
	}
	syscall.Kill(fw.Pid, syscall.SIGTERM) //nolint:errcheck // it may be gone
	for i := 0; i < 100 && assembly.SameProcess(fw.Pid, fw.Start); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if assembly.SameProcess(fw.Pid, fw.Start) {
		syscall.Kill(fw.Pid, syscall.SIGKILL) //nolint:errcheck // it may be gone
		// It could not remove its sockets.
		for _, m := range sb.Ports {
			if fi, err := os.Lstat(m.Socket); m.Socket != "" && err == nil && fi.Mode().Type() == fs.ModeSocket {
				os.Remove(m.Socket)
			}
		}
	}
}
