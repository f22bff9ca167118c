package engine

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/hashicorp/yamux"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/engine/forward"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// Port forwarding publishes a TCP port of a sandbox on the host
// (engine/forward): a detached forwarder process per sandbox serves the
// published ports' listeners, from the sandbox's create or resume until
// it stops.

// PortMapping publishes a sandbox port on the host.
type PortMapping = policy.PortMapping

// PortListener is a bound host listener and the sandbox port it forwards
// to (forward.Listener).
type PortListener = forward.Listener

// ListenPorts binds every mapping on the host, or none (forward.Listen).
func ListenPorts(ms []PortMapping) ([]PortListener, error) {
	return forward.Listen(ms)
}

// ListenOwnerSocket binds a UNIX socket at path for this process's user
// and root only: mode 0600, in a directory no other user can write to
// (forward.ListenSocket). A server on it checks each peer with
// SocketPeerUID as well.
func ListenOwnerSocket(path string) (*net.UnixListener, error) {
	return forward.ListenSocket(path)
}

// SocketPeerUID is the user of the peer of c, accepted on a UNIX socket
// (SO_PEERCRED).
func SocketPeerUID(c *net.UnixConn) (uint32, error) {
	return forward.PeerUID(c)
}

// Forward serves connections accepted on ls, forwarding each to its port
// in sandbox ref, until ctx ends (nil) or the sandbox stops running (an
// error). It closes the listeners when it returns.
func (e *Engine) Forward(ctx context.Context, ref string, ls []PortListener) error {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return err
	}
	// A link is made at create and kept until the sandbox stops, which
	// ends the forwarder.
	return forward.Serve(ctx, forwardee{e, sb}, directAddr(sb), ls, func() error {
		if cur, err := e.load(sb.ID); err != nil || cur.State != StateRunning {
			return fmt.Errorf("sandbox %s is no longer running: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
		}
		return nil
	})
}

// forwardee is a sandbox as engine/forward reaches it.
type forwardee struct {
	e  *Engine
	sb *record
}

func (f forwardee) ID() string      { return f.sb.ID }
func (f forwardee) ShortID() string { return f.sb.ShortID() }

func (f forwardee) ControlSocket() (string, error) {
	return f.e.runscFor(f.sb).ControlSocket(f.sb.ID)
}

func (f forwardee) PortMux(ctx context.Context) (*yamux.Session, func(), error) {
	return f.e.agentSession(ctx, f.sb, wire.ModePortMux, "", wire.PortMuxConfig())
}

// directAddr is the address the host reaches sb at, or "".
func directAddr(sb *record) string {
	if !sb.Linked || sb.Rootless || sb.IP == "" {
		return ""
	}
	return sb.IP
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
		p, err = e.runscFor(sb).Exec(ctx, sb.ID, proc, runsc.ExecOpts{Stdin: inR, Stdout: outW, Stderr: &errBuf, Interactive: mode == wire.ModePortMux})
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
