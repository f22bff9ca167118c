package serve

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/processpb"
	"hutch.dev/hutch/serve/envdpb/processpb/processpbconnect"
	"hutch.dev/hutch/serve/placement"
)

// fakeCmd plays a few commands, by their name, as the engine would run
// them:
//
//	echo ARGS...  prints ARGS on stdout, exits 0
//	fail          prints "oops" on stderr, exits 3
//	cat           copies its input to its output until end of file
//	sleep         waits for a signal (128+N) or its context (124)
//	nosuch        does not start: PID 0, status 127
type fakeCmd struct {
	pid  int
	req  engine.ExecRequest
	sigs chan os.Signal
	done chan struct{}
	code int
	err  error

	mu    sync.Mutex // guards sizes
	sizes []engine.WinSize
}

func (c *fakeCmd) Pid() int { return c.pid }

func (c *fakeCmd) Signal(sig os.Signal) error {
	select {
	case <-c.done:
		return fmt.Errorf("exited: %w", errdefs.ErrNotFound)
	case c.sigs <- sig:
		return nil
	}
}

func (c *fakeCmd) Resize(ws engine.WinSize) error {
	if !c.req.TTY {
		return fmt.Errorf("no terminal: %w", errdefs.ErrFailedPrecondition)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sizes = append(c.sizes, ws)
	return nil
}

func (c *fakeCmd) Wait() (int, error) {
	<-c.done
	return c.code, c.err
}

// fakeEngine starts fakeCmds and remembers the requests.
type fakeEngine struct {
	nextPid atomic.Int64
	mu      sync.Mutex // guards reqs
	reqs    []engine.ExecRequest
	cmds    []*fakeCmd
	dirs    map[string]bool // existing directories, for stat
}

func (f *fakeEngine) start(ctx context.Context, id string, req engine.ExecRequest) (placement.Command, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	if req.User == "nobody-here" {
		return nil, fmt.Errorf("user %q: no such user: %w", req.User, errdefs.ErrInvalidArgument)
	}
	c := &fakeCmd{pid: int(f.nextPid.Add(1)) + 99, req: req, sigs: make(chan os.Signal), done: make(chan struct{})}
	f.mu.Lock()
	f.cmds = append(f.cmds, c)
	f.mu.Unlock()
	out, errw := req.Stdout, req.Stderr
	if req.Workdir != "" && !f.dirs[req.Workdir] {
		c.pid = 0
		c.code = engine.ExitNotExecutable
		close(c.done)
		return c, nil
	}
	switch req.Args[0] {
	case "nosuch":
		c.pid = 0
		c.code = engine.ExitNotFound
		close(c.done)
		return c, nil
	case "echo":
		go func() {
			io.WriteString(out, strings.Join(req.Args[1:], " ")+"\n")
			close(c.done)
		}()
	case "fail":
		go func() {
			io.WriteString(errw, "oops\n")
			c.code = 3
			close(c.done)
		}()
	case "cat":
		copied := make(chan struct{})
		go func() {
			if req.Stdin != nil {
				io.Copy(out, req.Stdin)
			}
			close(copied)
		}()
		go func() {
			defer close(c.done)
			select {
			case <-copied:
			case s := <-c.sigs:
				c.code = 128 + int(s.(syscall.Signal))
			}
		}()
	case "sleep":
		go func() {
			defer close(c.done)
			select {
			case s := <-c.sigs:
				c.code = 128 + int(s.(syscall.Signal))
			case <-ctx.Done():
				c.code, c.err = engine.ExitTimeout, fmt.Errorf("sleep: %w", engine.ErrTimeout)
			}
		}()
	default:
		return nil, fmt.Errorf("fake engine: no command %q", req.Args[0])
	}
	return c, nil
}

func (f *fakeEngine) lastReq() engine.ExecRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reqs[len(f.reqs)-1]
}

func (f *fakeEngine) lastCmd() *fakeCmd {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cmds[len(f.cmds)-1]
}

