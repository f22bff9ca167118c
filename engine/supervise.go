package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/hashicorp/yamux"

	"hutch.dev/hutch/agent/wire"
)

// Supervised commands are children of the sandbox's init, started over
// one long-lived agent session per sandbox ("hutch-init supervise", one
// `runsc exec` for all of them): starting one costs a stream and a
// request, not an exec. Unlike the commands of Start they survive pause
// and resume (a `runsc exec` process does not), and they outlive the
// session that started them: when it ends (Close, or the sandbox was
// paused) they go on, their output discarded and their input kept open,
// and a later session lists them and attaches to them again. The init
// keeps the exit status of the last wire.MaxFinished that ended.
//
// A supervised command with ExecRequest.TTY runs on a terminal of the
// sandbox's own devpts, through the agent's pty mode (see tty.go): its
// input, size changes and signals travel as ptywire frames in its input,
// and its terminal, like the command, survives pause and resume.

// ErrDetached is returned by Wait for a supervised command whose
// supervisor session ended before it did: the command may still run,
// and Supervisor.Attach follows it again.
var ErrDetached = errors.New("detached from the command")

// Supervisor starts and attaches to supervised commands of one sandbox.
// It keeps one agent session, started at the first request and again at
// the next request after it ended. It is safe for concurrent use.
type Supervisor struct {
	e      *Engine
	sb     *record
	ctx    context.Context
	cancel context.CancelFunc
	// sessionUser, if set, runs the session as that user instead of
	// root: tests check what the init grants a client that is not root.
	sessionUser string

	// mu guards sess, stop and closed.
	mu     sync.Mutex
	sess   *yamux.Session
	stop   func() // ends the current session's exec
	closed bool
}

// SupervisedProcess is a supervised command as List reports it.
type SupervisedProcess struct {
	Pid  int
	UID  uint32
	Args []string
	// Meta is the metadata given to Start.
	Meta []byte
	// Running is false once it has ended; ExitCode is then its status
	// as Exec reports it (128+N for signal N, ExitTimeout).
	Running  bool
	ExitCode int
}

// AttachRequest says where an attached command's input comes from and
// where its output goes. Input is passed on only to a command that
// was started with input; the end of Stdin closes the command's input.
// TTY says that the command was started with a terminal: Stdin is then
// what is typed (its end does not end the terminal's input), Stdout the
// terminal's output, and Command.Resize sets its size.
type AttachRequest struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	TTY            bool
}

