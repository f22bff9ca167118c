package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"google.golang.org/protobuf/encoding/protojson"

	"sbx.dev/sbx/engine"
	processpb "sbx.dev/sbx/serve/envdpb/process"
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
// Commands without a terminal are supervised (engine.Supervisor): children
// of the sandbox's init, started over one agent session per sandbox. They
// survive pause and resume, and a server that restarts finds them again:
// a List, or a request for a PID or tag the table does not know, asks the
// sandbox's supervisor and attaches to the commands this service started.
// Commands on a terminal run through engine.Start, whose processes a
// restore kills: they do not survive a pause.

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

// command is what the service needs of a started command: an
// *engine.Command, or a fake in tests.
type command interface {
	Pid() int
	Signal(os.Signal) error
	Resize(engine.WinSize) error
	Wait() (int, error)
}

// supervisor is what the service needs of an engine.Supervisor, or a
// fake in tests.
type supervisor interface {
	Start(ctx context.Context, req engine.ExecRequest, meta []byte) (command, error)
	Attach(ctx context.Context, pid int, req engine.AttachRequest) (command, error)
	List(ctx context.Context) ([]engine.SupervisedProcess, error)
	Close()
}

// engineSupervisor is an engine.Supervisor as a supervisor.
type engineSupervisor struct{ sv *engine.Supervisor }

