package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"

	"hutch.dev/hutch/serve/envdpb/processpb"
)

// ExecRequest is a program to start through the process service: Cmd
// with Args, not a shell line (RunRequest is one).
type ExecRequest struct {
	Cmd  string
	Args []string
	Envs map[string]string
	Cwd  string
	// User is the user to run as ("" for the server's default, "user").
	User string
	// Tag names the process for a later Connect; optional.
	Tag string
	// Stdin, if set, is the program's input, closed at its EOF; nil
	// gives the program no input.
	Stdin io.Reader
	// Stdout and Stderr, if set, get the output as it comes.
	Stdout, Stderr io.Writer
}

// Command is a started program.
type Command struct {
	// Pid is its PID in the sandbox.
	Pid  int
	sb   *Sandbox
	user string
	done chan struct{}
	res  Result
	err  error
}

// Start starts a program and returns once it runs, without waiting for
// it. ctx bounds the stream of its events (and so Wait and the output
// writers), not the program: a program whose stream ends goes on in the
// sandbox.
func (s *Sandbox) Start(ctx context.Context, req ExecRequest) (*Command, error) {
	cfg := &processpb.ProcessConfig{Cmd: req.Cmd, Args: req.Args, Envs: req.Envs}
	if req.Cwd != "" {
		cfg.Cwd = &req.Cwd
	}
	stdin := req.Stdin != nil
	start := &processpb.StartRequest{Process: cfg, Stdin: &stdin}
	if req.Tag != "" {
		start.Tag = &req.Tag
	}
	stream, err := s.Process(req.User).Start(ctx, connect.NewRequest(start))
	if err != nil {
		return nil, err
	}
	c := &Command{sb: s, user: req.User, done: make(chan struct{})}
	var out, errb strings.Builder
	// The first event is the start, with the PID; a program that does not
	// start may end at once.
	first := true
	for first && stream.Receive() {
		ev := stream.Msg().GetEvent()
		if st := ev.GetStart(); st != nil {
			c.Pid = int(st.GetPid())
			first = false
		}
	}
	if first {
		err := stream.Err()
		stream.Close()
		if err == nil {
			err = fmt.Errorf("sandbox %s: the process stream ended before the program started", s.ID)
		}
		return nil, err
	}
	go func() {
		defer close(c.done)
		defer stream.Close()
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			if d := ev.GetData(); d != nil {
				if b := d.GetStdout(); b != nil {
					out.Write(b)
					if req.Stdout != nil {
						req.Stdout.Write(b) //nolint:errcheck // the caller's writer
					}
				}
				if b := d.GetStderr(); b != nil {
					errb.Write(b)
					if req.Stderr != nil {
						req.Stderr.Write(b) //nolint:errcheck // the caller's writer
					}
				}
			}
			if e := ev.GetEnd(); e != nil {
				c.res = Result{ExitCode: int(e.GetExitCode()), Error: e.GetError(), Stdout: out.String(), Stderr: errb.String()}
				return
			}
		}
		c.err = stream.Err()
		if c.err == nil {
			c.err = fmt.Errorf("sandbox %s: the stream of process %d ended without its exit", s.ID, c.Pid)
		}
	}()
	if stdin {
		go c.feed(ctx, req.Stdin)
	}
	return c, nil
}

// feed sends r to the program's input and closes it.
func (c *Command) feed(ctx context.Context, r io.Reader) {
	p := c.sb.Process(c.user)
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: uint32(c.Pid)}}
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			in := &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}
			if _, serr := p.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: in})); serr != nil {
				return
			}
		}
		if err != nil {
			break
		}
	}
	p.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})) //nolint:errcheck // a program that ended needs no EOF
}

// Wait waits for the program's end, or ctx's.
func (c *Command) Wait(ctx context.Context) (*Result, error) {
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if c.err != nil {
		return nil, c.err
	}
	res := c.res
	return &res, nil
}

// Done is closed when the program's stream has ended.
func (c *Command) Done() <-chan struct{} { return c.done }

// Kill sends the program SIGKILL.
func (c *Command) Kill(ctx context.Context) error {
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: uint32(c.Pid)}}
	_, err := c.sb.Process(c.user).SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: processpb.Signal_SIGNAL_SIGKILL}))
	return err
}

// LogLine is one line of a sandbox's log.
type LogLine struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// Logs returns the last lines of a sandbox's log (limit 0: the server's
// default): the output of the processes started in the background by its
// init.
func (c *Client) Logs(ctx context.Context, id string, limit int) ([]LogLine, error) {
	p := "/sandboxes/" + url.PathEscape(id) + "/logs"
	if limit > 0 {
		p += "?" + url.Values{"limit": {fmt.Sprint(limit)}}.Encode()
	}
	var out struct {
		Logs []LogLine `json:"logs"`
	}
	if _, err := c.do(ctx, http.MethodGet, p, nil, &out); err != nil {
		return nil, err
	}
	return out.Logs, nil
}

// Health tells whether the server answers GET /health.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodGet, "/health", nil, nil)
	return err
}

// IsUnauthenticated tells whether err is the server's refusal of the API
// key (401).
func IsUnauthenticated(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Status == http.StatusUnauthorized
	}
	return false
}
