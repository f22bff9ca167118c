package serve

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/processpb"
	"hutch.dev/hutch/serve/placement"
)

// The process service is envd's process.Process: it starts commands in a
// sandbox and streams their events (start with the PID, output as it is
// produced, end with the exit status). A command outlives the stream that
// started it: any number of streams may Connect to it by PID or tag while
// it runs, each seeing the events from then on. Output produced while no
// stream is connected is dropped, as envd drops it.
//
// Each connected stream has a buffer of subscriberBuffer events. While one
// is full the command's output waits for it (as it would for a slow
// terminal), but for at most subscriberGrace: a stream that has taken
// nothing for that long is cut off with ResourceExhausted and the command
// goes on for the others. Memory is thus bounded by the number of streams,
// whatever the command writes.
//
// Commands are supervised (engine.Supervisor): children of the sandbox's
// init, started over one agent session per sandbox, those on a terminal
// with a pty of the sandbox's own. They survive pause and resume, and a
// server that restarts finds them again: a List, or a request for a PID
// or tag the table does not know, asks the sandbox's supervisor and
// attaches to the commands this service started.

const (
	// subscriberBuffer is how many events a stream may be behind.
	subscriberBuffer = 16
	// subscriberGrace is how long the output waits for a full stream.
	subscriberGrace = 10 * time.Second
	// defaultKeepalive is the keepalive interval when a request asks for
	// none, as envd's.
	defaultKeepalive = 90 * time.Second
	// inputTimeout bounds a write to a command's input that the command
	// does not read, when the request has no deadline of its own.
	inputTimeout = 30 * time.Second
)

// processService implements processpbconnect.ProcessHandler over a
// placement's processes.
type processService struct {
	// start starts a command in a sandbox; supervise returns a
	// supervisor of a sandbox, bound to ctx (nil: every command goes
	// through start); stat fails with ErrNotFound for a path that does
	// not exist there; home is a user's home directory. The
	// placement's (placement.Processes), but for tests.
	start     func(ctx context.Context, sandboxID string, req engine.ExecRequest) (placement.Command, error)
	supervise func(ctx context.Context, sandboxID string) (placement.Supervisor, error)
	stat      func(ctx context.Context, sandboxID, path string) error
	home      func(ctx context.Context, sandboxID, user string) (string, error)
	grace     time.Duration // subscriberGrace, but for tests

	// mu guards tables.
	mu     sync.Mutex
	tables map[string]*procTable
	// tracer makes each command's span, from its start to its exit.
	tracer trace.Tracer
}

// newProcessService runs commands with p.
func newProcessService(p placement.Processes) *processService {
	return &processService{
		start: p.Start, supervise: p.Supervise, stat: p.Stat, home: p.Home,
		grace:  subscriberGrace,
		tables: map[string]*procTable{},
		tracer: tracerOf(nil),
	}
}

// procTable is the running commands of one sandbox.
type procTable struct {
	// ctx bounds the life of the sandbox's commands on a terminal, and
	// of its supervisor session: forget ends it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards procs.
	mu    sync.Mutex
	procs map[uint32]*proc

	// svMu guards sv, the sandbox's supervisor once made.
	svMu sync.Mutex
	sv   placement.Supervisor

	// adoptMu serializes attaching to supervised commands the table
	// does not know, so that each is attached once.
	adoptMu sync.Mutex
}

// supervisor returns the table's supervisor, making it if need be.
func (t *procTable) supervisor(s *processService, id string) (placement.Supervisor, error) {
	t.svMu.Lock()
	defer t.svMu.Unlock()
	if t.sv == nil {
		if t.ctx.Err() != nil {
			return nil, fmt.Errorf("the processes of sandbox %s were dropped: %w", id, errdefs.ErrUnavailable)
		}
		sv, err := s.supervise(t.ctx, id)
		if err != nil {
			return nil, err
		}
		t.sv = sv
	}
	return t.sv, nil
}

