package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/assembly"
)

// Refilling a warm pool: booting members, moving them in, collecting the
// dead. See pool.go.

// fillHere: pools refill in goroutines of this process (FillPoolsInProcess).
var fillHere atomic.Bool

// FillPoolsInProcess makes pools that this process claims from refill in
// goroutines of its own rather than in a detached hutch: for a long-lived
// process such as hutch serve.
func FillPoolsInProcess() { fillHere.Store(true) }

// deferFills: detached fillers start late (DeferPoolFills).
var deferFills atomic.Bool

// DeferPoolFills makes the detached fillers that claims of this process
// start begin later: when the process calls StartPoolFills, or shortly
// before the filler's delay ends, whichever is first. Starting a process
// costs the CPU the claimer's first command needs; a pool's refill does
// not start any later for it. A process that calls DeferPoolFills calls
// StartPoolFills before it exits (the hutch CLI does, in main).
func DeferPoolFills() { deferFills.Store(true) }

// fillerStartup is how long before its delay ends a filler's hutch is
// started: about what a hutch process takes to start on a loaded host.
const fillerStartup = 50 * time.Millisecond

// deferred are the fillers waiting to be started, by root and pool.
var deferred struct {
	sync.Mutex
	m map[string]*deferredFill
}

type deferredFill struct {
	e     *Engine
	name  string
	at    time.Time // when the filler is to start filling
	lock  *os.File  // the filler's shared lock of fillers.lock, held
	timer *time.Timer
}

// StartPoolFills starts every filler DeferPoolFills held back, each
// waiting for what is left of its delay, and returns once they are
// started.
func StartPoolFills() {
	deferred.Lock()
	defer deferred.Unlock()
	for k, d := range deferred.m {
		d.timer.Stop()
		d.e.spawnFill(d.name, time.Until(d.at), d.lock)
		delete(deferred.m, k)
	}
}

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
	// The filler holds fillers.lock shared from now on, through its
	// delay, so that pool rm waits for it: the lock is taken here and
	// handed down to it.
	lock, err := e.shareFillersLock(name)
	if err != nil {
		return // the pool is gone or being removed: nothing to refill
	}
	if !deferFills.Load() || delay <= fillerStartup {
		e.spawnFill(name, delay, lock)
		return
	}
	key := e.opts.Root + "\x00" + name
	deferred.Lock()
	defer deferred.Unlock()
	if _, ok := deferred.m[key]; ok {
		// One filler fills the pool for every claim of this process.
		lock.Close()
		return
	}
	if deferred.m == nil {
		deferred.m = map[string]*deferredFill{}
	}
	d := &deferredFill{e: e, name: name, at: time.Now().Add(delay), lock: lock}
	d.timer = time.AfterFunc(delay-fillerStartup, func() {
		deferred.Lock()
		defer deferred.Unlock()
		if deferred.m[key] == d {
			delete(deferred.m, key)
			e.spawnFill(name, time.Until(d.at), lock)
		}
	})
	deferred.m[key] = d
}

// shareFillersLock opens pool name's fillers.lock and takes it shared,
// without waiting: pool rm holds it exclusively while it removes the pool.
func (e *Engine) shareFillersLock(name string) (*os.File, error) {
	f, err := os.Open(filepath.Join(e.poolDir(name), "fillers.lock"))
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// FillerLockFD is the descriptor on which a detached filler inherits its
// shared lock of the pool's fillers.lock (FillPoolAfterLocked).
const FillerLockFD = 3

// shell runs a detached filler's delay: a shell and sleep start in a
// fraction of what hutch takes, so that hutch starts only once its delay is
// nearly over, not while the claimer's first commands run.
var shell = sync.OnceValue(func() string {
	if _, err := os.Stat("/bin/sh"); err != nil {
		return ""
	}
	return "/bin/sh"
})

// spawnFill starts a detached hutch that fills pool name after delay,
// handing it lock (fillersLock) and closing this process's copy.
func (e *Engine) spawnFill(name string, delay time.Duration, lock *os.File) {
	defer lock.Close()
	delay = max(delay, 0)
	fill := []string{e.opts.HutchPath, "--root", e.opts.Root, "--runsc", e.opts.RunscPath, PoolFillCommand,
		"--lock-fd", strconv.Itoa(FillerLockFD)}
	cmd := exec.Command(fill[0], append(fill[1:], "--delay", delay.String(), name)...)
	if wait := delay - fillerStartup; wait > 0 && shell() != "" {
		// If sleep fails, the filler starts at once, without delay.
		cmd = exec.Command(shell(), append([]string{"-c", `sleep "$0"; exec "$@"`, fmt.Sprintf("%.3f", wait.Seconds())},
			append(fill, "--delay", "0s", name)...)...)
	}
	cmd.ExtraFiles = []*os.File{lock} // FillerLockFD
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
	return e.fillAfter(ctx, name, delay)
}

// FillPoolAfterLocked is FillPoolAfter for a filler that inherited its
// shared lock of the pool's fillers.lock, held, as held (a detached
// filler, on FillerLockFD). It closes held.
func (e *Engine) FillPoolAfterLocked(ctx context.Context, name string, delay time.Duration, held *os.File) error {
	defer held.Close()
	hfi, err := held.Stat()
	if err != nil {
		return fmt.Errorf("pool %s: the filler's lock: %w", name, err)
	}
	fi, err := os.Stat(filepath.Join(e.poolDir(name), "fillers.lock"))
	if err != nil || !os.SameFile(fi, hfi) {
		return nil // removed, perhaps made again: not this filler's pool
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
