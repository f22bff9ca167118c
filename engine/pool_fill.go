package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/engine/pool"
)

// Refilling a warm pool: booting members, moving them in, collecting the
// dead. See pool.go.

// FillPoolsInProcess makes pools that this process claims from refill in
// goroutines of its own rather than in a detached hutch: for a long-lived
// process such as hutch serve.
func FillPoolsInProcess() { pool.FillInProcess() }

// DeferPoolFills makes the detached fillers that claims of this process
// start begin later: when the process calls StartPoolFills, or shortly
// before the filler's delay ends, whichever is first (pool.DeferFills). A
// process that calls DeferPoolFills calls StartPoolFills before it exits
// (the hutch CLI does, in main).
func DeferPoolFills() { pool.DeferFills() }

// StartPoolFills starts every filler DeferPoolFills held back, each
// waiting for what is left of its delay, and returns once they are
// started.
func StartPoolFills() { pool.StartFills() }

// FillerLockFD is the descriptor on which a detached filler inherits its
// shared lock of the pool's fillers.lock (FillPoolAfterLocked).
const FillerLockFD = pool.LockFD

// kickFill starts pool name's filler in the background, after delay: a
// detached hutch PoolFillCommand, or under FillPoolsInProcess a goroutine.
func (e *Engine) kickFill(name string, delay time.Duration) {
	pool.Filler{
		Pools: e.pools(),
		Command: []string{e.opts.HutchPath, "--root", e.opts.Root, "--runsc", e.opts.RunscPath, PoolFillCommand,
			"--lock-fd", strconv.Itoa(FillerLockFD)},
		FillAfter: e.FillPoolAfter,
	}.Kick(name, delay)
}

// FillPoolAfter waits delay, then fills pool name (FillPool). RemovePool
// waits for it meanwhile.
func (e *Engine) FillPoolAfter(ctx context.Context, name string, delay time.Duration) error {
	release, ok, err := e.pools().HoldFillers(name)
	if err != nil || !ok {
		return err // !ok: removed
	}
	defer release()
	return e.fillAfter(ctx, name, delay)
}

// FillPoolAfterLocked is FillPoolAfter for a filler that inherited its
// shared lock of the pool's fillers.lock, held, as held (a detached
// filler, on FillerLockFD). It closes held.
func (e *Engine) FillPoolAfterLocked(ctx context.Context, name string, delay time.Duration, held *os.File) error {
	defer held.Close()
	ours, err := e.pools().IsFillersLock(name, held)
	if err != nil || !ours {
		return err // !ours: removed, perhaps made again: not this filler's pool
	}
	return e.fillAfter(ctx, name, delay)
}

func (e *Engine) fillAfter(ctx context.Context, name string, delay time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(delay):
	}
	return e.FillPool(ctx, name)
}

// FillPool boots sandboxes into pool name until it is full, replacing
// members that died or whose image changed. One filler runs per pool: it
// returns at once, doing nothing, if another holds the pool.
func (e *Engine) FillPool(ctx context.Context, name string) error {
	pools := e.pools()
	for {
		unlock, ok, err := pools.TryLockFill(name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil // removed
			}
			return err
		}
		if !ok {
			return nil
		}
		err = e.fillLocked(ctx, name)
		pools.SetError(name, err)
		unlock()
		if err != nil {
			return err
		}
		// A claim while this filler held the lock had its own filler
		// turned away: look again now that it is released.
		def, err := pools.Load(name)
		if err != nil || len(e.readyMembers(def)) >= def.Size {
			return nil
		}
	}
}

