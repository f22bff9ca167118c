package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/runsc"
)

// Run creates a sandbox for one command and runs it, as Create then Exec
// would, returning the sandbox and the command's status (Exec's). When it
// can (no TTY, no detach, no exec timeout, no secrets, no lifetime, no
// setup left to run), the command is the sandbox's init, as raw runsc runs
// one: `runsc run` without --detach starts it as soon as the sandbox has
// booted and ends with its status, and the sandbox stops when it exits
// (docs/decisions/0010). Such a sandbox cannot be paused or forked and
// takes no background exec; ls, exec, cp and logs work while it runs, and
// it dies with the calling process. The caller removes the sandbox; on an
// error before it exists, Run returns a nil Sandbox.
func (e *Engine) Run(ctx context.Context, creq CreateRequest, xreq ExecRequest) (*Sandbox, int, error) {
	if xreq.TTY || xreq.Detach || xreq.Timeout > 0 || len(creq.Secrets) > 0 || len(creq.SecretValues) > 0 || creq.Timeout > 0 ||
		!e.setupCached(ctx, creq) || e.poolServes(ctx, creq) {
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
	f := &initCommand{req: xreq}
	sb, err := e.create(ctx, creq, f)
	if err != nil {
		return nil, -1, err
	}
	code, err := f.wait(e, sb)
	return sb.view(), code, err
}

// setupCached reports whether req has no setup commands to run: none, or
// their result is cached. Setup commands run in the new sandbox before
// anything else, so a sandbox that has them to run cannot start with its
// command.
func (e *Engine) setupCached(ctx context.Context, req CreateRequest) bool {
	if len(req.Setup) == 0 {
		return true
	}
	img, err := e.Image(ctx, req.image())
	if err != nil {
		// Create reports it.
		return true
	}
	pr, err := e.validate(req)
	if err != nil {
		return true
	}
	_, _, hit, err := e.setupImageFor(ctx, img, req, pr.Secrets, req.SetupScope)
	return err != nil || hit
}

// initCommand is the command that is a sandbox's init (Run), and the
// host's ends of its stdio.
type initCommand struct {
	req ExecRequest

	proc  specs.Process
	pipes *runsc.Pipes
	run   *runsc.Attached
}

// prepare renders the command as an exec's process and makes its pipes.
func (f *initCommand) prepare(e *Engine, sb *record) (err error) {
	if f.proc, err = e.process(sb, f.req); err != nil {
		return err
	}
	f.pipes, err = runsc.NewPipes(f.req.Stdin, f.req.Stdout, f.req.Stderr)
	return err
}

// start runs the sandbox with runsc run, attached, and returns once the
// sandbox process's PID is known (written to pidFile before the command
// starts) or runsc has ended. The command's stdio moves from the start:
// its output is passed on as it comes.
func (f *initCommand) start(ctx context.Context, r *runsc.Runsc, id, bundle, pidFile string, out *os.File) (int, error) {
	f.pipes.Start()
	var err error
	f.run, err = r.RunAttached(ctx, id, bundle, runsc.AttachedOpts{
		PidFile: pidFile, Stdio: f.pipes.Child, Output: out,
	})
	// The sandbox has them now (or never will).
	f.pipes.CloseChild()
	if err != nil {
		return 0, err
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if pid, err := readPidFile(pidFile); err == nil {
			return pid, nil
		}
		select {
		case <-f.run.Done():
			// Ended before the PID could be read: Wait says why.
			return 0, nil
		case <-tick.C:
		}
	}
}

// close releases every descriptor of a command that will not run.
func (f *initCommand) close() {
	if f.pipes != nil {
		f.pipes.Close()
	}
}

// wait returns the command's status once runsc has ended and the command's
// output has been read.
func (f *initCommand) wait(e *Engine, sb *record) (int, error) {
	done := make(chan struct{})
	defer close(done)
	if f.req.Signals != nil {
		go func() {
			for {
				select {
				case s := <-f.req.Signals:
					if sig, ok := s.(syscall.Signal); ok {
						// To the command: it is the sandbox's init.
						f.run.Signal(context.Background(), sig) //nolint:errcheck // it may be gone
					}
				case <-done:
					return
				}
			}
		}()
	}
	if f.req.Started != nil {
		f.req.Started()
	}
	code, err := f.run.Wait()
	// The sandbox is gone, and with it anything that held the output.
	f.pipes.Finish(time.Second)
	var re *runsc.Error
	switch {
	case err == nil:
		if code == 128+int(syscall.SIGKILL) {
			// The host's OOM killer, hutch stop and hutch rm -f end the
			// whole sandbox, which runsc reports as its init killed.
			// Stop and rm hold the sandbox's lock from before they kill
			// it until its record says so (or is gone): taking it
			// waits for their word.
			now, unlock, lerr := e.getLocked(context.Background(), sb.ID)
			if lerr == nil {
				unlock()
			}
			switch {
			case lerr == nil && now.OOMKilled:
				return ExitOOMKilled, oomError(now)
			case lerr != nil || now.Stopped:
				return code, fmt.Errorf("sandbox %s stopped while %s ran", sb.ShortID(), f.req.Args[0])
			}
		}
		return code, nil
	case errors.As(err, &re):
		if code, msg, ok := notStarted(re.Stderr, f.req.Args[0]); ok {
			return code, errors.New(msg)
		}
	}
	if sb.Pid != 0 {
		// The sandbox was seen running.
		return e.stoppedUnder(sb, f.req.Args[0])
	}
	return -1, fmt.Errorf("start sandbox: %w", err)
}

// notStarted reads runsc's error for a command it could not start: 127
// when there is no such file, 126 when there is one that cannot be run.
// The texts are the pinned gVisor's (pkg/sentry/fsimpl/user/path.go, and
// runsc/boot's "failed to load" for a path that is given); a test runs
// both cases through real runsc.
func notStarted(runscErr, cmd string) (int, string, bool) {
	// The error is runsc's last line.
	line := strings.TrimSpace(runscErr)
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = strings.TrimSpace(line[i+1:])
	}
	var why string
	switch {
	case strings.Contains(line, "error finding executable "):
		// error finding executable "CMD" in PATH [...]: ERRNO
		_, errno, _ := strings.Cut(line[strings.Index(line, "error finding executable "):], "]: ")
		why = cmd + ": " + errno
		if errno == "no such file or directory" {
			why = cmd + ": command not found"
		}
	case strings.Contains(line, "failed to load "):
		// failed to load PATH: ERRNO
		why = line[strings.Index(line, "failed to load ")+len("failed to load "):]
	default:
		return 0, "", false
	}
	if strings.HasSuffix(line, "no such file or directory") {
		return ExitNotFound, why, true
	}
	return ExitNotExecutable, why, true
}