func newFakeService() (*processService, *fakeEngine) {
	f := &fakeEngine{dirs: map[string]bool{"/tmp": true, "/home/user/work": true}}
	s := &processService{
		start: f.start,
		stat: func(ctx context.Context, id, p string) error {
			if f.dirs[p] {
				return nil
			}
			return fmt.Errorf("%s: %w", p, errdefs.ErrNotFound)
		},
		home: func(ctx context.Context, id, user string) (string, error) {
			if user == "root" {
				return "/root", nil
			}
			return "/home/" + user, nil
		},
		grace:  subscriberGrace,
		tables: map[string]*procTable{},
	}
	return s, f
}

// serveProcesses serves s for sandbox id as the server's router would:
// the target in the request's context.
func serveProcesses(t *testing.T, s *processService, id string) processpbconnect.ProcessClient {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(processpbconnect.NewProcessHandler(s))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(withTarget(r.Context(), target{Tenant: "t1", SandboxID: id})))
	}))
	t.Cleanup(srv.Close)
	return processpbconnect.NewProcessClient(srv.Client(), srv.URL, connect.WithProtoJSON())
}

// asUser is the header E2B's SDK sends to act as user.
func asUser(user string) http.Header {
	h := http.Header{}
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	return h
}

func startReq(cmd string, args ...string) *connect.Request[processpb.StartRequest] {
	no := false
	return connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: cmd, Args: args}, Stdin: &no})
}

// events is a stream's events, read in the background.
type events struct {
	ch  chan *processpb.ProcessEvent
	err error // once ch is closed
}

func follow[T interface {
	GetEvent() *processpb.ProcessEvent
}](s interface {
	Receive() bool
	Msg() T
	Err() error
}) *events {
	ev := &events{ch: make(chan *processpb.ProcessEvent, 1024)}
	go func() {
		for s.Receive() {
			ev.ch <- s.Msg().GetEvent()
		}
		ev.err = s.Err()
		close(ev.ch)
	}()
	return ev
}

// next returns the next event that is not a keepalive.
func (e *events) next(t *testing.T) *processpb.ProcessEvent {
	t.Helper()
	for {
		select {
		case ev, ok := <-e.ch:
			if !ok {
				t.Fatalf("stream ended: %v", e.err)
			}
			if ev.GetKeepalive() != nil {
				continue
			}
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no event in 10s")
		}
	}
}

// collect reads until the end event: the output by kind, and the end.
func (e *events) collect(t *testing.T) (stdout, stderr, pty string, end *processpb.ProcessEvent_EndEvent) {
	t.Helper()
	for {
		ev := e.next(t)
		if d := ev.GetData(); d != nil {
			stdout += string(d.GetStdout())
			stderr += string(d.GetStderr())
			pty += string(d.GetPty())
			continue
		}
		if end = ev.GetEnd(); end != nil {
			return
		}
		t.Fatalf("unexpected event %v", ev)
	}
}

func (e *events) startPid(t *testing.T) uint32 {
	t.Helper()
	ev := e.next(t)
	if ev.GetStart() == nil {
		t.Fatalf("first event %v, want start", ev)
	}
	return ev.GetStart().GetPid()
}

func TestProcessStartStreamsOutputAndEnd(t *testing.T) {
	s, _ := newFakeService()
	c := serveProcesses(t, s, "sb1")
	ctx := context.Background()

	st, err := c.Start(ctx, startReq("echo", "hello", "world"))
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	if pid := ev.startPid(t); pid == 0 {
		t.Fatal("start event without a PID")
	}
	out, errOut, _, end := ev.collect(t)
	if out != "hello world\n" || errOut != "" {
		t.Fatalf("stdout %q stderr %q", out, errOut)
	}
	if end.GetExitCode() != 0 || !end.GetExited() || end.GetStatus() != "exit status 0" || end.Error != nil {
		t.Fatalf("end %v, want exit status 0 without error", end)
	}

	st, err = c.Start(ctx, startReq("fail"))
	if err != nil {
		t.Fatal(err)
	}
	ev = follow(st)
	ev.startPid(t)
	out, errOut, _, end = ev.collect(t)
	if out != "" || errOut != "oops\n" {
		t.Fatalf("stdout %q stderr %q", out, errOut)
	}
	if end.GetExitCode() != 3 || !end.GetExited() || end.GetStatus() != "exit status 3" || end.GetError() != "exit status 3" {
		t.Fatalf("end %v, want exit status 3", end)
	}
}