// table returns the process table of sandbox id, making it if need be.
func (s *processService) table(id string) *procTable {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[id]
	if t == nil {
		ctx, cancel := context.WithCancel(context.Background())
		t = &procTable{ctx: ctx, cancel: cancel, procs: map[uint32]*proc{}}
		s.tables[id] = t
	}
	return t
}

// forget drops the processes of sandbox id: the server removes or pauses
// the sandbox. Supervised ones go on in the sandbox (a pause keeps
// them; others, started without a supervisor, are killed), and a later
// request for the sandbox
// attaches to them through a new supervisor session. Streams following
// them end with Unavailable.
func (s *processService) forget(sandboxID string) {
	s.mu.Lock()
	t := s.tables[sandboxID]
	delete(s.tables, sandboxID)
	s.mu.Unlock()
	if t != nil {
		t.cancel()
		t.svMu.Lock()
		if t.sv != nil {
			t.sv.Close()
		}
		t.svMu.Unlock()
	}
}

// proc is a command the service started and still tracks.
type proc struct {
	pid    uint32
	tag    *string
	config *processpb.ProcessConfig
	tty    bool
	cmd    placement.Command
	hub    *hub

	// stdinMu guards stdin, the write end of the command's input (its
	// terminal's, with tty); nil when the command has none or it was
	// closed.
	stdinMu sync.Mutex
	stdin   *os.File

	// sigMu guards sent: the last signal sent through SendSignal, to tell
	// a status of 128+N caused by it from an exit status.
	sigMu sync.Mutex
	sent  syscall.Signal

	// span is the command's span, ended by reap; nil for a command
	// adopted after a resume or a restart.
	span trace.Span
}

// requestSandbox is the sandbox the router resolved for the request.
func requestSandbox(ctx context.Context) (string, error) {
	id := targetOf(ctx).SandboxID
	if id == "" {
		return "", connect.NewError(connect.CodeInternal, errors.New("the request reached the process service without a sandbox"))
	}
	return id, nil
}

// lookup finds the command sel names in the request's sandbox.
func (s *processService) lookup(ctx context.Context, sel *processpb.ProcessSelector) (*proc, error) {
	id, err := requestSandbox(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	t := s.tables[id]
	s.mu.Unlock()
	var found *proc
	if t != nil {
		t.mu.Lock()
		switch v := sel.GetSelector().(type) {
		case *processpb.ProcessSelector_Pid:
			found = t.procs[v.Pid]
		case *processpb.ProcessSelector_Tag:
			for _, p := range t.procs {
				if p.tag != nil && *p.tag == v.Tag && (found == nil || p.pid < found.pid) {
					found = p
				}
			}
		}
		t.mu.Unlock()
	}
	if found != nil {
		return found, nil
	}
	if s.supervise != nil {
		// After a resume or a restart: the sandbox may know it.
		if found = s.adopt(ctx, id, sel); found != nil {
			return found, nil
		}
	}
	switch v := sel.GetSelector().(type) {
	case *processpb.ProcessSelector_Pid:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *processpb.ProcessSelector_Tag:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %s not found", v.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector: give a pid or a tag"))
}

