package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	runsc "sbx.dev/sbx/runsc-sandbox"
	"sbx.dev/sbx/runsc-sandbox/agent"
)

// Run creates a sandbox for one command and runs it, as Create then Exec
// would, returning the sandbox and the command's status (Exec's). When
// the command can be given to the sandbox's init at boot (no TTY, no
// detach, no exec timeout, no secrets), it is: the init starts it as soon
// as the sandbox runs (sbx-init's first-command mode), sparing an exec,
// and the sandbox stops when it exits. Such a sandbox cannot be paused
// or forked, so a lifetime (whose end pauses by default) also keeps
// create then exec. The caller removes the sandbox; on an error before it exists,
// Run returns a nil Sandbox.
func (e *Engine) Run(ctx context.Context, creq CreateRequest, xreq ExecRequest) (*Sandbox, int, error) {
	if xreq.TTY || xreq.Detach || xreq.Timeout > 0 || len(creq.Secrets) > 0 || creq.Timeout > 0 {
		sb, err := e.Create(ctx, creq)
		if err != nil {
			return nil, -1, err
		}
		code, err := e.Exec(ctx, sb.ID, xreq)
		return sb, code, err
	}
	if len(xreq.Args) == 0 {
		return nil, -1, fmt.Errorf("run: no command given: %w", errdefs.ErrInvalidArgument)
	}
	f := &firstCommand{req: xreq}
	sb, err := e.create(ctx, creq, f)
	if err != nil {
		return nil, -1, err
	}
	code, err := f.wait(e, sb)
	return sb, code, err
}

// firstCommand is the command a sandbox's init starts at boot, and the
// host's ends of its descriptors (agent.FirstRequestFD and on).
type firstCommand struct {
	req ExecRequest

	request *os.File // the sandbox's end of the request pipe
	statusW *os.File // the sandbox's end of the status pipe
	status  *os.File // where the init writes the command's status
	pipes   *runsc.Pipes
	sandbox string
	r       *runsc.Runsc
}

// prepare renders the request for the init and makes the descriptors.
func (f *firstCommand) prepare(e *Engine, sb *Sandbox) (err error) {
	proc, err := e.process(sb, f.req)
	if err != nil {
		return err
	}
	msg, err := json.Marshal(agent.FirstRequest{
		Args: proc.Args, Env: proc.Env, Dir: proc.Cwd,
		UID: proc.User.UID, GID: proc.User.GID, Groups: proc.User.AdditionalGids,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	var reqW *os.File
	if f.request, reqW, err = os.Pipe(); err != nil {
		return err
	}
	go func() {
		reqW.Write(msg) //nolint:errcheck // a sandbox that failed to start reads nothing
		reqW.Close()
	}()
	if f.status, f.statusW, err = os.Pipe(); err != nil {
		return err
	}
	f.pipes, err = runsc.NewPipes(f.req.Stdin, f.req.Stdout, f.req.Stderr)
	return err
}

// passFiles are the descriptors the init gets, from agent.FirstRequestFD.
func (f *firstCommand) passFiles() []*os.File {
	return append([]*os.File{f.request, f.statusW}, f.pipes.Child[:]...)
}

// startIO starts moving the command's stdio, before the sandbox starts:
// the command runs as soon as the sandbox has booted, and its output is
// passed on as it comes, while runsc is still returning.
func (f *firstCommand) startIO(r *runsc.Runsc, id string) {
	f.r, f.sandbox = r, id
	f.pipes.Start()
}

// closeChild closes the sandbox's ends here, once it holds them (or never
// will).
func (f *firstCommand) closeChild() {
	for _, c := range []*os.File{f.request, f.statusW} {
		if c != nil {
			c.Close()
		}
	}
	f.request, f.statusW = nil, nil
	if f.pipes != nil {
		f.pipes.CloseChild()
	}
}

// close releases every descriptor of a command that will not run.
func (f *firstCommand) close() {
	f.closeChild()
	if f.status != nil {
		f.status.Close()
	}
	if f.pipes != nil {
		f.pipes.Close()
	}
}

// wait returns the command's status once the init has reported it and its
// output has been read.
func (f *firstCommand) wait(e *Engine, sb *Sandbox) (int, error) {
	done := make(chan struct{})
	defer close(done)
	if f.req.Signals != nil {
		go func() {
			for {
				select {
				case s := <-f.req.Signals:
					if sig, ok := s.(syscall.Signal); ok {
						// To the init, which passes it on.
						f.r.Kill(context.Background(), f.sandbox, sig, runsc.KillOpts{}) //nolint:errcheck // it may be gone
					}
				case <-done:
					return
				}
			}
		}()
	}
	line, _ := bufio.NewReader(f.status).ReadString('\n')
	f.status.Close()
	// A process the command left behind may still hold its output; the
	// sandbox is stopping.
	f.pipes.Finish(time.Second)
	kind, n, _ := strings.Cut(strings.TrimSpace(line), " ")
	code, err := strconv.Atoi(n)
	switch {
	case kind == "exit" && err == nil:
		return code, nil
	case kind == "signal" && err == nil:
		return 128 + code, nil
	case kind == "":
		// The sandbox ended before its init could report: killed,
		// perhaps by the host's OOM killer.
		return e.stoppedUnder(sb, f.req.Args[0])
	}
	return -1, errors.New("sandbox init: " + strings.TrimSpace(line))
}
