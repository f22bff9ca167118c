package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

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
	if err := os.RemoveAll(e.sandboxDir(sb.ID)); err != nil {
		return err
	}
	return e.dropName(sb.Name, sb.ID)
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