func TestProcessStartRequest(t *testing.T) {
	s, f := newFakeService()
	c := serveProcesses(t, s, "sb1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cwd := "work"
	req := connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{
		Cmd: "echo", Args: []string{"-l", "-c", "x"}, Envs: map[string]string{"B": "2", "A": "1"}, Cwd: &cwd,
	}})
	req.Header().Set("Authorization", asUser("user").Get("Authorization"))
	st, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	ev.startPid(t)
	ev.collect(t)
	got := f.lastReq()
	if strings.Join(got.Args, " ") != "echo -l -c x" {
		t.Errorf("args %q", got.Args)
	}
	if strings.Join(got.Env, " ") != "USER=user LOGNAME=user A=1 B=2" {
		t.Errorf("env %q", got.Env)
	}
	if got.User != "user" || got.Workdir != "/home/user/work" {
		t.Errorf("user %q workdir %q, want user in /home/user/work", got.User, got.Workdir)
	}
	// The client's deadline is the command's timeout, as envd has it.
	if got.Timeout <= 25*time.Second || got.Timeout > 30*time.Second {
		t.Errorf("timeout %v, want the request's 30s", got.Timeout)
	}
	// Unset stdin is open (envd's default); stdin false is /dev/null.
	if got.Stdin == nil {
		t.Error("stdin unset in the request, and not open")
	}
	st, err = c.Start(ctx, startReq("echo"))
	if err != nil {
		t.Fatal(err)
	}
	ev = follow(st)
	ev.startPid(t)
	ev.collect(t)
	if f.lastReq().Stdin != nil {
		t.Error("stdin false in the request, and open")
	}
	// A request without a user acts as E2B's default user.
	if f.lastReq().User != placement.DefaultUser {
		t.Errorf("user %q, want %q", f.lastReq().User, placement.DefaultUser)
	}
}

func TestProcessStartErrors(t *testing.T) {
	s, _ := newFakeService()
	c := serveProcesses(t, s, "sb1")
	ctx := context.Background()

	// A server stream's error comes with its first Receive.
	check := func(what string, st interface {
		Receive() bool
		Err() error
	}, err error, code connect.Code, msg string) {
		t.Helper()
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
		}
		if connect.CodeOf(err) != code || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want %v with %q", what, err, code, msg)
		}
	}
	st, err := c.Start(ctx, startReq(""))
	check("no command", st, err, connect.CodeInvalidArgument, "no command")

	cwd := "/no/such"
	req := startReq("echo")
	req.Msg.Process.Cwd = &cwd
	st, err = c.Start(ctx, req)
	check("missing cwd", st, err, connect.CodeInvalidArgument, "cwd '/no/such' does not exist")

	req = startReq("echo")
	req.Header().Set("Authorization", asUser("nobody-here").Get("Authorization"))
	st, err = c.Start(ctx, req)
	check("unknown user", st, err, connect.CodeInvalidArgument, "nobody-here")

	// A command that cannot start ends with 127 and says why on stderr.
	st, err = c.Start(ctx, startReq("nosuch"))
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	ev.startPid(t)
	_, errOut, _, end := ev.collect(t)
	if end.GetExitCode() != 127 || !strings.Contains(errOut, "nosuch: command not found") {
		t.Fatalf("nosuch: stderr %q, end %v", errOut, end)
	}
}