func (e engineSupervisor) Start(ctx context.Context, req engine.ExecRequest, meta []byte) (command, error) {
	c, err := e.sv.Start(ctx, req, meta)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (e engineSupervisor) Attach(ctx context.Context, pid int, req engine.AttachRequest) (command, error) {
	c, err := e.sv.Attach(ctx, pid, req)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (e engineSupervisor) List(ctx context.Context) ([]engine.SupervisedProcess, error) {
	return e.sv.List(ctx)
}

func (e engineSupervisor) Close() { e.sv.Close() }

// processService implements processpbconnect.ProcessHandler over an
// engine.
type processService struct {
	// start starts a command in a sandbox; supervise returns a
	// supervisor of a sandbox, bound to ctx (nil: every command goes
	// through start); stat fails with ErrNotFound for a path that does
	// not exist there; home is a user's home directory. The engine's,
	// but for tests.
	start     func(ctx context.Context, sandboxID string, req engine.ExecRequest) (command, error)
	supervise func(ctx context.Context, sandboxID string) (supervisor, error)
	stat      func(ctx context.Context, sandboxID, path string) error
	home      func(ctx context.Context, sandboxID, user string) (string, error)
	grace     time.Duration // subscriberGrace, but for tests

	// mu guards tables.
	mu     sync.Mutex
	tables map[string]*procTable
}

func newProcessService(eng *engine.Engine) *processService {
	return &processService{
		start: func(ctx context.Context, id string, req engine.ExecRequest) (command, error) {
			return eng.Start(ctx, id, req)
		},
		supervise: func(ctx context.Context, id string) (supervisor, error) {
			sv, err := eng.Supervisor(ctx, id)
			if err != nil {
				return nil, err
			}
			return engineSupervisor{sv}, nil
		},
		stat: func(ctx context.Context, id, path string) error {
			_, err := eng.Stat(ctx, id, path)
			return err
		},
		home: func(ctx context.Context, id, user string) (string, error) {
			u, err := eng.LookupUser(ctx, id, user)
			return u.Home, err
		},
		grace:  subscriberGrace,
		tables: map[string]*procTable{},
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
	sv   supervisor

	// adoptMu serializes attaching to supervised commands the table
	// does not know, so that each is attached once.
	adoptMu sync.Mutex
}

// supervisor returns the table's supervisor, making it if need be.
func (t *procTable) supervisor(s *processService, id string) (supervisor, error) {
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

// procMeta is what the service keeps with a supervised command, to list
// and follow it after a resume or a restart.
type procMeta struct {
	Tag    *string         `json:"tag,omitempty"`
	Config json.RawMessage `json:"config"`
	Stdin  bool            `json:"stdin,omitempty"`
}

// metaOf encodes a supervised command's metadata: its config without
// the environment, or without its arguments too, if it would not fit.
func metaOf(tag *string, cfg *processpb.ProcessConfig, stdin bool) []byte {
	for _, c := range []*processpb.ProcessConfig{
		cfg,
		{Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Cwd: cfg.Cwd},
		{Cmd: cfg.GetCmd(), Cwd: cfg.Cwd},
	} {
		raw, err := protojson.Marshal(c)
		if err != nil {
			continue
		}
		b, err := json.Marshal(procMeta{Tag: tag, Config: raw, Stdin: stdin})
		if err == nil && len(b) <= maxMeta {
			return b
		}
	}
	b, _ := json.Marshal(procMeta{Tag: tag, Config: json.RawMessage("{}"), Stdin: stdin})
	return b
}

// maxMeta is the most metadata a supervised command takes.
const maxMeta = 16 << 10

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
// the sandbox. Those on a terminal are killed; supervised ones go on in
// the sandbox (a pause keeps them), and a later request for the sandbox
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
	cmd    command
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

	t := s.table(id)
	var cmd command
	if s.supervise != nil && !p.tty {
		var sv supervisor
		if sv, err = t.supervisor(s, id); err == nil {
			cmd, err = sv.Start(ctx, xreq, metaOf(p.tag, cfg, stdinR != nil))
		}
	} else {
		cmd, err = s.start(t.ctx, id, xreq)
	}
	if err != nil {
		p.closeStdin()
		if stdinR != nil {
			stdinR.Close()
		}
		return connectError(err)
	}
	p.cmd = cmd
	p.pid = uint32(cmd.Pid())
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

// adopt attaches to the running supervised commands of sandbox id that
// this service started and its table does not know: the one sel names,
// or all with sel nil. It returns the one sel names, if found. Failures
// are logged: the sandbox may not run, or have no agent.
func (s *processService) adopt(ctx context.Context, id string, sel *processpb.ProcessSelector) *proc {
	t := s.table(id)
	sv, err := t.supervisor(s, id)
	if err != nil {
		slog.Debug("no supervisor to find processes", "sandbox", id, "err", err)
		return nil
	}
	t.adoptMu.Lock()
	defer t.adoptMu.Unlock()
	list, err := sv.List(ctx)
	if err != nil {
		slog.Debug("list supervised processes", "sandbox", id, "err", err)
		return nil
	}
	var found *proc
	for _, sp := range list {
		var m procMeta
		if !sp.Running || sp.Pid <= 0 || json.Unmarshal(sp.Meta, &m) != nil || m.Config == nil {
			continue
		}
		pid := uint32(sp.Pid)
		switch v := sel.GetSelector().(type) {
		case *processpb.ProcessSelector_Pid:
			if pid != v.Pid {
				continue
			}
		case *processpb.ProcessSelector_Tag:
			if m.Tag == nil || *m.Tag != v.Tag || (found != nil && found.pid < pid) {
				continue
			}
		}
		t.mu.Lock()
		known := t.procs[pid]
		t.mu.Unlock()
		if known != nil {
			if sel != nil {
				found = known
			}
			continue
		}
		cfg := &processpb.ProcessConfig{}
		if err := protojson.Unmarshal(m.Config, cfg); err != nil {
			continue
		}
		p := &proc{pid: pid, tag: m.Tag, config: cfg, hub: newHub(s.grace)}
		var stdinR *os.File
		if m.Stdin {
			if stdinR, p.stdin, err = os.Pipe(); err != nil {
				continue
			}
		}
		areq := engine.AttachRequest{Stdout: hubWriter{p.hub, outStdout}, Stderr: hubWriter{p.hub, outStderr}}
		if stdinR != nil {
			areq.Stdin = stdinR
		}
		cmd, err := sv.Attach(ctx, sp.Pid, areq)
		if err != nil {
			p.closeStdin()
			if stdinR != nil {
				stdinR.Close()
			}
			if !errors.Is(err, errdefs.ErrNotFound) {
				slog.Debug("attach to a supervised process", "sandbox", id, "pid", pid, "err", err)
			}
			continue
		}
		p.cmd = cmd
		t.mu.Lock()
		t.procs[pid] = p
		t.mu.Unlock()
		go s.reap(t, p, stdinR)
		if sel != nil {
			found = p
		}
	}
	return found
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

// endEvent describes how a command ended, as envd does from Go's
// os.ProcessState: a command killed by a signal (sent through SendSignal,
// or by its timeout) did not exit and has exit code -1.
func endEvent(code int, err error, sent syscall.Signal) *processpb.ProcessEvent_EndEvent {
	signaled := syscall.Signal(0)
	switch {
	case errors.Is(err, engine.ErrTimeout):
		signaled = syscall.SIGKILL
	case err == nil && sent != 0 && code == 128+int(sent):
		signaled = sent
	}
	if signaled != 0 {
		status := "signal: " + signaled.String()
		return &processpb.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: status, Error: &status}
	}
	if code < 0 {
		msg := "sbx could not run the command"
		if err != nil {
			msg = err.Error()
		}
		return &processpb.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: "unknown", Error: &msg}
	}
	ev := &processpb.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: "exit status " + strconv.Itoa(code)}
	switch {
	case err != nil:
		msg := err.Error()
		ev.Error = &msg
	case code != 0:
		ev.Error = &ev.Status
	}
	return ev
}

// outKind is the stream a command's output came on.
type outKind int

const (
	outStdout outKind = iota
	outStderr
	outPty
)

func dataEvent(kind outKind, b []byte) *processpb.ProcessEvent {
	d := &processpb.ProcessEvent_DataEvent{}
	switch kind {
	case outStdout:
		d.Output = &processpb.ProcessEvent_DataEvent_Stdout{Stdout: b}
	case outStderr:
		d.Output = &processpb.ProcessEvent_DataEvent_Stderr{Stderr: b}
	case outPty:
		d.Output = &processpb.ProcessEvent_DataEvent_Pty{Pty: b}
	}
	return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: d}}
}