// Start starts a command and streams its events until it ends. The
// command goes on if the stream goes away.
func (s *processService) Start(ctx context.Context, req *connect.Request[processpb.StartRequest], stream *connect.ServerStream[processpb.StartResponse]) error {
	id, err := requestSandbox(ctx)
	if err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd: no command given"))
	}
	user := requestUser(req.Header())
	timeout, err := requestTimeout(req.Header())
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	cwd := cfg.GetCwd()
	if cwd != "" && !path.IsAbs(cwd) {
		// As envd: ~ and relative paths are the user's home's.
		home, err := s.home(ctx, id, user)
		if err != nil {
			return connectError(fmt.Errorf("cwd %q is relative to the home of user %q: %w", cwd, user, err))
		}
		if cwd, err = resolvePath(cwd, home); err != nil {
			return connectError(err)
		}
	}
	p := &proc{
		tag:    req.Msg.Tag,
		config: cfg,
		tty:    req.Msg.Pty != nil,
		hub:    newHub(s.grace),
	}
	xreq := engine.ExecRequest{
		Args:    append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:     commandEnv(user, cfg.GetEnvs()),
		Workdir: cwd,
		User:    user,
		Timeout: timeout,
	}
	if p.tty {
		xreq.TTY = true
		xreq.Size = engine.WinSize{Rows: uint16(req.Msg.Pty.GetSize().GetRows()), Cols: uint16(req.Msg.Pty.GetSize().GetCols())}
		xreq.Stdout = hubWriter{p.hub, outPty}
		xreq.Stderr = hubWriter{p.hub, outPty}
	} else {
		xreq.Stdout = hubWriter{p.hub, outStdout}
		xreq.Stderr = hubWriter{p.hub, outStderr}
	}
	// As envd: input is open unless the request says otherwise; a
	// terminal always takes input.
	var stdinR *os.File
	if p.tty || req.Msg.Stdin == nil || req.Msg.GetStdin() {
		if stdinR, p.stdin, err = os.Pipe(); err != nil {
			return connectError(err)
		}
		xreq.Stdin = stdinR
	}
	// Subscribed before the command starts: this stream sees all of its
	// output.
	sub := p.hub.subscribe()
	defer p.hub.unsubscribe(sub)

	// The command's span lasts until it exits (reap), which may be
	// after this request ends. It names the program, not its arguments.
	tracer := s.tracer
	if tracer == nil {
		tracer = tracerOf(nil)
	}
	_, p.span = tracer.Start(ctx, "process", trace.WithAttributes(
		attrSandbox.String(id), attrCommand.String(cfg.GetCmd()), attribute.Bool("hutch.process.pty", p.tty)))
	t := s.table(id)
	var cmd placement.Command
	if s.supervise != nil {
		var sv placement.Supervisor
		if sv, err = t.supervisor(s, id); err == nil {
			cmd, err = sv.Start(ctx, xreq, metaOf(p.tag, cfg, stdinR != nil, p.tty))
		}
	} else {
		cmd, err = s.start(t.ctx, id, xreq)
	}
	if err != nil {
		p.closeStdin()
		if stdinR != nil {
			stdinR.Close()
		}
		endSpan(p.span, err)
		return connectError(err)
	}
	p.cmd = cmd
	p.pid = uint32(cmd.Pid())
	p.span.SetAttributes(attrPID.Int(int(p.pid)))
	if p.pid != 0 {
		t.mu.Lock()
		t.procs[p.pid] = p
		t.mu.Unlock()
	}
	go s.reap(t, p, stdinR)
	if p.pid == 0 && cwd != "" {
		// It did not start: a missing directory is the request's fault,
		// reported as envd reports it.
		if code, _ := cmd.Wait(); code == engine.ExitNotFound || code == engine.ExitNotExecutable {
			if err := s.stat(ctx, id, cwd); errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument) {
				return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist", cwd))
			}
		}
	}
	send := func(ev *processpb.ProcessEvent) error { return stream.Send(&processpb.StartResponse{Event: ev}) }
	return serveEvents(ctx, req.Header(), p, sub, send)
}

// reap waits for p's command, closes its input and ends its streams.
func (s *processService) reap(t *procTable, p *proc, stdinR *os.File) {
	code, err := p.cmd.Wait()
	p.closeStdin()
	if stdinR != nil {
		stdinR.Close()
	}
	t.mu.Lock()
	if t.procs[p.pid] == p {
		delete(t.procs, p.pid)
	}
	t.mu.Unlock()
	if p.span != nil {
		spanErr := err
		if errors.Is(err, engine.ErrDetached) {
			p.span.SetAttributes(attribute.Bool("hutch.process.detached", true))
			spanErr = nil
		} else {
			p.span.SetAttributes(attrExitCode.Int(code))
		}
		endSpan(p.span, spanErr)
	}
	if errors.Is(err, engine.ErrDetached) {
		// It goes on in the sandbox, where the next request finds it.
		p.hub.detach()
		return
	}
	if p.pid == 0 && err == nil {
		// It never ran, so nothing said why: say it as a shell would.
		switch code {
		case engine.ExitNotFound:
			p.hub.publish(dataEvent(p.errKind(), []byte(p.config.GetCmd()+": command not found\n")))
		case engine.ExitNotExecutable:
			p.hub.publish(dataEvent(p.errKind(), []byte(p.config.GetCmd()+": cannot execute\n")))
		}
	}
	p.sigMu.Lock()
	sent := p.sent
	p.sigMu.Unlock()
	end := endEvent(code, err, sent)
	if err != nil && !errors.Is(err, engine.ErrTimeout) {
		slog.Debug("process ended with an error", "pid", p.pid, "cmd", p.config.GetCmd(), "err", err)
	}
	p.hub.finish(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: end}})
}