// Supervisor returns a supervisor of sandbox ref, which must be running.
// It is bound to ctx: when ctx ends, it is closed. The caller keeps it
// for the sandbox's life and closes it when done (and before pausing the
// sandbox: its session does not survive a restore).
func (e *Engine) Supervisor(ctx context.Context, ref string) (*Supervisor, error) {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	if sb.OneShot {
		return nil, fmt.Errorf("sandbox %s runs one command (run --rm) and supervises none: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Supervisor{e: e, sb: sb, ctx: ctx, cancel: cancel}
	context.AfterFunc(ctx, s.Close)
	return s, nil
}

// Close ends the session. Commands attached through it go on in the
// sandbox; their Wait returns ErrDetached.
func (s *Supervisor) Close() {
	s.mu.Lock()
	s.closed = true
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
	s.mu.Unlock()
	s.cancel()
}

func (s *Supervisor) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// open opens a stream, starting a session if there is none or the last
// one ended.
func (s *Supervisor) open() (*yamux.Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for try := 0; try < 2; try++ {
		if s.closed {
			return nil, fmt.Errorf("the supervisor of sandbox %s is closed: %w", s.sb.ShortID(), errdefs.ErrFailedPrecondition)
		}
		if s.sess == nil || s.sess.IsClosed() {
			if err := s.startLocked(); err != nil {
				return nil, err
			}
		}
		st, err := s.sess.OpenStream()
		if err == nil {
			return st, nil
		}
		s.sess.Close()
	}
	return nil, fmt.Errorf("supervisor of sandbox %s: the agent does not answer: %w", s.sb.ShortID(), errdefs.ErrUnavailable)
}

func (s *Supervisor) startLocked() error {
	if s.stop != nil {
		s.stop()
	}
	sess, stop, err := s.e.agentSession(s.ctx, s.sb, wire.ModeSupervise, s.sessionUser, wire.SuperviseMuxConfig())
	if err != nil {
		return err
	}
	s.sess, s.stop = sess, stop
	return nil
}

// streamWriter writes whole frames on a stream from several goroutines.
type streamWriter struct {
	mu sync.Mutex // guards st's writing side
	st *yamux.Stream
}

func (w *streamWriter) frame(kind byte, payload []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return wire.WriteFrame(w.st, kind, payload)
}

// request opens a stream, sends req on it and reads the reply. The
// stream is left open for what follows the reply.
func (s *Supervisor) request(ctx context.Context, req wire.SuperviseRequest) (*yamux.Stream, wire.SuperviseReply, error) {
	var r wire.SuperviseReply
	b, err := json.Marshal(req)
	if err != nil {
		return nil, r, err
	}
	st, err := s.open()
	if err != nil {
		return nil, r, err
	}
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	if err := wire.WriteFrame(st, wire.FrameRequest, b); err != nil {
		st.Close()
		return nil, r, s.sessionError(ctx, err)
	}
	kind, payload, err := wire.ReadFrame(st, wire.MaxRequest)
	if err != nil {
		st.Close()
		return nil, r, s.sessionError(ctx, err)
	}
	if kind != wire.FrameReply || json.Unmarshal(payload, &r) != nil {
		st.Close()
		return nil, r, fmt.Errorf("supervisor of sandbox %s: a malformed reply: %w", s.sb.ShortID(), errdefs.ErrUnknown)
	}
	return st, r, nil
}

func (s *Supervisor) sessionError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("supervisor of sandbox %s: %w: %w", s.sb.ShortID(), err, errdefs.ErrUnavailable)
}

// replyError is the error a reply reports.
func replyError(r wire.SuperviseReply) error {
	var kind error = errdefs.ErrUnavailable
	switch r.Kind {
	case wire.KindNotFound:
		kind = errdefs.ErrNotFound
	case wire.KindDenied:
		kind = errdefs.ErrPermissionDenied
	case wire.KindInvalid:
		kind = errdefs.ErrInvalidArgument
	}
	msg := r.Error
	if msg == "" {
		msg = "the supervisor gave no answer"
	}
	return fmt.Errorf("%s: %w", msg, kind)
}

// Start starts req as a supervised command, with meta (at most
// wire.MaxMeta bytes, returned by List) kept with it, and returns once
// it runs or once it is known that it could not start: Wait then says
// why, with the statuses Exec reports. The user, environment and
// working directory are resolved as for Exec; req.Timeout is enforced
// in the sandbox, attached or not. req.Detach is refused.
//
// ctx bounds the start only: the command runs until it ends or is
// killed, whatever becomes of ctx or of the supervisor.
func (s *Supervisor) Start(ctx context.Context, req ExecRequest, meta []byte) (*Command, error) {
	switch {
	case req.Detach:
		return nil, fmt.Errorf("start: a supervised command is already in the background: %w", errdefs.ErrInvalidArgument)
	case len(meta) > wire.MaxMeta:
		return nil, fmt.Errorf("start: metadata of %d bytes, at most %d allowed: %w", len(meta), wire.MaxMeta, errdefs.ErrInvalidArgument)
	}
	sb, proc, err := s.e.prepareExec(ctx, s.sb.ID, req)
	if err != nil {
		return nil, err
	}
	areq := wire.SuperviseRequest{
		Op: wire.OpStart, Args: proc.Args, Env: proc.Env, Dir: proc.Cwd,
		UID: proc.User.UID, GID: proc.User.GID,
		Stdin: req.Stdin != nil || req.TTY, Timeout: req.Timeout, Meta: meta,
	}
	if proc.Args[0] != req.Args[0] {
		// A wrapper (the secrets' agent) runs the command: tell 126
		// and 127 from the command itself.
		areq.Check = req.Args[0]
	}
	st, r, err := s.request(ctx, areq)
	if err != nil {
		return nil, err
	}
	p := &Command{e: s.e, sb: sb, proc: proc, req: req, done: make(chan struct{})}
	if r.Pid == 0 {
		st.Close()
		if r.Status == ExitNotFound || r.Status == ExitNotExecutable {
			p.code = r.Status
			close(p.done)
			return p, nil
		}
		return nil, replyError(r)
	}
	p.pid.Store(int64(r.Pid))
	p.sv = &supervisedCmd{s: s, w: &streamWriter{st: st}}
	stdin := p.superviseTTY(req.TTY, req.Stdin, req.Resize)
	stopSignals := forwardSignals(p, req.Signals, req.Started)
	go p.relay(stdin, req.Stdout, req.Stderr, true, stopSignals)
	return p, nil
}

// Attach follows supervised command pid from now on: its output from
// now on, and its end. A command that has ended gives its status at
// once. It fails with ErrNotFound for a PID the init does not know (or
// no longer remembers).
func (s *Supervisor) Attach(ctx context.Context, pid int, req AttachRequest) (*Command, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("attach: PID %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	st, r, err := s.request(ctx, wire.SuperviseRequest{Op: wire.OpAttach, Pid: pid})
	if err != nil {
		return nil, err
	}
	if r.Pid == 0 {
		st.Close()
		return nil, replyError(r)
	}
	args := r.Args
	if len(args) == 0 {
		args = []string{fmt.Sprintf("process %d", pid)}
	}
	p := &Command{e: s.e, sb: s.sb, req: ExecRequest{Args: args, Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr}, done: make(chan struct{})}
	p.pid.Store(int64(r.Pid))
	p.sv = &supervisedCmd{s: s, w: &streamWriter{st: st}}
	stdin := p.superviseTTY(req.TTY, req.Stdin, nil)
	go p.relay(stdin, req.Stdout, req.Stderr, r.Stdin, func() {})
	return p, nil
}

// List lists the supervised commands of the sandbox: those that run, and
// the last that ended.
func (s *Supervisor) List(ctx context.Context) ([]SupervisedProcess, error) {
	st, r, err := s.request(ctx, wire.SuperviseRequest{Op: wire.OpList})
	if err != nil {
		return nil, err
	}
	st.Close()
	if r.Error != "" {
		return nil, replyError(r)
	}
	out := make([]SupervisedProcess, 0, len(r.Procs))
	for _, pr := range r.Procs {
		sp := SupervisedProcess{Pid: pr.Pid, UID: pr.UID, Args: pr.Args, Meta: pr.Meta, Running: pr.Exit == nil}
		if pr.Exit != nil {
			sp.ExitCode = pr.Exit.Status()
			if pr.Exit.TimedOut {
				sp.ExitCode = ExitTimeout
			}
		}
		out = append(out, sp)
	}
	return out, nil
}

// signal sends sig to supervised command pid.
func (s *Supervisor) signal(pid int, sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	st, r, err := s.request(ctx, wire.SuperviseRequest{Op: wire.OpSignal, Pid: pid, Signal: int(sig)})
	if err != nil {
		return err
	}
	st.Close()
	if r.Error != "" {
		return replyError(r)
	}
	return nil
}

// supervisedCmd is what a Command started or attached by a Supervisor
// holds: its stream.
type supervisedCmd struct {
	s *Supervisor
	w *streamWriter
}

// superviseTTY sets up the terminal of a supervised command with tty:
// what it returns is its input, stdin and the sizes from resize (or from
// Resize, if nil) framed for the agent. Without tty it returns stdin.
func (p *Command) superviseTTY(tty bool, stdin io.Reader, resize <-chan WinSize) io.Reader {
	if !tty {
		return stdin
	}
	p.tty = true
	if resize == nil {
		p.resize = make(chan WinSize)
		resize = p.resize
	}
	p.pty = newPtyRelay(stdin, resize)
	return p.pty.r
}

// relay passes stdin to the command and its output to stdout and
// stderr until it ends or the stream does, then makes its status final.
func (p *Command) relay(stdin io.Reader, stdout, stderr io.Writer, hasStdin bool, stopSignals func()) {
	if p.pty != nil {
		// After the stream's end: the end of the frames must not reach
		// a command that goes on detached.
		defer p.pty.close()
	}
	defer close(p.done)
	defer stopSignals()
	w := p.sv.w
	defer w.st.Close()
	if stdin != nil && hasStdin {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := stdin.Read(buf)
				if n > 0 && w.frame(wire.FrameStdin, buf[:n]) != nil {
					return
				}
				if err != nil {
					if errors.Is(err, io.EOF) {
						w.frame(wire.FrameStdinEOF, nil) //nolint:errcheck // the command may be gone
					}
					return
				}
			}
		}()
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	for {
		kind, payload, err := wire.ReadFrame(w.st, wire.MaxRequest)
		if err != nil {
			p.code, p.err = p.detached()
			return
		}
		switch kind {
		case wire.FrameStdout:
			stdout.Write(payload) //nolint:errcheck // as runsc exec, a failing writer loses output
		case wire.FrameStderr:
			stderr.Write(payload) //nolint:errcheck // as runsc exec, a failing writer loses output
		case wire.FrameExit:
			var x wire.ExitInfo
			if err := json.Unmarshal(payload, &x); err != nil {
				p.code, p.err = -1, fmt.Errorf("%s: a malformed exit status from the supervisor: %w", p.req.Args[0], errdefs.ErrUnknown)
				return
			}
			p.code, p.err = p.supervisedResult(x)
			return
		}
	}
}

// supervisedResult turns a supervised command's end into Exec's status.
func (p *Command) supervisedResult(x wire.ExitInfo) (int, error) {
	cmd := p.req.Args[0]
	if x.TimedOut {
		return ExitTimeout, fmt.Errorf("%s: %w after %s and was killed", cmd, ErrTimeout, p.req.Timeout)
	}
	code := x.Status()
	if code >= 128 {
		if now, err := p.e.load(p.sb.ID); err == nil && now.OOMKilled {
			return ExitOOMKilled, oomError(now)
		}
	}
	return code, nil
}

// detached is the status of a command whose stream ended before it did:
// the sandbox stopped under it, or the session ended.
func (p *Command) detached() (int, error) {
	cmd := p.req.Args[0]
	if !p.sv.s.isClosed() {
		if now, err := p.e.load(p.sb.ID); err == nil && now.State == StateStopped {
			return p.e.stoppedUnder(p.sb, cmd)
		}
	}
	return -1, fmt.Errorf("%s (PID %d in sandbox %s): %w: its supervisor session ended, the command goes on: %w",
		cmd, p.Pid(), p.sb.ShortID(), ErrDetached, errdefs.ErrUnavailable)
}

// Supervised says whether the command is a supervised one.
func (p *Command) Supervised() bool { return p.sv != nil }
