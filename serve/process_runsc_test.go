package serve

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/processpb"
	"hutch.dev/hutch/serve/envdpb/processpb/processpbconnect"
)

// runscSandbox starts a busybox sandbox under real runsc, with the
// binaries in HUTCH_BIN, and removes it at the end of the test. It skips
// unless HUTCH_INTEGRATION=1 and HUTCH_BIN are set, and needs root.
func runscSandbox(t *testing.T) (*engine.Engine, string) {
	t.Helper()
	bin := os.Getenv("HUTCH_BIN")
	if os.Getenv("HUTCH_INTEGRATION") == "" || bin == "" {
		t.Skip("needs runsc: set HUTCH_INTEGRATION=1 and HUTCH_BIN to the built bin/ directory")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the runsc tests of serve run as root")
	}
	eng, err := engine.Open(engine.Options{
		Root:                t.TempDir(),
		RunscPath:           filepath.Join(bin, "runsc"),
		InitPath:            filepath.Join(bin, "hutch-init"),
		DefaultImageArchive: filepath.Join(bin, "images", "busybox.tar"),
		HutchPath:           filepath.Join(bin, "hutch"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := eng.Create(ctx, engine.CreateRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := eng.Remove(context.Background(), sb.ID, true); err != nil {
			t.Errorf("remove sandbox: %v", err)
		}
	})
	return eng, sb.ID
}

// rootReq is a Start request as the SDK's commands.run makes it, for
// busybox: /bin/sh instead of bash, as root.
func rootReq(script string, stdin bool) *connect.Request[processpb.StartRequest] {
	req := connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-l", "-c", script}},
		Stdin:   &stdin,
	})
	req.Header().Set("Authorization", asUser("root").Get("Authorization"))
	req.Header().Set(keepaliveHeader, "50")
	return req
}

func TestProcessServiceRunsc(t *testing.T) {
	eng, id := runscSandbox(t)
	s := newProcessService(hostProcesses(eng))
	c := serveProcesses(t, s, id)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("run", func(t *testing.T) {
		req := rootReq(`echo out; echo err >&2; cd /tmp && pwd; echo "$GREETING"; exit 3`, false)
		req.Msg.Process.Envs = map[string]string{"GREETING": "hello"}
		st, err := c.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ev := follow(st)
		if ev.startPid(t) == 0 {
			t.Fatal("no PID")
		}
		out, errOut, _, end := ev.collect(t)
		if out != "out\n/tmp\nhello\n" || errOut != "err\n" {
			t.Fatalf("stdout %q stderr %q", out, errOut)
		}
		if end.GetExitCode() != 3 || !end.GetExited() || end.GetStatus() != "exit status 3" {
			t.Fatalf("end %v", end)
		}
	})

	t.Run("command not found", func(t *testing.T) {
		st, err := c.Start(ctx, rootReq("no-such-command-here", false))
		if err != nil {
			t.Fatal(err)
		}
		ev := follow(st)
		ev.startPid(t)
		_, errOut, _, end := ev.collect(t)
		if end.GetExitCode() != 127 || !strings.Contains(errOut, "no-such-command-here") {
			t.Fatalf("stderr %q end %v", errOut, end)
		}
	})

	t.Run("bad cwd", func(t *testing.T) {
		req := rootReq("pwd", false)
		cwd := "/no/such/dir"
		req.Msg.Process.Cwd = &cwd
		st, err := c.Start(ctx, req)
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
		}
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "cwd '/no/such/dir' does not exist") {
			t.Fatalf("start in a missing directory: %v", err)
		}
	})

	t.Run("background, input, list, connect, kill", func(t *testing.T) {
		tag := "reader"
		req := rootReq(`while read line; do echo "got $line"; done; echo eof`, true)
		req.Msg.Tag = &tag
		sctx, leave := context.WithCancel(ctx)
		st, err := c.Start(sctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ev := follow(st)
		pid := ev.startPid(t)
		leave() // a background command: the client leaves, it goes on
		for range ev.ch {
		}
		list, err := c.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetTag() != tag || ps[0].GetConfig().GetCmd() != "/bin/sh" {
			t.Fatalf("list %v", ps)
		}
		cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: tag}}}))
		if err != nil {
			t.Fatal(err)
		}
		ev = follow(cs)
		if got := ev.startPid(t); got != pid {
			t.Fatalf("connect: pid %d, want %d", got, pid)
		}
		sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
		if _, err := c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("a\nb\n")}}})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); err != nil {
			t.Fatal(err)
		}
		out, _, _, end := ev.collect(t)
		if out != "got a\ngot b\neof\n" || end.GetExitCode() != 0 {
			t.Fatalf("stdout %q end %v", out, end)
		}

		// A long one, killed.
		st, err = c.Start(ctx, rootReq("sleep 600", false))
		if err != nil {
			t.Fatal(err)
		}
		ev = follow(st)
		sel = &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: ev.startPid(t)}}
		if _, err := c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		if _, _, _, end := ev.collect(t); end.GetExited() || end.GetStatus() != "signal: killed" {
			t.Fatalf("end after SIGKILL: %v", end)
		}
	})

	t.Run("pty", func(t *testing.T) {
		req := connect.NewRequest(&processpb.StartRequest{
			Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-i"}, Envs: map[string]string{"PS1": "$ "}},
			Pty:     &processpb.PTY{Size: &processpb.PTY_Size{Cols: 91, Rows: 27}},
		})
		req.Header().Set("Authorization", asUser("0").Get("Authorization"))
		st, err := c.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ev := follow(st)
		pid := ev.startPid(t)
		if pid == 0 {
			t.Fatal("no PID")
		}
		sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
		if _, err := c.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{Process: sel, Pty: &processpb.PTY{Size: &processpb.PTY_Size{Cols: 101, Rows: 33}}})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: []byte("stty size; [ -t 0 ] && echo on-a-terminal; exit 7\n")}}})); err != nil {
			t.Fatal(err)
		}
		_, _, pty, end := ev.collect(t)
		if !strings.Contains(pty, "33 101\r\n") || !strings.Contains(pty, "on-a-terminal\r\n") {
			t.Fatalf("terminal output %q, want its new size 33 101, on a terminal", pty)
		}
		if end.GetExitCode() != 7 {
			t.Fatalf("end %v", end)
		}
	})

	t.Run("many at once", func(t *testing.T) {
		const clients, commands = 10, 10
		var wg sync.WaitGroup
		errs := make(chan string, clients*commands)
		for i := 0; i < clients; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < commands; j++ {
					st, err := c.Start(ctx, rootReq("echo $((6*7))", false))
					if err != nil {
						errs <- err.Error()
						return
					}
					var out string
					var end *processpb.ProcessEvent_EndEvent
					for st.Receive() {
						e := st.Msg().GetEvent()
						out += string(e.GetData().GetStdout())
						if e.GetEnd() != nil {
							end = e.GetEnd()
						}
					}
					if out != "42\n" || end.GetExitCode() != 0 || st.Err() != nil {
						errs <- out + " " + end.String()
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	})

	t.Run("forget detaches commands on a terminal too", func(t *testing.T) {
		req := connect.NewRequest(&processpb.StartRequest{
			Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "tty; sleep 600"}},
			Pty:     &processpb.PTY{Size: &processpb.PTY_Size{Cols: 80, Rows: 24}},
		})
		req.Header().Set("Authorization", asUser("root").Get("Authorization"))
		st, err := c.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ev := follow(st)
		pid := ev.startPid(t)
		if out := ev.next(t).GetData().GetPty(); !strings.HasPrefix(string(out), "/dev/pts/") {
			t.Fatalf("tty on the terminal printed %q", out)
		}
		s.forget(id)
		for range ev.ch {
		}
		if connect.CodeOf(ev.err) != connect.CodeUnavailable {
			t.Fatalf("stream after forget: %v, want unavailable", ev.err)
		}
		// A later request finds it through a new session, as a terminal.
		sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
		if _, err := c.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{Process: sel, Pty: &processpb.PTY{Size: &processpb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
			t.Fatalf("resize after forget: %v", err)
		}
		cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: sel}))
		if err != nil {
			t.Fatal(err)
		}
		ev = follow(cs)
		ev.startPid(t)
		if _, err := c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
			t.Fatal(err)
		}
		if _, _, _, end := ev.collect(t); end.GetStatus() != "signal: killed" {
			t.Fatalf("end after SIGKILL: %v", end)
		}
	})

	t.Run("forget detaches supervised commands", func(t *testing.T) {
		tag := "counter"
		req := rootReq(`i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done`, true)
		req.Msg.Tag = &tag
		st, err := c.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ev := follow(st)
		pid := ev.startPid(t)
		ev.next(t)
		s.forget(id)
		for range ev.ch {
		}
		if connect.CodeOf(ev.err) != connect.CodeUnavailable {
			t.Fatalf("stream after forget: %v, want unavailable", ev.err)
		}
		// A later request finds it, running, through a new session.
		list, err := c.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetTag() != tag || ps[0].GetConfig().GetCmd() != "/bin/sh" {
			t.Fatalf("list after forget: %v", ps)
		}
		killByTag(ctx, t, c, tag)
	})
}

