package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/serve/envdpb/processpb"
)

// A server killed with SIGKILL while commands run and creates are in
// flight, then started again on the same state root and port: every
// sandbox that ran before is listed and usable (its files are there, it
// runs commands), no sandbox is left half-made (all that `hutch ls` shows are
// running and run commands), and the new server creates sandboxes.
func TestServeRestartAfterSIGKILL(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	key := s.tenantAdd("restart")
	s.serve()
	c := &client.Client{APIURL: s.url(""), APIKey: key}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Three sandboxes, each with a file of its own.
	before := map[string]*client.Sandbox{}
	for i := 0; i < 3; i++ {
		sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
		if err != nil {
			t.Fatalf("create %d: %v\nserver log:\n%s", i, err, s.logTail(20))
		}
		before[sb.ID] = sb
		if out, code, err := shRun(ctx, sb, "echo written-before-"+sb.ID+" > /tmp/marker && cat /tmp/marker"); err != nil || code != 0 || out != "written-before-"+sb.ID+"\n" {
			t.Fatalf("writing the marker in %s: %q, exit %d, %v", sb.ID, out, code, err)
		}
	}

	// Load: three clients a sandbox run commands in a loop until the
	// server dies under them.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var ran, wrong atomic.Int64
	var wrongMsg atomic.Value
	var load sync.WaitGroup
	for id, sb := range before {
		for k := 0; k < 3; k++ {
			load.Add(1)
			go func() {
				defer load.Done()
				for i := 0; i < 10_000 && loadCtx.Err() == nil; i++ {
					want := fmt.Sprintf("%s-%d-%d\n", id, k, i)
					out, code, err := shRun(loadCtx, sb, "echo "+strings.TrimSpace(want))
					if err != nil {
						continue // the server is gone, or going
					}
					ran.Add(1)
					if out != want || code != 0 {
						wrong.Add(1)
						wrongMsg.Store(fmt.Sprintf("%s: %q exit %d, want %q", id, out, code, want))
					}
				}
			}()
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ran.Load() < 30 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if ran.Load() < 30 {
		t.Errorf("only %d commands ran in 30s under load", ran.Load())
	}

	// Creates in flight when the server dies.
	type created struct {
		id  string
		err error
	}
	inflight := make(chan created, 3)
	for i := 0; i < 3; i++ {
		go func() {
			sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
			if err != nil {
				inflight <- created{err: err}
				return
			}
			inflight <- created{id: sb.ID}
		}()
	}
	time.Sleep(150 * time.Millisecond)
	s.cmd.Process.Kill()
	<-s.exited
	stopLoad()
	load.Wait()
	t.Logf("%d commands ran before the SIGKILL", ran.Load())
	if wrong.Load() > 0 {
		t.Errorf("%d commands answered wrongly before the SIGKILL; one: %v", wrong.Load(), wrongMsg.Load())
	}
	var answered []string
	for i := 0; i < 3; i++ {
		r := <-inflight
		if r.err == nil {
			answered = append(answered, r.id)
		}
	}
	t.Logf("creates in flight at the SIGKILL: %d of 3 answered before it", len(answered))

	// The same root and port, a new server.
	restartServer(t, s)
	for _, l := range strings.Split(s.logTail(50), "\n") {
		if strings.Contains(l, "removed") {
			t.Logf("new server: %s", l)
		}
	}

	t.Run("after the restart, hutch ls shows no sandbox half-made or stopped", func(t *testing.T) {
		for _, r := range s.list() {
			if r.State != "running" {
				t.Errorf("sandbox %s is %q after the restart, want running (or removed)", r.ID, r.State)
			}
		}
	})
	t.Run("every sandbox that ran before is listed and keeps its files and runs commands", func(t *testing.T) {
		listed, err := c.List(ctx, client.ListOptions{})
		if err != nil {
			t.Fatalf("list: %v\nserver log:\n%s", err, s.logTail(20))
		}
		byID := map[string]bool{}
		for _, in := range listed {
			byID[in.SandboxID] = true
		}
		for id := range before {
			if !byID[id] {
				t.Errorf("sandbox %s ran before the restart and is not listed after it (listed: %v)", id, sortedKeys(byID))
				continue
			}
			sb, err := c.Connect(ctx, id, 10*time.Minute)
			if err != nil {
				t.Errorf("connect %s: %v", id, err)
				continue
			}
			out, code, err := shRun(ctx, sb, "cat /tmp/marker && echo alive")
			if err != nil || code != 0 || out != "written-before-"+id+"\nalive\n" {
				t.Errorf("in %s after the restart: %q, exit %d, %v", id, out, code, err)
			}
		}
	})
	t.Run("every sandbox the state root holds runs commands, and the API lists each of them", func(t *testing.T) {
		listed, err := c.List(ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]bool{}
		for _, in := range listed {
			byID[in.SandboxID] = true
		}
		for _, r := range s.list() {
			if !byID[r.ID] {
				t.Errorf("hutch ls shows %s (%s), the API does not list it", r.ID, r.State)
				continue
			}
			sb, err := c.Connect(ctx, r.ID, 10*time.Minute)
			if err != nil {
				t.Errorf("connect %s: %v", r.ID, err)
				continue
			}
			if out, code, err := shRun(ctx, sb, "echo ok"); err != nil || code != 0 || out != "ok\n" {
				t.Errorf("in %s after the restart: %q, exit %d, %v", r.ID, out, code, err)
			}
		}
		for _, id := range answered {
			if !byID[id] {
				t.Errorf("create of %s was answered before the SIGKILL, and the sandbox is gone after the restart", id)
			}
		}
	})
	t.Run("the new server creates sandboxes", func(t *testing.T) {
		sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
		if err != nil {
			t.Fatalf("create: %v\nserver log:\n%s", err, s.logTail(20))
		}
		if out, code, err := shRun(ctx, sb, "echo new"); err != nil || code != 0 || out != "new\n" {
			t.Errorf("in the new sandbox %s: %q, exit %d, %v", sb.ID, out, code, err)
		}
	})

	listed, err := c.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range listed {
		if err := c.Kill(ctx, in.SandboxID); err != nil {
			t.Errorf("kill %s: %v", in.SandboxID, err)
		}
	}
	s.stopAndCheckClean()
}

// restartServer starts s again on its state root and port, after its
// process was killed, and waits until it answers GET /health.
func restartServer(t *testing.T, s *server) {
	t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	s.cmd = s.env.cmd(nil, s.args()...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	start := time.Now()
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start hutch serve again: %v", err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func() { s.cmd.Wait(); close(exited) }() //nolint:errcheck // the exit status is read from ProcessState
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("hutch serve exited at its restart: %v\nserver log:\n%s", s.cmd.ProcessState, s.logTail(40))
		default:
		}
		if resp, err := httpClient.Get(s.url("/health")); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("the new server answered on %s after %s", s.addr(), time.Since(start).Round(time.Millisecond))
				return
			}
		}
	}
	s.cmd.Process.Kill()
	<-exited
	t.Fatalf("the restarted server did not answer GET /health on %s within 60s\nserver log:\n%s", s.addr(), s.logTail(40))
}

// shRun runs script with /bin/sh -c as root in sb through the data plane
// and returns its output (stdout and stderr together) and exit code.
func shRun(ctx context.Context, sb *client.Sandbox, script string) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	no := false
	stream, err := sb.Process("root").Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}},
		Stdin:   &no,
	}))
	if err != nil {
		return "", 0, err
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if e := ev.GetEnd(); e != nil {
			return out.String(), int(e.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return out.String(), 0, err
	}
	return out.String(), 0, errors.New("the command's stream ended without its exit")
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
