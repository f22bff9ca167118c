package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
	"hutch.dev/hutch/assembly"
)

// Pause checkpoints sandbox ref's memory and filesystem into the image
// store and stops its processes: it then uses no CPU and no memory, and its
// state survives hutch restarts and host reboots. Resume continues it.
//
// The checkpoint is taken with the sandbox left running and recorded
// before the sandbox is stopped: if hutch dies halfway, the sandbox either
// still runs (no checkpoint recorded, the partial one invisible) or is
// paused. Pause returns once the sandbox process is killed; the rest of
// its runtime (runsc's state, its cgroup, its network and helpers) is
// removed by a detached hutch (FinishPause) while the kernel frees its
// memory, as `runsc checkpoint` returns without waiting for the sandbox
// it stops (docs/decisions/0029). Resume and Remove remove whatever is
// left of it first.
func (e *Engine) Pause(ctx context.Context, ref string) (*Sandbox, error) {
	sb, unlock, err := e.lockRunning(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := checkpointable(sb); err != nil {
		return nil, err
	}
	ck, err := e.checkpoint(ctx, sb)
	if err != nil {
		return nil, err
	}
	// The sandbox process is recorded no more: from here on its memory is
	// in the checkpoint, and whatever is left of it goes with its runtime
	// (destroyRuntime), which finds it by the sandbox's ID.
	proc := *sb
	sb.Paused, sb.Checkpoint, sb.Teardown = true, ck.Digest, true
	sb.Pid, sb.PidStart = 0, 0
	if err := e.save(sb); err != nil {
		e.images.RemoveCheckpoint(context.Background(), ck.Digest) //nolint:errcheck // best effort
		return nil, err
	}
	start := time.Now()
	// Kill it at once; the kernel frees its memory meanwhile.
	killSandboxProcess(&proc)
	sb.State = StatePaused
	if pid := e.spawnFinishPause(sb); pid != 0 {
		// Recorded so that whoever tears the runtime down first
		// (resume, stop, rm) ends it (stopFinisher).
		sb.FinisherPid = pid
		sb.FinisherStart, _ = assembly.ProcessStart(pid)
		phase(ctx, "pause: killed the sandbox, its end detached", start)
		return sb.view(), e.save(sb)
	}
	if err := e.images.SealCheckpoint(ctx, sb.Checkpoint); err != nil {
		return nil, fmt.Errorf("sandbox %s is paused, but checksumming its checkpoint failed: %w", sb.ShortID(), err)
	}
	if err := e.finishPause(ctx, sb); err != nil {
		return nil, fmt.Errorf("sandbox %s is paused, but stopping its processes failed: %w", sb.ShortID(), err)
	}
	phase(ctx, "pause: checksummed the checkpoint, stopped the sandbox", start)
	return sb.view(), nil
}

// FinishPauseCommand is the hutch subcommand that ends a pause (FinishPause):
// it checksums the checkpoint and removes what is left of the sandbox's
// runtime. Its arguments are the sandbox ID and the digest of the
// checkpoint the pause recorded.
const FinishPauseCommand = "__finish-pause"

// RemoveDroppedCommand is the hutch subcommand that deletes the files of
// checkpoints that are no longer used (RemoveDroppedCheckpoints).
const RemoveDroppedCommand = "__remove-dropped-checkpoints"

// spawnFinishPause starts a detached hutch that runs FinishPause for sb, and
// returns its PID, or 0 if it did not start.
func (e *Engine) spawnFinishPause(sb *record) int {
	return e.spawnDetached(FinishPauseCommand, sb.ID, sb.Checkpoint.String())
}

// stopFinisher kills sb's pause finisher, if it still runs and is not the
// calling process: the caller, which holds sb's lock, tears the runtime
// down itself, and the finisher, kept from the lock, would only find that
// done.
func stopFinisher(sb *record) {
	pid, start := sb.FinisherPid, sb.FinisherStart
	if pid == 0 || pid == os.Getpid() {
		return
	}
	sb.FinisherPid, sb.FinisherStart = 0, 0
	if assembly.SameProcess(pid, start) {
		syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be gone
		for i := 0; i < 200 && processAlive(pid) && !assembly.IsZombie(pid); i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// spawnDetached starts this engine's hutch, with its root and runsc, running
// hidden command args in a session of its own, and returns its PID, or 0
// if it did not start.
func (e *Engine) spawnDetached(args ...string) int {
	cmd := exec.Command(e.opts.HutchPath, append([]string{"--root", e.opts.Root, "--runsc", e.opts.RunscPath}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		log.L.WithError(err).WithField("command", args[0]).Warn("starting a detached hutch")
		return 0
	}
	// Reap it if it ends while we still run; it outlives us otherwise.
	go cmd.Wait() //nolint:errcheck
	return cmd.Process.Pid
}

// removeCheckpointLater makes checkpoint d invisible at once and has a
// detached hutch delete its files: freeing the page cache and the disk
// blocks of a large checkpoint takes the kernel tens of milliseconds that
// a resume or a fork need not wait for.
func (e *Engine) removeCheckpointLater(ctx context.Context, d digest.Digest) error {
	if err := e.images.DropCheckpoint(ctx, d); err != nil {
		return err
	}
	if e.spawnDetached(RemoveDroppedCommand) == 0 {
		return e.images.RemoveDropped(ctx)
	}
	return nil
}

// RemoveDroppedCheckpoints deletes the files of the checkpoints that are
// no longer used (dropped by a resume or a fork).
func (e *Engine) RemoveDroppedCheckpoints(ctx context.Context) error {
	return e.images.RemoveDropped(ctx)
}

// FinishPause ends the pause of sandbox id, which recorded checkpoint ck:
// it checksums the checkpoint's files (overlay's SealCheckpoint) and,
// meanwhile, removes what is left of the sandbox's runtime: runsc's state
// and processes, its cgroup, its network and host helpers. Each part does
// nothing if it has been done already (a resume seals the checkpoint
// itself, and tears the runtime down) or the sandbox is gone.
func (e *Engine) FinishPause(ctx context.Context, id string, ck digest.Digest) error {
	if err := ck.Validate(); err != nil {
		return fmt.Errorf("checkpoint %q: %v: %w", ck, err, errdefs.ErrInvalidArgument)
	}
	sealed := make(chan error, 1)
	go func() {
		err := e.images.SealCheckpoint(ctx, ck)
		if errdefs.IsNotFound(err) || errors.Is(err, fs.ErrNotExist) {
			err = nil // resumed and removed, or the sandbox removed
		}
		sealed <- err
	}()
	return errors.Join(e.teardownPaused(ctx, id, ck), <-sealed)
}

// teardownPaused removes what is left of the runtime of sandbox id, paused
// with checkpoint ck, unless that has been done.
func (e *Engine) teardownPaused(ctx context.Context, id string, ck digest.Digest) error {
	unlock, err := e.lockSandbox(id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed
	}
	if err != nil {
		return err
	}
	defer unlock()
	sb, err := e.load(id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !sb.Paused || !sb.Teardown || sb.Checkpoint != ck {
		return nil
	}
	return e.finishPause(ctx, sb)
}

// finishPause removes the runtime of sb, paused and killed, and records
// that it is gone. The caller holds sb's lock.
func (e *Engine) finishPause(ctx context.Context, sb *record) error {
	if err := e.destroyRuntime(ctx, sb); err != nil {
		return err
	}
	sb.Pid, sb.PidStart, sb.Deadline = 0, 0, nil
	sb.WatchdogPid, sb.WatchdogStart = 0, 0
	// The finisher stays recorded (destroyRuntime has ended any other):
	// once this returns, it still checksums the checkpoint
	// (FinishPause), and whoever removes the sandbox meanwhile must end
	// it first (stopFinisher). Once it has ended, its PID and start time
	// name no process.
	sb.Teardown = false
	return e.save(sb)
}

// killSandboxProcess sends SIGKILL to sb's sandbox process (the sentry),
// if it is still the one recorded. runsc delete, which follows, reaps
// what is left: the gofer, runsc's state.
func killSandboxProcess(sb *record) {
	if sb.Pid <= 0 {
		return
	}
	fd, err := unix.PidfdOpen(sb.Pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	// Checked once the pidfd is open: the PID cannot be reused since.
	if assembly.SameProcess(sb.Pid, sb.PidStart) {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) //nolint:errcheck // runsc delete kills it otherwise
	}
}
