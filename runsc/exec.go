package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ErrNotStarted is returned by ExecProcess.Wait when runsc could not start
// the process at all (no such executable, permission denied, bad working
// directory). runsc reports those with exit status 128 and no PID; callers
// that need docker's 126/127 classify the cause themselves.
var ErrNotStarted = errors.New("process did not start")

// ExecOpts are the options of Exec.
type ExecOpts struct {
	// Stdin, if non-nil, is copied into the process's stdin through a pipe;
	// nil gives the process /dev/null. Copying stops when Stdin reaches EOF
	// or the process exits, whichever is first.
	Stdin io.Reader
	// Stdout and Stderr receive the process's output as it is produced,
	// through pipes, in constant memory. nil discards.
	Stdout, Stderr io.Writer
	// Detach leaves the process running inside the sandbox; Wait then
	// returns as soon as it has started.
	Detach bool
	// ConsoleSocket receives the pty master when p.Terminal is set
	// (runsc serves it with Detach only).
	ConsoleSocket string
	// Terminal, if set, is a pty replica given to runsc exec as its
	// stdio and controlling terminal (the caller owns the master, and
	// runsc passes the replica in as the process's terminal): Stdin,
	// Stdout and Stderr are then unused. A process with p.Terminal needs
	// Terminal or ConsoleSocket.
	Terminal *os.File
	// Interactive is for a process that answers what it is sent, as the
	// agent's sessions do: its output is passed on the moment it comes,
	// never held back to gather a stream of small writes into fewer
	// copies (which saves wake-ups but costs an answer milliseconds).
	Interactive bool
	// IODrain bounds how long Wait keeps reading output after the process
	// has exited, for when a background child it started still holds the
	// output pipes. Zero means one second.
	IODrain time.Duration
}

// ExecProcess is a process started by Exec.
type ExecProcess struct {
	r      *Runsc
	id     string
	cmd    *exec.Cmd
	tmp    string
	stdinW *os.File
	done   chan struct{} // closed when runsc exec has exited

	killMu  sync.Mutex // guards waited and timeout
	waited  bool
	timeout bool

	// A plain exec runs without runsc exec, over the sandbox's control
	// socket (ctlexec.go): ctl is the process, or notStarted why it could
	// not start. cmd and tmp are then unused.
	ctl        *ctlProc
	notStarted error
	drain      time.Duration
}

// Exec starts p inside container id.
func (r *Runsc) Exec(ctx context.Context, id string, p specs.Process, o ExecOpts) (*ExecProcess, error) {
	if !p.Terminal && o.ConsoleSocket == "" && o.Terminal == nil && !o.Detach {
		e := &ExecProcess{r: r, id: id, done: make(chan struct{}), drain: o.IODrain}
		if e.drain == 0 {
			e.drain = time.Second
		}
		err := r.ctlExec(e, p, o)
		switch {
		case err == nil:
			e.watch(ctx)
			return e, nil
		case errors.Is(err, ErrNotStarted):
			e.notStarted = err
			return e, nil
		case !errors.Is(err, errNoControl):
			return nil, err
		}
	}
	if p.Terminal && o.ConsoleSocket == "" && o.Terminal == nil {
		return nil, fmt.Errorf("exec on a terminal needs a console socket or a pty replica: %w", errdefs.ErrInvalidArgument)
	}
	tmp, err := os.MkdirTemp("", "hutch-exec-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	procPath := filepath.Join(tmp, "process.json")
	if err := os.WriteFile(procPath, b, 0o600); err != nil {
		return nil, err
	}
	args := []string{"--process", procPath, "--internal-pid-file", filepath.Join(tmp, "pid")}
	if o.Detach {
		args = append(args, "--detach")
	}
	if o.ConsoleSocket != "" {
		args = append(args, "--console-socket", o.ConsoleSocket)
	}
	// Not CommandContext: killing runsc exec would orphan the process
	// inside the sandbox. Cancellation kills the sandboxed process instead.
	cmd := r.command(context.Background(), "exec", append(args, id)...)
	cmd.Stdout = writerOnly(o.Stdout)
	cmd.Stderr = writerOnly(o.Stderr)
	if o.Terminal != nil {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = o.Terminal, o.Terminal, o.Terminal
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		o.Stdin = nil
	}
	cmd.WaitDelay = o.IODrain
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = time.Second
	}
	e := &ExecProcess{r: r, id: id, cmd: cmd, tmp: tmp, done: make(chan struct{})}
	var stdinR *os.File
	if o.Stdin != nil && o.Terminal == nil {
		if stdinR, e.stdinW, err = os.Pipe(); err != nil {
			return nil, err
		}
		cmd.Stdin = stdinR
	}
	if err := cmd.Start(); err != nil {
		if stdinR != nil {
			stdinR.Close()
			e.stdinW.Close()
		}
		return nil, r.wrapErr("exec", err, nil)
	}
	if stdinR != nil {
		stdinR.Close()
		// Not waited for: a reader such as a terminal may never return,
		// and the process may exit without reading all of its input.
		go func() {
			io.Copy(e.stdinW, o.Stdin)
			e.stdinW.Close()
		}()
	}
	ok = true
	e.watch(ctx)
	return e, nil
}