func (p *proc) errKind() outKind {
	if p.tty {
		return outPty
	}
	return outStderr
}

// closeStdin closes the write end of the command's input.
func (p *proc) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

// Connect streams the events of a running command from now on: a start
// event with its PID, its output, and its end.
func (s *processService) Connect(ctx context.Context, req *connect.Request[processpb.ConnectRequest], stream *connect.ServerStream[processpb.ConnectResponse]) error {
	p, err := s.lookup(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := p.hub.subscribe()
	defer p.hub.unsubscribe(sub)
	send := func(ev *processpb.ProcessEvent) error { return stream.Send(&processpb.ConnectResponse{Event: ev}) }
	return serveEvents(ctx, req.Header(), p, sub, send)
}

// serveEvents sends the start event, then sub's events until the end
// event, with a keepalive event whenever the stream has been idle for the
// interval the request asks for.
func serveEvents(ctx context.Context, h interface{ Get(string) string }, p *proc, sub *subscriber, send func(*processpb.ProcessEvent) error) error {
	if err := send(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	interval := keepaliveInterval(h.Get(keepaliveHeader))
	if interval == 0 {
		interval = defaultKeepalive
	}
	keepalive := time.NewTicker(interval)
	defer keepalive.Stop()
	for {
		select {
		case ev, ok := <-sub.events:
			if !ok && p.hub.isDetached() {
				return connect.NewError(connect.CodeUnavailable, fmt.Errorf("process %d: the sandbox was paused or its processes dropped; the process goes on: connect again to follow it", p.pid))
			}
			if !ok {
				return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the stream fell behind the output of process %d and was cut off; connect again to follow it", p.pid))
			}
			if err := send(ev); err != nil {
				return err
			}
			if _, end := ev.Event.(*processpb.ProcessEvent_End); end {
				return nil
			}
			keepalive.Reset(interval)
		case <-keepalive.C:
			if err := send(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Keepalive{Keepalive: &processpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err() // connect answers Canceled or DeadlineExceeded
		}
	}
}

// List lists the running commands of the sandbox.
func (s *processService) List(ctx context.Context, req *connect.Request[processpb.ListRequest]) (*connect.Response[processpb.ListResponse], error) {
	id, err := requestSandbox(ctx)
	if err != nil {
		return nil, err
	}
	if s.supervise != nil {
		s.adopt(ctx, id, nil)
	}
	s.mu.Lock()
	t := s.tables[id]
	s.mu.Unlock()
	resp := &processpb.ListResponse{Processes: []*processpb.ProcessInfo{}}
	if t != nil {
		t.mu.Lock()
		for _, pid := range slices.Sorted(maps.Keys(t.procs)) {
			p := t.procs[pid]
			resp.Processes = append(resp.Processes, &processpb.ProcessInfo{Pid: pid, Tag: p.tag, Config: p.config})
		}
		t.mu.Unlock()
	}
	return connect.NewResponse(resp), nil
}

// SendInput writes to a command's input, or to its terminal.
func (s *processService) SendInput(ctx context.Context, req *connect.Request[processpb.SendInputRequest]) (*connect.Response[processpb.SendInputResponse], error) {
	p, err := s.lookup(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.input(ctx, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.SendInputResponse{}), nil
}

// StreamInput writes a client stream of input to a command, in order:
// first an event selecting the command, then data.
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[processpb.StreamInputRequest]) (*connect.Response[processpb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *processpb.StreamInputRequest_Start:
			var err error
			if p, err = s.lookup(ctx, ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *processpb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("input before the start event that selects the process"))
			}
			if err := p.input(ctx, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *processpb.StreamInputRequest_Keepalive:
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("stream input event: want start, data or keepalive"))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, connect.NewError(connect.CodeUnknown, fmt.Errorf("reading the input stream: %w", err))
	}
	return connect.NewResponse(&processpb.StreamInputResponse{}), nil
}

// input writes in to p's input: stdin to a command without a terminal,
// pty to one with.
func (p *proc) input(ctx context.Context, in *processpb.ProcessInput) error {
	var data []byte
	switch v := in.GetInput().(type) {
	case *processpb.ProcessInput_Stdin:
		if p.tty {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d runs on a terminal: send its input as pty, not stdin", p.pid))
		}
		data = v.Stdin
	case *processpb.ProcessInput_Pty:
		if !p.tty {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal: send its input as stdin, not pty", p.pid))
		}
		data = v.Pty
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input: want stdin or pty"))
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d: stdin is not open (start it with stdin, and do not close it)", p.pid))
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(inputTimeout)
	}
	p.stdin.SetWriteDeadline(deadline) //nolint:errcheck // a pipe takes deadlines
	if _, err := p.stdin.Write(data); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("process %d does not read its input", p.pid))
		}
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d no longer reads its input: %w", p.pid, err))
	}
	return nil
}

