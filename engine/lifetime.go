package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"hutch.dev/hutch/assembly"
)

// Actions when a sandbox's lifetime (CreateRequest.Timeout) ends.
const (
	OnTimeoutPause  = "pause"
	OnTimeoutStop   = "stop"
	OnTimeoutRemove = "rm"
)

// watchdogGrace is how long a new watchdog waits for the sandbox record to
// name it before it concludes that it is not wanted.
const watchdogGrace = 10 * time.Second

// checkLifetime validates a create's Timeout and OnTimeout.
func (e *Engine) checkLifetime(timeout time.Duration, onTimeout string) error {
	switch onTimeout {
	case "", OnTimeoutPause, OnTimeoutStop, OnTimeoutRemove:
	default:
		return fmt.Errorf("--on-timeout %q: want pause, stop or rm: %w", onTimeout, errdefs.ErrInvalidArgument)
	}
	if timeout < 0 {
		return fmt.Errorf("--timeout %s: must be positive: %w", timeout, errdefs.ErrInvalidArgument)
	}
	if timeout > 0 && len(e.opts.WatchdogCommand) == 0 {
		return fmt.Errorf("--timeout needs a watchdog command (engine.Options.WatchdogCommand): %w", errdefs.ErrNotImplemented)
	}
	return nil
}

// startWatchdog starts the process that enforces sb's lifetime, if it has
// one, and records it in sb (not saved). There is no daemon: each sandbox
// with a lifetime has one detached watchdog process (Options.
// WatchdogCommand + the sandbox ID, which calls RunWatchdog), in a session
// of its own so that no terminal signal reaches it. With hutch-helper
// beside hutch, that process is hutch-helper until the deadline, when it
// execs the watchdog command (the same PID). destroyRuntime kills it:
// stop, rm and pause end it, resume starts a new one.
func (e *Engine) startWatchdog(sb *record) error {
	if sb.Timeout == "" {
		return nil
	}
	d, err := time.ParseDuration(sb.Timeout)
	if err != nil {
		return err
	}
	deadline := time.Now().UTC().Add(d)
	sb.Deadline = &deadline
	if sb.OnTimeout == "" {
		sb.OnTimeout = OnTimeoutPause
	}
	argv := append(append([]string{}, e.opts.WatchdogCommand...), sb.ID)
	if h := e.helperPath(); h != "" {
		// It waits for the deadline and only then becomes the watchdog.
		argv = append([]string{h, "lifetime-watchdog", "-deadline", deadline.Format(time.RFC3339Nano),
			"-sandbox", sandboxProcess(sb), "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start lifetime watchdog: %w", err)
	}
	sb.WatchdogPid = cmd.Process.Pid
	sb.WatchdogStart, _ = assembly.ProcessStart(cmd.Process.Pid)
	// Reap it if it ends while we still run; it outlives us otherwise.
	go cmd.Wait() //nolint:errcheck
	return nil
}

// helperPath is the small binary beside hutch that runs a sandbox's host
// helpers (cmd/hutch-helper; docs/decisions/0026-sandbox-helpers.md), or ""
// if there is none: hutch then runs the helpers itself, as its hidden
// commands.
func (e *Engine) helperPath() string { return assembly.Helper(e.opts.HutchPath) }

// sandboxProcess is sb's runsc process as a helper's -sandbox flag
// (PID:START), or "" if it is not known: a helper ends with it.
func sandboxProcess(sb *record) string {
	if sb.Pid == 0 || sb.PidStart == 0 {
		return ""
	}
	return strconv.Itoa(sb.Pid) + ":" + strconv.FormatUint(sb.PidStart, 10)
}

// stopWatchdog kills sb's watchdog unless it is the calling process.
func stopWatchdog(sb *record) {
	pid := sb.WatchdogPid
	if pid == 0 || pid == os.Getpid() {
		return
	}
	if assembly.SameProcess(pid, sb.WatchdogStart) {
		syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be gone
		for i := 0; i < 200 && processAlive(pid) && !assembly.IsZombie(pid); i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// RunWatchdog is the body of a sandbox's lifetime watchdog: it waits for
// the sandbox's deadline and then pauses, stops or removes it as recorded.
// It returns early, doing nothing, once the record names another watchdog
// (the sandbox was resumed, stopped or removed meanwhile).
func (e *Engine) RunWatchdog(ctx context.Context, id string) error {
	// The record names this process only once its starter has saved it.
	started := time.Now()
	for {
		sb, err := e.load(id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if sb.WatchdogPid != os.Getpid() || sb.Deadline == nil || sb.State != StateRunning {
			if time.Since(started) < watchdogGrace {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return nil
		}
		wait := time.Until(*sb.Deadline)
		if wait <= 0 {
			return e.expire(ctx, sb)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(wait, time.Minute)):
		}
	}
}

func (e *Engine) expire(ctx context.Context, sb *record) error {
	log.G(ctx).WithField("sandbox", sb.ID).WithField("action", sb.OnTimeout).Info("lifetime ended")
	switch sb.OnTimeout {
	case OnTimeoutStop:
		_, err := e.Stop(ctx, sb.ID)
		return err
	case OnTimeoutRemove:
		return e.Remove(ctx, sb.ID, true)
	}
	_, err := e.Pause(ctx, sb.ID)
	return err
}

// SetTimeout gives running sandbox ref a new lifetime of d from now, with
// what happens at its end (OnTimeoutPause, OnTimeoutStop or
// OnTimeoutRemove; "" keeps the sandbox's, else pause). d = 0 removes the
// lifetime. The watchdog is replaced, so a shorter lifetime takes effect
// at once.
func (e *Engine) SetTimeout(ctx context.Context, ref string, d time.Duration, onTimeout string) (*Sandbox, error) {
	if err := e.checkLifetime(d, onTimeout); err != nil {
		return nil, err
	}
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	stopWatchdog(sb)
	sb.WatchdogPid, sb.WatchdogStart, sb.Deadline = 0, 0, nil
	sb.Timeout = ""
	if onTimeout != "" {
		sb.OnTimeout = onTimeout
	}
	if d > 0 {
		sb.Timeout = d.String()
		if err := e.startWatchdog(sb); err != nil {
			return nil, err
		}
	}
	if err := e.save(sb); err != nil {
		return nil, err
	}
	return sb.view(), nil
}