func TestProcessConnectInputAndList(t *testing.T) {
	s, _ := newFakeService()
	c := serveProcesses(t, s, "sb1")
	ctx := context.Background()

	yes, tag, dir := true, "my-cat", "/tmp"
	st, err := c.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "cat", Envs: map[string]string{"K": "V"}, Cwd: &dir},
		Stdin:   &yes, Tag: &tag,
	}))
	if err != nil {
		t.Fatal(err)
	}
	first := follow(st)
	pid := first.startPid(t)

	list, err := c.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	ps := list.Msg.GetProcesses()
	if len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetTag() != tag || ps[0].GetConfig().GetCmd() != "cat" ||
		ps[0].GetConfig().GetEnvs()["K"] != "V" || ps[0].GetConfig().GetCwd() != "/tmp" {
		t.Fatalf("list %v, want the cat with its tag and config", ps)
	}

	// A second stream by tag sees the output from now on, as the first.
	cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	second := follow(cs)
	if got := second.startPid(t); got != pid {
		t.Fatalf("connect by tag: pid %d, want %d", got, pid)
	}
	byPid := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	if _, err := c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{
		Process: byPid, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("hi\n")}},
	})); err != nil {
		t.Fatal(err)
	}
	// Input sent as a terminal's is refused: it has none.
	_, err = c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{
		Process: byPid, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: []byte("x")}},
	}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("pty input to a process without a terminal: %v", err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: byPid})); err != nil {
		t.Fatal(err)
	}
	for i, ev := range []*events{first, second} {
		out, _, _, end := ev.collect(t)
		if out != "hi\n" || end.GetExitCode() != 0 {
			t.Fatalf("stream %d: stdout %q end %v", i, out, end)
		}
	}
	// Ended: gone from the table.
	cs, err = c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: byPid}))
	if err == nil {
		for cs.Receive() {
		}
		err = cs.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("connect to an ended process: %v, want not_found", err)
	}
	list, err = c.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("list after the end: %v %v", list.Msg.GetProcesses(), err)
	}
}

func TestProcessStreamInput(t *testing.T) {
	s, _ := newFakeService()
	c := serveProcesses(t, s, "sb1")
	ctx := context.Background()
	yes := true
	req := startReq("cat")
	req.Msg.Stdin = &yes
	st, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	pid := ev.startPid(t)

	in := c.StreamInput(ctx)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	msgs := []*processpb.StreamInputRequest{
		{Event: &processpb.StreamInputRequest_Start{Start: &processpb.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &processpb.StreamInputRequest_Keepalive{Keepalive: &processpb.StreamInputRequest_KeepAlive{}}},
	}
	for _, part := range []string{"one ", "two ", "three\n"} {
		msgs = append(msgs, &processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Data{Data: &processpb.StreamInputRequest_DataEvent{
			Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte(part)}},
		}}})
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatalf("stream input: %v", err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	if out, _, _, _ := ev.collect(t); out != "one two three\n" {
		t.Fatalf("stdout %q, want the input in order", out)
	}
}

func TestProcessOutlivesStreamAndSignals(t *testing.T) {
	s, _ := newFakeService()
	c := serveProcesses(t, s, "sb1")
	sctx, cancel := context.WithCancel(context.Background())
	st, err := c.Start(sctx, startReq("sleep"))
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	pid := ev.startPid(t)
	cancel() // the client goes away: the command goes on
	for range ev.ch {
	}

	ctx := context.Background()
	list, err := c.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 1 || list.Msg.GetProcesses()[0].GetPid() != pid {
		t.Fatalf("list after the stream left: %v %v", list.Msg.GetProcesses(), err)
	}
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	ev = follow(cs)
	ev.startPid(t)
	if _, err := c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	_, _, _, end := ev.collect(t)
	if end.GetExitCode() != -1 || end.GetExited() || end.GetStatus() != "signal: terminated" || end.GetError() != "signal: terminated" {
		t.Fatalf("end after SIGTERM: %v", end)
	}
	_, err = c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("signal to an ended process: %v, want not_found", err)
	}
}

func TestProcessUnknownSelector(t *testing.T) {
	s, _ := newFakeService()
	c := serveProcesses(t, s, "sb1")
	ctx := context.Background()
	for _, sel := range []*processpb.ProcessSelector{
		{Selector: &processpb.ProcessSelector_Pid{Pid: 4242}},
		{Selector: &processpb.ProcessSelector_Tag{Tag: "nope"}},
	} {
		calls := map[string]error{}
		_, calls["SendInput"] = c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
		_, calls["SendSignal"] = c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL}))
		_, calls["Update"] = c.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{Process: sel}))
		_, calls["CloseStdin"] = c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel}))
		cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: sel}))
		if err == nil {
			for cs.Receive() {
			}
			err = cs.Err()
		}
		calls["Connect"] = err
		for name, err := range calls {
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("%s %v: %v, want not_found", name, sel, err)
			}
		}
	}
}

