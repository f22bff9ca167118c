package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/runsc"
)

// StopTimeout is how long Stop waits for a sandbox's init to exit after
// SIGTERM before it kills everything.
const StopTimeout = 5 * time.Second

// Stop stops a running sandbox: SIGTERM to its init, SIGKILL to all after
// StopTimeout, then its runtime state, processes and cgroup are removed.
// The record stays (state "stopped") until Remove.
func (e *Engine) Stop(ctx context.Context, ref string) (*Sandbox, error) {
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := e.stopLocked(ctx, sb); err != nil {
		return nil, err
	}
	return sb.view(), nil
}

func (e *Engine) stopLocked(ctx context.Context, sb *record) error {
	if sb.State == StateRunning {
		r := e.runscFor(sb)
		if err := r.Kill(ctx, sb.ID, syscall.SIGTERM, runsc.KillOpts{}); err == nil {
			deadline := time.Now().Add(StopTimeout)
			for time.Now().Before(deadline) && e.state(sb) == StateRunning {
				if st, err := r.State(ctx, sb.ID); err != nil || st.Status != "running" {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	e.checkOOM(sb) // before its cgroup, which counted it, is gone
	if err := e.destroyRuntime(ctx, sb); err != nil {
		return err
	}
	if err := e.releaseNetwork(ctx, sb); err != nil {
		return err
	}
	if err := e.dropCheckpoint(ctx, sb); err != nil {
		return err
	}
	sb.WatchdogPid, sb.Deadline = 0, nil
	sb.Stopped = true
	sb.Pid, sb.PidStart = 0, 0
	sb.State = StateStopped
	return e.save(sb)
}

// Remove deletes a sandbox and everything it holds. A running sandbox is
// refused unless force, which stops it first.
func (e *Engine) Remove(ctx context.Context, ref string, force bool) error {
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return err
	}
	defer unlock()
	switch sb.State {
	case StateRunning:
		if !force {
			return fmt.Errorf("sandbox %s is running: stop it first or use rm -f: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
		}
	case StateCreating:
		if !force {
			return fmt.Errorf("sandbox %s is being created: use rm -f: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
		}
	}
	if err := e.removeLocked(ctx, sb); err != nil {
		return err
	}
	return e.dropName(sb.Name, sb.ID)
}

// removeLocked removes everything sandbox sb holds, its directory last;
// the caller holds its lock.
func (e *Engine) removeLocked(ctx context.Context, sb *record) error {
	stopStorer(sb)
	if err := e.destroyRuntime(ctx, sb); err != nil {
		return err
	}
	if err := e.releaseNetwork(ctx, sb); err != nil {
		return err
	}
	if err := e.removeAllCheckpointsLocked(ctx, sb); err != nil {
		return err
	}
	if err := e.dropCheckpoint(ctx, sb); err != nil {
		return err
	}
	if err := e.images.Release(ctx, sb.ID); err != nil {
		return err
	}
	return os.RemoveAll(e.sandboxDir(sb.ID))
}

// RemoveCommand is the hutch subcommand that finishes the removals
// RemoveLater begins (FinishRemove); its argument is the sandbox ID.
const RemoveCommand = "__remove"

// removingPath is the record of a sandbox whose removal has begun: no
// lookup finds it (they read sandbox.json), and whoever next holds its
// lock finishes the removal.
func (e *Engine) removingPath(id string) string {
	return filepath.Join(e.sandboxDir(id), "removing.json")
}

// RemoveLater removes sandbox ref as Remove(ctx, ref, true) does, but
// returns once the sandbox has gone from every view (Get, List, its
// name, which a new sandbox may take at once) and leaves its teardown
// (runsc's delete, the network, the rootfs; tens of milliseconds) to a
// detached hutch. `hutch run --rm` uses it: its caller waits for the
// command's status, not for the teardown. If the detached hutch dies,
// or the host does, List finishes the removal (collectRemoving).
//
// A sandbox that holds what the caller's next command may ask for (a
// published host port, a volume or host directory, a link to another
// sandbox) or has checkpoints, or is paused, is removed before
// RemoveLater returns, as Remove does.
func (e *Engine) RemoveLater(ctx context.Context, ref string) error {
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return err
	}
	defer unlock()
	if len(sb.Ports) > 0 || len(sb.Mounts) > 0 || sb.Linked || sb.Paused || sb.Checkpoint != "" || sb.CheckpointHead != "" || e.opts.HutchPath == "" {
		if err := e.removeLocked(ctx, sb); err != nil {
			return err
		}
		return e.dropName(sb.Name, sb.ID)
	}
	if err := os.Rename(e.recordPath(sb.ID), e.removingPath(sb.ID)); err != nil {
		return err
	}
	if err := e.dropName(sb.Name, sb.ID); err != nil {
		return err
	}
	if e.spawnDetached(RemoveCommand, sb.ID) == 0 {
		return e.removeLocked(ctx, sb)
	}
	return nil
}

// FinishRemove finishes the removal of sandbox id that RemoveLater
// began; it does nothing if that is done.
func (e *Engine) FinishRemove(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("sandbox ID %q: %w", id, errdefs.ErrInvalidArgument)
	}
	unlock, err := e.lockSandbox(id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed
	}
	if err != nil {
		return err
	}
	defer unlock()
	return e.finishRemoveLocked(ctx, id)
}

func (e *Engine) finishRemoveLocked(ctx context.Context, id string) error {
	sb, err := e.readRecord(e.removingPath(id))
	if errdefs.IsNotFound(err) {
		return nil // finished by another
	}
	if err != nil {
		return err
	}
	return e.removeLocked(ctx, sb)
}

// collectRemoving finishes the removal of sandbox id if RemoveLater
// began it and nothing else is finishing it now (the lock is free): its
// detached hutch died, or the host did.
func (e *Engine) collectRemoving(ctx context.Context, id string) {
	if _, err := os.Stat(e.removingPath(id)); err != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(e.sandboxDir(id), "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return // being removed
	}
	if err := e.finishRemoveLocked(ctx, id); err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", id).Warn("finishing a removal")
	}
}

// killOrphans kills the runsc processes (sandbox, gofer, or a runsc
// command) that carry sandbox id as an argument, and waits until they are
// gone. runsc's own state is the first way to stop a sandbox; this one is
// for what runsc lost track of.
func killOrphans(id string) {
	// os.ReadDir, not a glob: every rm reads all the host's processes,
	// about six more per live sandbox.
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + ent.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "runsc") || !slices.Contains(args[1:], id) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		for i := 0; i < 200 && processAlive(pid) && !assembly.IsZombie(pid); i++ {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// validID reports whether id is a sandbox ID (newID): 32 lower-case
// hexadecimal digits.
func validID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