// killByTag connects to the command tagged tag, checks that it still
// writes, and kills it.
func killByTag(ctx context.Context, t *testing.T, c processpbconnect.ProcessClient, tag string) {
	t.Helper()
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: tag}}
	cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(cs)
	ev.startPid(t)
	if out := ev.next(t).GetData().GetStdout(); len(out) == 0 {
		t.Fatal("no output from the re-attached command")
	}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end := ev.collect(t); end.GetExited() || end.GetStatus() != "signal: killed" {
		t.Fatalf("end after SIGKILL: %v", end)
	}
}

// A background command survives pause and resume, and a new server (a
// new service) finds it, with its tag, input and output.
func TestProcessServicePauseResumeRunsc(t *testing.T) {
	eng, id := runscSandbox(t)
	s := newProcessService(hostProcesses(eng))
	c := serveProcesses(t, s, id)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	tag := "echoer"
	req := rootReq(`while read line; do echo "got $line"; done`, true)
	req.Msg.Tag = &tag
	sctx, leave := context.WithCancel(ctx)
	st, err := c.Start(sctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ev := follow(st)
	pid := ev.startPid(t)
	leave()
	for range ev.ch {
	}

	s.forget(id) // as the server does before a pause
	if _, err := eng.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}

	// A restarted server: a new service knows nothing yet.
	s2 := newProcessService(hostProcesses(eng))
	c2 := serveProcesses(t, s2, id)
	defer s2.forget(id)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
	cs, err := c2.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	ev = follow(cs)
	if got := ev.startPid(t); got != pid {
		t.Fatalf("connect after resume: pid %d, want %d", got, pid)
	}
	if _, err := c2.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("again\n")}}})); err != nil {
		t.Fatal(err)
	}
	if out := ev.next(t).GetData().GetStdout(); string(out) != "got again\n" {
		t.Fatalf("output after resume: %q", out)
	}
	list, err := c2.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetTag() != tag {
		t.Fatalf("list after resume: %v", ps)
	}
	if _, err := c2.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end := ev.collect(t); end.GetExitCode() != 0 || !end.GetExited() {
		t.Fatalf("end after closing its input: %v", end)
	}
}