func TestProcessTablesPerSandbox(t *testing.T) {
	s, _ := newFakeService()
	a := serveProcesses(t, s, "sbA")
	b := serveProcesses(t, s, "sbB")
	ctx := context.Background()
	st, err := a.Start(ctx, startReq("sleep"))
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	pid := ev.startPid(t)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}

	list, err := b.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("another sandbox lists %v %v", list.Msg.GetProcesses(), err)
	}
	if _, err := b.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("another sandbox signals the process: %v", err)
	}

	// Forgetting the sandbox (removed or paused) kills its commands.
	s.forget("sbA")
	_, _, _, end := ev.collect(t)
	if end.GetExited() || end.GetStatus() != "signal: killed" {
		t.Fatalf("end after forget: %v", end)
	}
	list, err = a.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("list after forget: %v %v", list.Msg.GetProcesses(), err)
	}
}

func TestProcessTerminal(t *testing.T) {
	s, f := newFakeService()
	c := serveProcesses(t, s, "sb1")
	ctx := context.Background()
	st, err := c.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "cat"},
		Pty:     &processpb.PTY{Size: &processpb.PTY_Size{Cols: 80, Rows: 24}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	pid := ev.startPid(t)
	req := f.lastReq()
	if !req.TTY || req.Size != (engine.WinSize{Rows: 24, Cols: 80}) || req.Stdin == nil {
		t.Fatalf("pty request: tty %v size %v stdin %v", req.TTY, req.Size, req.Stdin != nil)
	}
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	if _, err := c.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{Process: sel, Pty: &processpb.PTY{Size: &processpb.PTY_Size{Cols: 120, Rows: 40}}})); err != nil {
		t.Fatal(err)
	}
	cmd := f.lastCmd()
	cmd.mu.Lock()
	sizes := cmd.sizes
	cmd.mu.Unlock()
	if len(sizes) != 1 || sizes[0] != (engine.WinSize{Rows: 40, Cols: 120}) {
		t.Fatalf("sizes %v, want 40x120", sizes)
	}
	_, err = c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stdin input to a terminal: %v", err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("close stdin of a terminal: %v", err)
	}
	if _, err := c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: []byte("ls\r")}}})); err != nil {
		t.Fatal(err)
	}
	if got := ev.next(t).GetData().GetPty(); string(got) != "ls\r" {
		t.Fatalf("pty output %q", got)
	}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end := ev.collect(t); end.GetStatus() != "signal: killed" {
		t.Fatalf("end %v", end)
	}
}

func TestProcessStdinNotRequested(t *testing.T) {
	s, _ := newFakeService()
	c := serveProcesses(t, s, "sb1")
	ctx := context.Background()
	st, err := c.Start(ctx, startReq("sleep"))
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: ev.startPid(t)}}
	_, err = c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "stdin is not open") {
		t.Fatalf("input to a process started without stdin: %v", err)
	}
	// Closing what is not open is no error, as in envd.
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_UNSPECIFIED})); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("unspecified signal: %v", err)
	}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end := ev.collect(t); end.GetStatus() != "signal: killed" || end.GetExitCode() != -1 {
		t.Fatalf("end %v", end)
	}
}

func TestProcessKeepalive(t *testing.T) {
	s, _ := newFakeService()
	c := serveProcesses(t, s, "sb1")
	req := startReq("sleep")
	req.Header().Set(keepaliveHeader, "1")
	st, err := c.Start(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	ev.startPid(t)
	start := time.Now()
	select {
	case e := <-ev.ch:
		if e.GetKeepalive() == nil {
			t.Fatalf("event %v, want a keepalive", e)
		}
		if d := time.Since(start); d < 500*time.Millisecond || d > 3*time.Second {
			t.Fatalf("keepalive after %v, want about 1s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no keepalive in 5s with an interval of 1s")
	}
	s.forget("sb1")
}

// An idle stream that stops reading is cut off; the command and the
// other streams go on.
func TestHubSlowSubscriber(t *testing.T) {
	h := newHub(100 * time.Millisecond)
	slow := h.subscribe()
	fast := h.subscribe()
	var got atomic.Int64
	read := make(chan struct{})
	go func() {
		defer close(read)
		for range fast.events {
			got.Add(1)
		}
	}()
	const n = 200
	start := time.Now()
	for i := 0; i < n; i++ {
		h.publish(dataEvent(outStdout, []byte("x")))
	}
	h.finish(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: &processpb.ProcessEvent_EndEvent{}}})
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("publishing took %v: the slow subscriber held the output", d)
	}
	<-read
	if got.Load() != n+1 {
		t.Fatalf("fast subscriber got %d events, want %d and the end", got.Load(), n)
	}
	var slowGot int
	sawEnd := false
	for ev := range slow.events {
		slowGot++
		sawEnd = sawEnd || ev.GetEnd() != nil
	}
	if slowGot != subscriberBuffer || sawEnd {
		t.Fatalf("slow subscriber got %d events (end %v), want its buffer of %d and no end", slowGot, sawEnd, subscriberBuffer)
	}
}