func (e *Engine) fillLocked(ctx context.Context, name string) error {
	for {
		def, err := e.pools().Load(name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		e.collectBoot(ctx, name)
		ready := e.collect(ctx, def)
		if ready >= def.Size {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		sb, err := e.create(ctx, poolRequest(def), nil)
		if err != nil {
			return fmt.Errorf("booting a sandbox for pool %s: %w", name, err)
		}
		if err := e.register(ctx, def, sb); err != nil {
			return err
		}
	}
}

// reserveFor is reserve, except for a pool's sandbox (pool not empty):
// its directory is in the pool's boot/ directory, and sandboxes/ID is a
// symbolic link to it, which List skips, until register moves it in.
func (e *Engine) reserveFor(sb *record, poolName string, undo *assembly.Undo) error {
	if poolName == "" {
		return e.reserve(sb, undo)
	}
	dir := e.pools().BootDir(poolName, sb.ID)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	undo.Add(func() { os.RemoveAll(dir) })
	if err := os.Symlink(dir, e.sandboxDir(sb.ID)); err != nil {
		return err
	}
	undo.Add(func() { os.Remove(e.sandboxDir(sb.ID)) })
	return e.save(sb)
}

// moveIn replaces a booted pool sandbox's link in sandboxes/ with its
// directory.
func (e *Engine) moveIn(poolName, id string) error {
	if err := os.Remove(e.sandboxDir(id)); err != nil {
		return err
	}
	return os.Rename(e.pools().BootDir(poolName, id), e.sandboxDir(id))
}

// register moves a booted sandbox into its pool, or removes it if the
// pool is gone.
func (e *Engine) register(ctx context.Context, def *pool.Def, sb *record) error {
	pools := e.pools()
	unlock, err := pools.Lock(def.Name)
	if err == nil {
		defer unlock()
	}
	cur, lerr := pools.Load(def.Name)
	if err != nil || lerr != nil || cur.Gen != def.Gen {
		// The pool is gone: so is the sandbox.
		if err := e.moveIn(def.Name, sb.ID); err != nil {
			return err
		}
		return e.Remove(ctx, sb.ID, true)
	}
	if err := os.Rename(e.recordPath(sb.ID), e.claimingPath(sb.ID)); err != nil {
		return err
	}
	if err := e.moveIn(def.Name, sb.ID); err != nil {
		return errors.Join(err, e.destroyMember(ctx, sb.ID))
	}
	if err := pools.AddMember(def.Name, sb.ID); err != nil {
		return errors.Join(err, e.destroyMember(ctx, sb.ID))
	}
	// Claimable from now on.
	return os.Rename(e.claimingPath(sb.ID), e.pooledPath(sb.ID))
}

// collect removes the pool's members that can no longer be claimed (dead,
// of an old image, abandoned mid-claim) and returns how many are ready.
func (e *Engine) collect(ctx context.Context, def *pool.Def) int {
	pools := e.pools()
	img, imgErr := e.images.Get(ctx, def.Image)
	ready := 0
	for _, id := range pools.Members(def.Name) {
		if _, err := os.Stat(e.pooledPath(id)); err != nil {
			// Claimed: its claimer removes the index entry, unless it
			// died between its claim and its record.
			if fi, err := os.Stat(e.claimingPath(id)); err == nil && time.Since(fi.ModTime()) > staleClaim {
				if _, err := os.Stat(e.recordPath(id)); errors.Is(err, os.ErrNotExist) {
					e.destroyMember(ctx, id) //nolint:errcheck // best effort
				}
				pools.DropMember(def.Name, id)
			} else if err != nil {
				pools.DropMember(def.Name, id)
			}
			continue
		}
		rec, err := e.readRecord(e.pooledPath(id))
		if err == nil && rec.State == StateRunning && imgErr == nil && rec.ImageDigest == img.Digest {
			ready++
			continue
		}
		if os.Rename(e.pooledPath(id), e.claimingPath(id)) == nil {
			e.destroyMember(ctx, id) //nolint:errcheck // best effort
			pools.DropMember(def.Name, id)
		}
	}
	return ready
}

// collectBoot removes the sandboxes a filler of the pool was booting
// when it died: the caller holds fill.lock, so none is still booting.
func (e *Engine) collectBoot(ctx context.Context, name string) {
	for _, id := range e.pools().Booting(name) {
		if e.moveIn(name, id) != nil {
			os.RemoveAll(e.pools().BootDir(name, id))
			continue
		}
		if err := e.Remove(ctx, id, true); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", id).Warn("removing an abandoned pool sandbox")
		}
	}
}

// readyMembers lists the pool's running members, touching nothing.
func (e *Engine) readyMembers(def *pool.Def) []string {
	var out []string
	for _, id := range e.pools().Members(def.Name) {
		rec, err := e.readRecord(e.pooledPath(id))
		if err == nil && rec.State == StateRunning {
			out = append(out, id)
		}
	}
	return out
}

// destroyMember removes a pool's sandbox that its caller took out of the
// pool (its record is claiming.json): runtime, network, rootfs and
// directory.
func (e *Engine) destroyMember(ctx context.Context, id string) error {
	rec, err := e.readRecord(e.claimingPath(id))
	if err != nil {
		os.RemoveAll(e.sandboxDir(id))
		return err
	}
	var errs []error
	if err := e.destroyRuntime(ctx, rec); err != nil {
		errs = append(errs, err)
	}
	if err := e.releaseNetwork(ctx, rec); err != nil {
		errs = append(errs, err)
	}
	if err := e.images.Release(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(e.sandboxDir(id)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
