package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	runsc "sbx.dev/sbx/runsc-sandbox"
	"sbx.dev/sbx/runsc-sandbox/agent"
)

// Run creates a sandbox for one command and runs it, as Create then Exec
// would, returning the sandbox and the command's status (Exec's). When
// the command can be given to the sandbox's init at boot (no TTY, no
// detach, no timeout, no secrets), it is: the init starts it as soon as
// the sandbox runs (sbx-init's first-command mode), sparing an exec, and
// the sandbox stops when it exits. Such a sandbox cannot be paused or
// forked. The caller removes the sandbox; on an error before it exists,
// Run returns a nil Sandbox.
func (e *Engine) Run(ctx context.Context, creq CreateRequest, xreq ExecRequest) (*Sandbox, int, error) {
	if xreq.TTY || xreq.Detach || xreq.Timeout > 0 || len(creq.Secrets) > 0 {
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

	child  []*os.File // the sandbox's ends, passed to runsc run
	status *os.File   // where the init writes the command's status
	stdinW *os.File
	// outputs are the command's stdout and stderr, read until the
	// command exits (and its output drains).
	outputs []*os.File
	copying sync.WaitGroup
	sandbox string
	r       *runsc.Runsc
}

// prepare renders the request for the init and makes the descriptors.
func (f *firstCommand) prepare(e *Engine, sb *Sandbox) error {
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
	ok := false
	defer func() {
		if !ok {
			f.close()
		}
	}()
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return err
	}
	f.child = append(f.child, reqR)
	go func() {
		reqW.Write(msg) //nolint:errcheck // a sandbox that failed to start reads nothing
		reqW.Close()
	}()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return err
	}
	f.status = statusR
	f.child = append(f.child, statusW)
	devnull := func() (*os.File, error) { return os.OpenFile(os.DevNull, os.O_RDWR, 0) }
	var stdin *os.File
	if f.req.Stdin != nil {
		if stdin, f.stdinW, err = os.Pipe(); err != nil {
			return err
		}
	} else if stdin, err = devnull(); err != nil {
		return err
	}
	f.child = append(f.child, stdin)
	for _, w := range []io.Writer{f.req.Stdout, f.req.Stderr} {
		var end *os.File
		if w == nil {
			if end, err = devnull(); err != nil {
				return err
			}
		} else {
			pr, pw, err := os.Pipe()
			if err != nil {
				return err
			}
			f.outputs = append(f.outputs, pr)
			end = pw
		}
		f.child = append(f.child, end)
	}
	ok = true
	return nil
}

// startIO starts moving the command's stdio, before the sandbox starts:
// the command runs as soon as the sandbox has booted, and its output is
// passed on as it comes, while runsc is still returning.
func (f *firstCommand) startIO(r *runsc.Runsc, id string) {
	f.r, f.sandbox = r, id
	k := 0
	for _, w := range []io.Writer{f.req.Stdout, f.req.Stderr} {
		if w == nil {
			continue
		}
		pr := f.outputs[k]
		k++
		f.copying.Add(1)
		go func() {
			defer f.copying.Done()
			io.Copy(w, pr) //nolint:errcheck // a failing writer ends the copy
		}()
	}
	if f.stdinW != nil {
		go func() {
			io.Copy(f.stdinW, f.req.Stdin) //nolint:errcheck // the command may stop reading
			f.stdinW.Close()
		}()
	}
}

func (f *firstCommand) closeChild() {
	for _, c := range f.child {
		c.Close()
	}
	f.child = nil
}

// close releases every descriptor of a command that will not run.
func (f *firstCommand) close() {
	f.closeChild()
	for _, c := range append([]*os.File{f.status, f.stdinW}, f.outputs...) {
		if c != nil {
			c.Close()
		}
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
	copied := make(chan struct{})
	go func() {
		f.copying.Wait()
		close(copied)
	}()
	select {
	case <-copied:
	case <-time.After(time.Second):
		// A process the command left behind still holds its output;
		// the sandbox is stopping.
	}
	for _, o := range f.outputs {
		o.Close()
	}
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
		if now, lerr := e.load(sb.ID); lerr == nil && now.OOMKilled {
			return ExitOOMKilled, oomError(now)
		}
		return -1, fmt.Errorf("sandbox %s stopped before %s finished", sb.ShortID(), f.req.Args[0])
	}
	return -1, errors.New("sandbox init: " + strings.TrimSpace(line))
}