func TestHubWithoutSubscribers(t *testing.T) {
	h := newHub(time.Hour)
	start := time.Now()
	for i := 0; i < 1000; i++ {
		h.publish(dataEvent(outStdout, []byte("dropped")))
	}
	if time.Since(start) > time.Second {
		t.Fatal("output nobody follows was waited for")
	}
	// A subscriber that leaves is not waited for either.
	gone := h.subscribe()
	h.unsubscribe(gone)
	for i := 0; i < 100; i++ {
		h.publish(dataEvent(outStdout, []byte("x")))
	}
	late := h.subscribe()
	h.publish(dataEvent(outStdout, []byte("seen")))
	h.finish(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: &processpb.ProcessEvent_EndEvent{ExitCode: 5}}})
	if ev := <-late.events; string(ev.GetData().GetStdout()) != "seen" {
		t.Fatalf("late subscriber got %v first", ev)
	}
	if ev := <-late.events; ev.GetEnd().GetExitCode() != 5 {
		t.Fatalf("late subscriber got %v, want the end", ev)
	}
	// After the end: the end at once, and output is dropped.
	h.publish(dataEvent(outStdout, []byte("after")))
	after := h.subscribe()
	if ev := <-after.events; ev.GetEnd().GetExitCode() != 5 {
		t.Fatalf("subscriber after the end got %v", ev)
	}
	if _, ok := <-after.events; ok {
		t.Fatal("events after the end event")
	}
}

func TestEndEvent(t *testing.T) {
	oom := errors.New("sandbox ran out of memory")
	for _, tc := range []struct {
		code   int
		err    error
		sent   syscall.Signal
		exit   int32
		exited bool
		status string
		errMsg string
	}{
		{0, nil, 0, 0, true, "exit status 0", ""},
		{1, nil, 0, 1, true, "exit status 1", "exit status 1"},
		{127, nil, 0, 127, true, "exit status 127", "exit status 127"},
		{137, nil, syscall.SIGKILL, -1, false, "signal: killed", "signal: killed"},
		{143, nil, syscall.SIGTERM, -1, false, "signal: terminated", "signal: terminated"},
		// 137 without a SIGKILL sent is the command's own status.
		{137, nil, syscall.SIGTERM, 137, true, "exit status 137", "exit status 137"},
		{engine.ExitTimeout, fmt.Errorf("x: %w", engine.ErrTimeout), 0, -1, false, "signal: killed", "signal: killed"},
		{engine.ExitOOMKilled, oom, 0, 137, true, "exit status 137", oom.Error()},
		{-1, errors.New("runsc failed"), 0, -1, false, "unknown", "runsc failed"},
	} {
		ev := endEvent(tc.code, tc.err, tc.sent)
		if ev.GetExitCode() != tc.exit || ev.GetExited() != tc.exited || ev.GetStatus() != tc.status || ev.GetError() != tc.errMsg {
			t.Errorf("endEvent(%d, %v, %v) = %v; want %d %v %q %q", tc.code, tc.err, tc.sent, ev, tc.exit, tc.exited, tc.status, tc.errMsg)
		}
	}
}