// SendSignal sends SIGTERM or SIGKILL to a command.
func (s *processService) SendSignal(ctx context.Context, req *connect.Request[processpb.SendSignalRequest]) (*connect.Response[processpb.SendSignalResponse], error) {
	p, err := s.lookup(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case processpb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case processpb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("invalid signal: %s", req.Msg.GetSignal()))
	}
	p.sigMu.Lock()
	p.sent = sig
	p.sigMu.Unlock()
	if err := p.cmd.Signal(sig); err != nil {
		return nil, connectError(fmt.Errorf("signal process %d: %w", p.pid, err))
	}
	return connect.NewResponse(&processpb.SendSignalResponse{}), nil
}

// Update resizes a command's terminal.
func (s *processService) Update(ctx context.Context, req *connect.Request[processpb.UpdateRequest]) (*connect.Response[processpb.UpdateResponse], error) {
	p, err := s.lookup(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if pty := req.Msg.Pty; pty != nil {
		size := pty.GetSize()
		if err := p.cmd.Resize(engine.WinSize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}); err != nil {
			return nil, connectError(fmt.Errorf("resize the terminal of process %d: %w", p.pid, err))
		}
	}
	return connect.NewResponse(&processpb.UpdateResponse{}), nil
}

// CloseStdin closes a command's input: it reads end of file.
func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[processpb.CloseStdinRequest]) (*connect.Response[processpb.CloseStdinResponse], error) {
	p, err := s.lookup(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.tty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d runs on a terminal, whose input has no end: send Ctrl+D (0x04) instead", p.pid))
	}
	p.closeStdin()
	return connect.NewResponse(&processpb.CloseStdinResponse{}), nil
}

// commandEnv is a command's environment: USER and LOGNAME as envd sets
// them, then the request's variables in a stable order.
func commandEnv(user string, envs map[string]string) []string {
	var env []string
	if _, err := strconv.Atoi(user); err != nil {
		env = append(env, "USER="+user, "LOGNAME="+user)
	}
	for _, k := range slices.Sorted(maps.Keys(envs)) {
		env = append(env, k+"="+envs[k])
	}
	return env
}

// requestTimeout is the timeout of a Connect request, which envd applies
// to the command it starts: the command is killed when it passes.
func requestTimeout(h interface{ Get(string) string }) (time.Duration, error) {
	v := h.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		return 0, fmt.Errorf("Connect-Timeout-Ms %q: want a number of milliseconds", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
