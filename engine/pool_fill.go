package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"sbx.dev/sbx/assembly"
)

// Refilling a warm pool: booting members, moving them in, collecting the
// dead. See pool.go.

// fillHere: pools refill in goroutines of this process (FillPoolsInProcess).
var fillHere atomic.Bool

// FillPoolsInProcess makes pools that this process claims from refill in
// goroutines of its own rather than in a detached sbx: for a long-lived
// process such as sbx serve.
func FillPoolsInProcess() { fillHere.Store(true) }

// kickFill starts pool name's filler in the background, after delay.
func (e *Engine) kickFill(name string, delay time.Duration) {
	if fillHere.Load() {
		go func() {
			if err := e.FillPoolAfter(context.Background(), name, delay); err != nil {
				log.L.WithError(err).WithField("pool", name).Warn("filling pool")
			}
		}()
		return
	}
	args := []string{"--root", e.opts.Root, "--runsc", e.opts.RunscPath, PoolFillCommand, "--delay", delay.String(), name}
	cmd := exec.Command(e.opts.SbxPath, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		log.L.WithError(err).WithField("pool", name).Warn("starting pool filler")
		return
	}
	// Reap it if it ends while we still run; it outlives us otherwise.
	go cmd.Wait() //nolint:errcheck
}

// FillPoolAfter waits delay, then fills pool name (FillPool). RemovePool
// waits for it meanwhile.
func (e *Engine) FillPoolAfter(ctx context.Context, name string, delay time.Duration) error {
	f, err := os.Open(filepath.Join(e.poolDir(name), "fillers.lock"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // removed
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		return err
	}
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
	for {
		unlock, ok, err := tryLockFile(filepath.Join(e.poolDir(name), "fill.lock"))
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
		errPath := filepath.Join(e.poolDir(name), "error")
		if err != nil {
			os.WriteFile(errPath, []byte(err.Error()), 0o600) //nolint:errcheck // best effort report
		} else {
			os.Remove(errPath)
		}
		unlock()
		if err != nil {
			return err
		}
		// A claim while this filler held the lock had its own filler
		// turned away: look again now that it is released.
		def, err := e.loadPool(name)
		if err != nil || len(e.readyMembers(def)) >= def.Size {
			return nil
		}
	}
}

func (e *Engine) fillLocked(ctx context.Context, name string) error {
	for {
		def, err := e.loadPool(name)
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
		sb, err := e.create(ctx, def.request(), nil)
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
func (e *Engine) reserveFor(sb *record, pool string, undo *assembly.Undo) error {
	if pool == "" {
		return e.reserve(sb, undo)
	}
	dir := e.bootDir(pool, sb.ID)
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

func (e *Engine) bootDir(pool, id string) string {
	return filepath.Join(e.poolDir(pool), "boot", id)
}

// moveIn replaces a booted pool sandbox's link in sandboxes/ with its
// directory.
func (e *Engine) moveIn(pool, id string) error {
	if err := os.Remove(e.sandboxDir(id)); err != nil {
		return err
	}
	return os.Rename(e.bootDir(pool, id), e.sandboxDir(id))
}

// register moves a booted sandbox into its pool, or removes it if the
// pool is gone.
func (e *Engine) register(ctx context.Context, def *poolDef, sb *record) error {
	unlock, err := lockFile(filepath.Join(e.poolDir(def.Name), "lock"))
	if err == nil {
		defer unlock()
	}
	cur, lerr := e.loadPool(def.Name)
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
	if err := os.WriteFile(filepath.Join(e.membersDir(def.Name), sb.ID), nil, 0o600); err != nil {
		return errors.Join(err, e.destroyMember(ctx, sb.ID))
	}
	// Claimable from now on.
	return os.Rename(e.claimingPath(sb.ID), e.pooledPath(sb.ID))
}

// collect removes the pool's members that can no longer be claimed (dead,
// of an old image, abandoned mid-claim) and returns how many are ready.
func (e *Engine) collect(ctx context.Context, def *poolDef) int {
	img, imgErr := e.images.Get(ctx, def.Image)
	ready := 0
	for _, id := range e.memberIDs(def.Name) {
		index := filepath.Join(e.membersDir(def.Name), id)
		if _, err := os.Stat(e.pooledPath(id)); err != nil {
			// Claimed: its claimer removes the index entry, unless it
			// died between its claim and its record.
			if fi, err := os.Stat(e.claimingPath(id)); err == nil && time.Since(fi.ModTime()) > staleClaim {
				if _, err := os.Stat(e.recordPath(id)); errors.Is(err, os.ErrNotExist) {
					e.destroyMember(ctx, id) //nolint:errcheck // best effort
				}
				os.Remove(index)
			} else if err != nil {
				os.Remove(index)
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
			os.Remove(index)
		}
	}
	return ready
}

// collectBoot removes the sandboxes a filler of the pool was booting
// when it died: the caller holds fill.lock, so none is still booting.
func (e *Engine) collectBoot(ctx context.Context, name string) {
	ents, _ := os.ReadDir(filepath.Join(e.poolDir(name), "boot"))
	for _, ent := range ents {
		id := ent.Name()
		if e.moveIn(name, id) != nil {
			os.RemoveAll(e.bootDir(name, id))
			continue
		}
		if err := e.Remove(ctx, id, true); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", id).Warn("removing an abandoned pool sandbox")
		}
	}
}

// readyMembers lists the pool's running members, touching nothing.
func (e *Engine) readyMembers(def *poolDef) []string {
	var out []string
	for _, id := range e.memberIDs(def.Name) {
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
