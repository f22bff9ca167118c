package runsc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// Attached is a container run by `runsc run` without --detach, as raw
// runsc runs one command: the container's init is the command itself,
// runsc waits for it, destroys the container and ends with its status
// (128+N for a signal N). The sandbox lives only as long as that runsc
// process: runsc gives the sandbox and gofer processes a parent-death
// signal (its attached mode), and the runsc process gets one from its
// caller, so a caller that dies takes the sandbox with it.
type Attached struct {
	r      *Runsc
	id     string
	done   chan struct{}
	err    error    // the runsc process's end, or why it did not start
	errf   *os.File // runsc's stdout and stderr
	from   int64    // where this run's output starts in errf
	remove bool     // errf is a temporary file
}

// AttachedOpts are RunAttached's options.
type AttachedOpts struct {
	// PidFile receives the sandbox process's host PID, once the sandbox
	// is made and before the command starts.
	PidFile string
	// Stdio is the command's stdin, stdout and stderr, given to the
	// sandbox as the init's descriptors 0, 1 and 2 (--pass-fd): runsc's
	// own stdio stays apart from it.
	Stdio [3]*os.File
	// Output receives runsc's own stdout and stderr (nil: a temporary
	// file). It must be a regular file: the sandbox inherits it and a
	// pipe would not see its end before the sandbox's.
	Output *os.File
}

// RunAttached starts `runsc run` of container id from the bundle at bundle
// and returns at once; Wait returns the command's status.
func (r *Runsc) RunAttached(ctx context.Context, id, bundle string, o AttachedOpts) (*Attached, error) {
	a := &Attached{r: r, id: id, done: make(chan struct{}), errf: o.Output}
	if a.errf == nil {
		f, err := os.CreateTemp("", "hutch-runsc-run-")
		if err != nil {
			return nil, err
		}
		a.errf, a.remove = f, true
	}
	a.from, _ = a.errf.Seek(0, io.SeekEnd)
	args := []string{"--bundle", bundle}
	if o.PidFile != "" {
		args = append(args, "--pid-file", o.PidFile)
	}
	for i := range o.Stdio {
		if o.Stdio[i] == nil {
			a.close()
			return nil, fmt.Errorf("runsc run: stdio %d missing", i)
		}
		args = append(args, fmt.Sprintf("--pass-fd=%d:%d", 3+i, i))
	}
	cmd := r.command(ctx, "run", append(args, id)...)
	cmd.ExtraFiles = o.Stdio[:]
	cmd.Stdout, cmd.Stderr = a.errf, a.errf
	// Parent-death signals fire when the thread that started the process
	// ends, not the process: that thread is held for the child's life.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(a.done)
		if a.err = cmd.Start(); a.err != nil {
			started <- a.err
			return
		}
		started <- nil
		a.err = cmd.Wait()
	}()
	if err := <-started; err != nil {
		a.close()
		return nil, r.wrapErr("run", err, nil)
	}
	return a, nil
}

// Signal sends sig to the command once it has started. runsc drops a
// signal other than SIGTERM and SIGKILL sent to a container that is
// created but not started, so Signal waits for the start, reading runsc's
// state, until runsc ends.
func (a *Attached) Signal(ctx context.Context, sig syscall.Signal) error {
	for {
		var st struct {
			Status string `json:"status"`
		}
		if err := a.r.readState(a.id, &st); err != nil || (st.Status != "creating" && st.Status != "created") {
			break
		}
		select {
		case <-a.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return a.r.Kill(ctx, a.id, sig, KillOpts{})
}

// Done is closed when runsc has ended.
func (a *Attached) Done() <-chan struct{} { return a.done }

// Wait returns the command's exit status once runsc has ended: its own,
// or 128+N if a signal N ended it. A failure of runsc's own (the command
// could not start, the sandbox failed, runsc was killed) is an *Error
// with runsc's message. runsc prints nothing of its own unless it fails
// (its logs go to files or nowhere: stdout and stderr are the
// application's), and then ends with 128: what it wrote tells its failure
// from the command's own status 128.
func (a *Attached) Wait() (int, error) {
	<-a.done
	defer a.close()
	if a.err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(a.err, &ee) {
		return -1, &Error{Sub: "run", Status: -1, Err: a.err}
	}
	code := ee.ExitCode()
	if out := a.output(); code < 0 || out != "" {
		return -1, &Error{Sub: "run", Status: code, Stderr: out, Err: a.err}
	}
	return code, nil
}

// output is what runsc wrote during this run.
func (a *Attached) output() string {
	if a.errf == nil {
		return ""
	}
	b, err := os.ReadFile(a.errf.Name())
	if err != nil || int64(len(b)) < a.from {
		return ""
	}
	return string(b[a.from:])
}

func (a *Attached) close() {
	if a.errf == nil {
		return
	}
	if a.remove {
		os.Remove(a.errf.Name())
		a.errf.Close()
	}
	a.errf = nil
}