// hubWriter publishes what a command writes on one of its outputs. It
// never fails: output nobody follows is dropped.
type hubWriter struct {
	h    *hub
	kind outKind
}

func (w hubWriter) Write(b []byte) (int, error) {
	w.h.publish(dataEvent(w.kind, append([]byte(nil), b...)))
	return len(b), nil
}

var _ io.Writer = hubWriter{}

// hub fans a command's events out to the streams that follow it.
type hub struct {
	grace time.Duration

	// pubMu serializes publishing: events reach every subscriber in one
	// order, and the end event last.
	pubMu sync.Mutex

	// mu guards subs, ended and detached.
	mu       sync.Mutex
	subs     map[*subscriber]struct{}
	ended    *processpb.ProcessEvent
	detached bool // the command went on without the service
}

// subscriber is one stream following a command.
type subscriber struct {
	// events carries the command's events, the end event last. It is
	// closed after the end event, or without it when the subscriber
	// fell behind and was cut off.
	events chan *processpb.ProcessEvent
	// gone is closed when the stream leaves.
	gone     chan struct{}
	goneOnce sync.Once
}

func newHub(grace time.Duration) *hub {
	return &hub{grace: grace, subs: map[*subscriber]struct{}{}}
}

// subscribe follows the command's events from now on. A command that has
// ended gives its end event at once.
func (h *hub) subscribe() *subscriber {
	sub := &subscriber{events: make(chan *processpb.ProcessEvent, subscriberBuffer), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended != nil {
		sub.events <- h.ended
		close(sub.events)
		return sub
	}
	if h.detached {
		close(sub.events)
		return sub
	}
	h.subs[sub] = struct{}{}
	return sub
}

// unsubscribe stops following: the stream left.
func (h *hub) unsubscribe(sub *subscriber) {
	sub.goneOnce.Do(func() { close(sub.gone) })
	h.mu.Lock()
	delete(h.subs, sub)
	h.mu.Unlock()
}

// publish delivers ev to every subscriber, waiting up to the grace for
// one that is full before cutting it off. Without subscribers, or after
// the end, ev is dropped.
func (h *hub) publish(ev *processpb.ProcessEvent) {
	h.pubMu.Lock()
	defer h.pubMu.Unlock()
	h.mu.Lock()
	if h.ended != nil || h.detached {
		h.mu.Unlock()
		return
	}
	subs := slices.Collect(maps.Keys(h.subs))
	h.mu.Unlock()
	for _, sub := range subs {
		if !h.deliver(sub, ev) {
			h.mu.Lock()
			_, still := h.subs[sub]
			delete(h.subs, sub)
			h.mu.Unlock()
			if still {
				close(sub.events)
			}
		}
	}
}

// finish delivers the end event to every subscriber and closes their
// channels; later subscribers get it at once.
func (h *hub) finish(end *processpb.ProcessEvent) {
	h.pubMu.Lock()
	defer h.pubMu.Unlock()
	h.mu.Lock()
	h.ended = end
	subs := slices.Collect(maps.Keys(h.subs))
	clear(h.subs)
	h.mu.Unlock()
	for _, sub := range subs {
		h.deliver(sub, end)
		close(sub.events)
	}
}

// detach closes every subscriber's channel without an end event: the
// service no longer follows the command. Later subscribers get a closed
// channel at once.
func (h *hub) detach() {
	h.pubMu.Lock()
	defer h.pubMu.Unlock()
	h.mu.Lock()
	h.detached = true
	subs := slices.Collect(maps.Keys(h.subs))
	clear(h.subs)
	h.mu.Unlock()
	for _, sub := range subs {
		close(sub.events)
	}
}

func (h *hub) isDetached() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.detached
}

// deliver sends ev to sub, waiting up to the grace while sub is full. It
// reports false if sub stayed full; a subscriber that left takes nothing
// more and is not waited for.
func (h *hub) deliver(sub *subscriber, ev *processpb.ProcessEvent) bool {
	select {
	case sub.events <- ev:
		return true
	case <-sub.gone:
		return true
	default:
	}
	t := time.NewTimer(h.grace)
	defer t.Stop()
	select {
	case sub.events <- ev:
		return true
	case <-sub.gone:
		return true
	case <-t.C:
		return false
	}
}