// watch kills the process when ctx ends before it has been waited for.
func (e *ExecProcess) watch(ctx context.Context) {
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				e.killMu.Lock()
				defer e.killMu.Unlock()
				if !e.waited {
					e.timeout = true
					e.killLocked()
				}
			case <-e.done:
			}
		}()
	}
}

// writerOnly hides an *os.File behind io.Writer so that os/exec gives runsc
// a pipe: runsc writes to a regular file with offsets of its own.
func writerOnly(w io.Writer) io.Writer {
	if w == nil {
		return nil
	}
	return struct{ io.Writer }{w}
}

// killLocked sends SIGKILL to the process inside the sandbox. It needs the
// process's sandbox PID, which runsc writes once the process runs; until
// then it waits briefly for it.
func (e *ExecProcess) killLocked() {
	if e.ctl != nil {
		e.ctl.signal(e.id, syscall.SIGKILL) //nolint:errcheck // best effort: it may be gone
		return
	}
	for i := 0; i < 50; i++ {
		if pid, err := e.Pid(); err == nil {
			e.r.Kill(context.Background(), e.id, syscall.SIGKILL, KillOpts{Pid: pid}) //nolint:errcheck // best effort: it may be gone
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	// It never started: runsc exec itself is all there is to stop.
	e.cmd.Process.Kill() //nolint:errcheck // best effort
}

// Pid returns the process's PID inside the sandbox, once it has started.
func (e *ExecProcess) Pid() (int, error) {
	if e.ctl != nil {
		return int(e.ctl.pid), nil
	}
	if e.notStarted != nil {
		return 0, e.notStarted
	}
	b, err := os.ReadFile(filepath.Join(e.tmp, "pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Signal forwards sig to the process (runsc exec relays it).
func (e *ExecProcess) Signal(sig os.Signal) error {
	if e.notStarted != nil {
		return nil
	}
	if e.ctl != nil {
		s, ok := sig.(syscall.Signal)
		if !ok {
			return fmt.Errorf("signal %v: not a syscall.Signal", sig)
		}
		return e.ctl.signal(e.id, s)
	}
	return e.cmd.Process.Signal(sig)
}

// Wait waits for the process (or, detached, for its start) and returns its
// exit status. A process killed by a signal reports 128+signal. If the
// context given to Exec ended first, the process was killed and TimedOut
// reports true. ErrNotStarted means runsc could not start it.
func (e *ExecProcess) Wait() (int, error) {
	if e.ctl != nil || e.notStarted != nil {
		code, err := 128, e.notStarted
		if e.ctl != nil {
			code, err = e.ctl.wait(e.drain)
		}
		e.killMu.Lock()
		e.waited = true
		e.killMu.Unlock()
		close(e.done)
		return code, err
	}
	err := e.cmd.Wait()
	e.killMu.Lock()
	e.waited = true
	e.killMu.Unlock()
	close(e.done)
	defer os.RemoveAll(e.tmp)
	_, pidErr := e.Pid()
	started := pidErr == nil
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if !started {
			return exitCode(ee.ProcessState), fmt.Errorf("runsc exec: %w", ErrNotStarted)
		}
		return exitCode(ee.ProcessState), nil
	case errors.Is(err, exec.ErrWaitDelay):
		// The process exited; a child of it still holds the output.
		return exitCode(e.cmd.ProcessState), nil
	}
	return -1, err
}

// exitCode is a shell's view of an exit: the status, or 128+signal.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// TimedOut reports whether the process was killed because the context
// given to Exec ended.
func (e *ExecProcess) TimedOut() bool {
	e.killMu.Lock()
	defer e.killMu.Unlock()
	return e.timeout
}