// Many clients running many commands on one sandbox: every stream gets
// its own output, and nothing is left running afterwards.
func TestProcessConcurrency(t *testing.T) {
	s, _ := newFakeService()
	mux := http.NewServeMux()
	mux.Handle(processpbconnect.NewProcessHandler(s))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(withTarget(r.Context(), target{Tenant: "t1", SandboxID: "busy"})))
	}))
	defer srv.Close()
	before := runtime.NumGoroutine()

	const clients, commands = 50, 40
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			c := processpbconnect.NewProcessClient(&http.Client{Transport: tr}, srv.URL, connect.WithProtoJSON())
			for j := 0; j < commands; j++ {
				want := fmt.Sprintf("client %d command %d", i, j)
				st, err := c.Start(context.Background(), startReq("echo", want))
				if err != nil {
					errs <- err
					return
				}
				var out strings.Builder
				var end *processpb.ProcessEvent_EndEvent
				for st.Receive() {
					ev := st.Msg().GetEvent()
					out.Write(ev.GetData().GetStdout())
					if e := ev.GetEnd(); e != nil {
						end = e
					}
				}
				if err := st.Err(); err != nil || end == nil || out.String() != want+"\n" {
					errs <- fmt.Errorf("%s: output %q end %v err %v", want, out.String(), end, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s.mu.Lock()
	left := len(s.tables["busy"].procs)
	s.mu.Unlock()
	if left != 0 {
		t.Errorf("%d processes still in the table", left)
	}
	srv.CloseClientConnections()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+5 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+5 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines, %d before the commands:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// fakeSupervisor knows supervised processes by PID; Attach plays them
// with the fake engine's commands.
type fakeSupervisor struct {
	f        *fakeEngine
	procs    []engine.SupervisedProcess
	mu       sync.Mutex // guards attached
	attached []int
}

func (s *fakeSupervisor) Start(ctx context.Context, req engine.ExecRequest, meta []byte) (placement.Command, error) {
	return s.f.start(ctx, "", req)
}

func (s *fakeSupervisor) Attach(ctx context.Context, pid int, req engine.AttachRequest) (placement.Command, error) {
	s.mu.Lock()
	s.attached = append(s.attached, pid)
	s.mu.Unlock()
	c, err := s.f.start(context.Background(), "", engine.ExecRequest{Args: []string{"sleep"}, Stdout: req.Stdout, Stderr: req.Stderr})
	if err != nil {
		return nil, err
	}
	c.(*fakeCmd).pid = pid
	return c, nil
}

func (s *fakeSupervisor) List(ctx context.Context) ([]engine.SupervisedProcess, error) {
	return s.procs, nil
}

func (s *fakeSupervisor) Close() {}

// After a restart, the service finds the commands it started in the
// sandbox's supervisor, and only those, and follows them.
func TestProcessAdoptsSupervised(t *testing.T) {
	s, f := newFakeService()
	tag := "server"
	sv := &fakeSupervisor{f: f, procs: []engine.SupervisedProcess{
		{Pid: 40, Running: true, Meta: metaOf(&tag, &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "serve"}}, false, false)},
		{Pid: 41, Running: true, Meta: []byte("not ours")},
		{Pid: 42, Running: false, ExitCode: 3, Meta: metaOf(nil, &processpb.ProcessConfig{Cmd: "true"}, false, false)},
	}}
	s.supervise = func(ctx context.Context, id string) (placement.Supervisor, error) { return sv, nil }
	c := serveProcesses(t, s, "sb1")
	ctx := context.Background()

	cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(cs)
	if pid := ev.startPid(t); pid != 40 {
		t.Fatalf("connect by tag: pid %d, want 40", pid)
	}
	list, err := c.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != 40 || ps[0].GetTag() != tag || ps[0].GetConfig().GetCmd() != "/bin/sh" {
		t.Fatalf("list: %v", ps)
	}
	// One that has ended is not followed: as envd, not found.
	ended, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: 42}}}))
	if err == nil {
		for ended.Receive() {
		}
		err = ended.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("connect to an ended process: %v, want not found", err)
	}
	sv.mu.Lock()
	attached := append([]int(nil), sv.attached...)
	sv.mu.Unlock()
	if len(attached) != 1 || attached[0] != 40 {
		t.Fatalf("attached to %v, want only 40, once", attached)
	}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: 40}}, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end := ev.collect(t); end.GetStatus() != "signal: killed" {
		t.Fatalf("end: %v", end)
	}
}
