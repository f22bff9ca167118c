package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"sbx.dev/sbx/assembly"
	"sbx.dev/sbx/overlay"
	"sbx.dev/sbx/policy"
)

// A warm pool keeps sandboxes of one class booted and unused, so that a
// create that matches the class takes one instead of booting its own
// (docs/decisions/0023-warm-pool.md).
//
// A pool's definition is <root>/pools/NAME/pool.json. Its sandboxes are
// ordinary sandboxes whose record is kept as pooled.json instead of
// sandbox.json, so that List and Get do not see them; the pool's members/
// directory indexes them. A claim renames a member's pooled.json to
// claiming.json: the rename succeeds for exactly one claimer, which then
// applies the request and saves the record as sandbox.json. A filler
// (FillPool) boots sandboxes until the pool is full again: a detached sbx
// (PoolFillCommand), or a goroutine in a long-lived process
// (FillPoolsInProcess). Locks: fill.lock is held by the one filler of a
// pool; lock guards the definition and the index against pool rm.

// PoolFillCommand is the sbx subcommand that fills a pool (FillPool): its
// argument is the pool's name, after a flag --delay DURATION to wait first.
const PoolFillCommand = "__pool-fill"

// MaxPoolSize bounds a pool's size.
const MaxPoolSize = 256

// poolLabel marks a pool's sandbox while it is being booted, when it is
// briefly listed; a claim replaces the labels.
const poolLabel = "sbx.pool"

// RefillDelay is how long a pool waits after a claim before it boots a
// replacement: the claimer's first commands run before the boot competes
// with them for the CPU, and claims close together are refilled by one
// filler.
const RefillDelay = 250 * time.Millisecond

// staleClaim is how long a claimed sandbox may stay between its claim and
// its record before a filler concludes that its claimer died.
const staleClaim = time.Minute

// PoolRequest defines a pool: its name, its size, and the class of its
// sandboxes. Of Create, only the fields that are fixed when a sandbox
// boots are taken (image, limits, network mode and rules, DNS); a claim
// applies the rest.
type PoolRequest struct {
	Name   string
	Size   int
	Create CreateRequest
}

// Pool is a pool as PoolList reports it.
type Pool struct {
	Name    string    `json:"name"`
	Size    int       `json:"size"`
	Ready   int       `json:"ready"`
	Image   string    `json:"image"`
	CPUs    float64   `json:"cpus"`
	Memory  int64     `json:"memory"`
	Pids    int64     `json:"pids"`
	Disk    int64     `json:"disk"`
	Network string    `json:"network"`
	Allow   []string  `json:"allow,omitempty"`
	DNS     []string  `json:"dns,omitempty"`
	Created time.Time `json:"created"`
	// Members are the IDs of the pool's ready sandboxes.
	Members []string `json:"members,omitempty"`
	// Error is the last failure of the pool's filler, if its last
	// attempt failed.
	Error string `json:"error,omitempty"`
}

// poolDef is pool.json.
type poolDef struct {
	// Gen tells a pool from a later one of the same name.
	Gen      string    `json:"gen"`
	Name     string    `json:"name"`
	Size     int       `json:"size"`
	Image    string    `json:"image"`
	CPUs     float64   `json:"cpus,omitempty"`
	Memory   int64     `json:"memory,omitempty"`
	Pids     int64     `json:"pids,omitempty"`
	Disk     int64     `json:"disk,omitempty"`
	Network  string    `json:"network,omitempty"`
	Allow    []string  `json:"allow,omitempty"`
	DNS      []string  `json:"dns,omitempty"`
	Explicit []string  `json:"explicit,omitempty"`
	Created  time.Time `json:"created"`
}

// request is the create that boots one of the pool's sandboxes.
func (d *poolDef) request() CreateRequest {
	return CreateRequest{
		Image: d.Image, CPUs: d.CPUs, Memory: d.Memory, Pids: d.Pids, Disk: d.Disk,
		Network: d.Network, Allow: d.Allow, DNS: d.DNS, Explicit: d.Explicit,
		Labels: map[string]string{poolLabel: d.Name}, pool: d.Name,
	}
}

var poolNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

func (e *Engine) poolsDir() string           { return filepath.Join(e.opts.Root, "pools") }
func (e *Engine) poolDir(name string) string { return filepath.Join(e.poolsDir(), name) }
func (e *Engine) membersDir(name string) string {
	return filepath.Join(e.poolDir(name), "members")
}
func (e *Engine) pooledPath(id string) string { return filepath.Join(e.sandboxDir(id), "pooled.json") }
func (e *Engine) claimingPath(id string) string {
	return filepath.Join(e.sandboxDir(id), "claiming.json")
}

// CreatePool defines a pool and starts filling it in the background
// (FillPool). The class is validated as a create's would be.
func (e *Engine) CreatePool(ctx context.Context, req PoolRequest) (*Pool, error) {
	if !poolNameRE.MatchString(req.Name) {
		return nil, fmt.Errorf("pool name %q: want 1-63 of [a-zA-Z0-9_.-], starting with a letter or digit: %w", req.Name, errdefs.ErrInvalidArgument)
	}
	if req.Size < 1 || req.Size > MaxPoolSize {
		return nil, fmt.Errorf("pool size %d: want 1 to %d: %w", req.Size, MaxPoolSize, errdefs.ErrInvalidArgument)
	}
	c := req.Create
	switch {
	case c.Name != "", len(c.Labels) > 0, len(c.Env) > 0, c.Workdir != "", len(c.Secrets) > 0, len(c.SecretValues) > 0,
		c.Timeout > 0, c.OnTimeout != "":
		return nil, fmt.Errorf("a pool's sandboxes take their name, labels, env, workdir, secrets and lifetime when claimed: give them to create, not to pool create: %w", errdefs.ErrInvalidArgument)
	case len(c.Ports) > 0, len(c.Mounts) > 0, len(c.Setup) > 0, len(c.CACerts) > 0:
		return nil, fmt.Errorf("a pool cannot hold sandboxes with published ports, mounts, setup commands or extra CA certificates: %w", errdefs.ErrInvalidArgument)
	}
	pr, err := e.validate(c)
	if err != nil {
		return nil, err
	}
	img, err := e.Image(ctx, c.image())
	if err != nil {
		return nil, err
	}
	gen, err := newID()
	if err != nil {
		return nil, err
	}
	def := &poolDef{
		Gen: gen, Name: req.Name, Size: req.Size, Image: img.Name,
		CPUs: pr.CPUs, Memory: pr.Memory, Pids: pr.Pids, Disk: pr.Disk,
		Network: pr.Network, Allow: c.Allow, DNS: c.DNS, Explicit: c.Explicit,
		Created: time.Now().UTC(),
	}
	if err := os.MkdirAll(e.poolsDir(), 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(e.poolDir(req.Name), 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("pool %q exists: %w", req.Name, errdefs.ErrAlreadyExists)
		}
		return nil, err
	}
	if err := os.Mkdir(e.membersDir(req.Name), 0o700); err != nil {
		os.RemoveAll(e.poolDir(req.Name))
		return nil, err
	}
	for _, f := range []string{"lock", "fill.lock", "fillers.lock"} {
		if err := os.WriteFile(filepath.Join(e.poolDir(req.Name), f), nil, 0o600); err != nil {
			os.RemoveAll(e.poolDir(req.Name))
			return nil, err
		}
	}
	if err := writeJSON(filepath.Join(e.poolDir(req.Name), "pool.json"), def); err != nil {
		os.RemoveAll(e.poolDir(req.Name))
		return nil, err
	}
	e.kickFill(req.Name, 0)
	return e.poolInfo(ctx, def), nil
}

// Pools lists the pools, by name.
func (e *Engine) Pools(ctx context.Context) ([]*Pool, error) {
	defs, err := e.poolDefs()
	if err != nil {
		return nil, err
	}
	out := make([]*Pool, 0, len(defs))
	for _, d := range defs {
		out = append(out, e.poolInfo(ctx, d))
	}
	return out, nil
}

// RemovePool removes a pool and all its sandboxes, waiting for a filler
// that is booting one.
func (e *Engine) RemovePool(ctx context.Context, name string) error {
	if !poolNameRE.MatchString(name) {
		return fmt.Errorf("pool name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	def, err := e.loadPool(name)
	if err != nil {
		return err
	}
	unlock, err := lockFile(filepath.Join(e.poolDir(name), "lock"))
	if err != nil {
		return err
	}
	// Without its definition, no filler registers a sandbox it boots:
	// it removes it instead.
	err = os.Remove(filepath.Join(e.poolDir(name), "pool.json"))
	unlock()
	if err != nil {
		return err
	}
	// Wait for the fillers, started or waiting to start, which end once
	// they see the pool gone.
	unlockFillers, err := lockFile(filepath.Join(e.poolDir(name), "fillers.lock"))
	if err != nil {
		return err
	}
	defer unlockFillers()
	unlockFill, err := lockFile(filepath.Join(e.poolDir(name), "fill.lock"))
	if err != nil {
		return err
	}
	defer unlockFill()
	e.collectBoot(ctx, name)
	var errs []error
	for _, id := range e.memberIDs(name) {
		if os.Rename(e.pooledPath(id), e.claimingPath(id)) != nil {
			// Claimed meanwhile: its claimer owns it.
			os.Remove(filepath.Join(e.membersDir(name), id))
			continue
		}
		if err := e.destroyMember(ctx, id); err != nil {
			errs = append(errs, err)
		}
		os.Remove(filepath.Join(e.membersDir(name), id))
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove pool %s: %w", def.Name, errors.Join(errs...))
	}
	return os.RemoveAll(e.poolDir(name))
}

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

// poolServes reports whether a pool has a ready sandbox for req, which
// Create would then claim.
func (e *Engine) poolServes(ctx context.Context, req CreateRequest) bool {
	if !claimable(req) {
		return false
	}
	defs, err := e.poolDefs()
	if err != nil || len(defs) == 0 {
		return false
	}
	pr, err := e.validate(req)
	if err != nil {
		return false
	}
	image, err := overlay.ParseName(req.image())
	if err != nil {
		return false
	}
	for _, def := range defs {
		if def.matches(image, req, pr) && len(e.readyMembers(def)) > 0 {
			return true
		}
	}
	return false
}

// claimable reports whether req asks for nothing a pool's sandbox cannot
// be given after its boot.
func claimable(req CreateRequest) bool {
	return len(req.Ports) == 0 && len(req.Mounts) == 0 && len(req.Setup) == 0 && len(req.CACerts) == 0 && req.Pull != PullAlways
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

// claim takes a pooled sandbox that matches req, if there is one, and
// makes it what req asks for. It returns nil, nil when no pool can serve
// req: the caller creates a fresh sandbox.
func (e *Engine) claim(ctx context.Context, req CreateRequest, pr policy.Request) (*record, error) {
	if !claimable(req) {
		return nil, nil
	}
	defs, err := e.poolDefs()
	if err != nil || len(defs) == 0 {
		return nil, nil
	}
	image, err := overlay.ParseName(req.image())
	if err != nil {
		return nil, nil
	}
	for _, def := range defs {
		if !def.matches(image, req, pr) {
			continue
		}
		img, err := e.images.Get(ctx, image)
		if err != nil {
			return nil, nil
		}
		for _, id := range e.memberIDs(def.Name) {
			if os.Rename(e.pooledPath(id), e.claimingPath(id)) != nil {
				continue // another claim, or the filler, took it
			}
			os.Remove(filepath.Join(e.membersDir(def.Name), id))
			defer e.kickFill(def.Name, RefillDelay)
			rec, err := e.readRecord(e.claimingPath(id))
			if err != nil || rec.State != StateRunning || rec.ImageDigest != img.Digest {
				e.destroyMember(ctx, id) //nolint:errcheck // not claimable: gone
				continue
			}
			return e.finishClaim(ctx, def, rec, req, pr)
		}
	}
	return nil, nil
}

// matches reports whether the pool's sandboxes can become what req asks
// for: what gVisor fixes at boot must be equal (image, CPUs and memory,
// which it sizes /proc/cpuinfo and /proc/meminfo by, pids, disk, whether
// there is a network link, DNS upstreams).
func (d *poolDef) matches(image string, req CreateRequest, pr policy.Request) bool {
	return d.Image == image && d.CPUs == pr.CPUs && d.Memory == pr.Memory && d.Pids == pr.Pids &&
		d.Disk == pr.Disk && (d.Network == policy.NetNone) == (pr.Network == policy.NetNone) &&
		slices.Equal(d.DNS, req.DNS)
}

// finishClaim applies req to a claimed sandbox: what a fresh create would
// have recorded, secrets written in, network policy replaced, lifetime
// started. On failure the sandbox is removed.
func (e *Engine) finishClaim(ctx context.Context, def *poolDef, sb *record, req CreateRequest, pr policy.Request) (_ *record, err error) {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", sb.ID).WithField("pool", def.Name))
	saved := false
	defer func() {
		if err == nil {
			return
		}
		if !saved {
			e.destroyMember(ctx, sb.ID) //nolint:errcheck // best effort undo
			return
		}
		if rerr := e.Remove(context.Background(), sb.ID, true); rerr != nil {
			log.G(ctx).WithError(rerr).Error("cleaning up a failed claim")
		}
	}()
	base, err := e.validate(def.request())
	if err != nil {
		return nil, err
	}
	// The pool's record holds the state root's CA variables before the
	// (empty) env of the pool's class; the request's env goes after them.
	env := sb.Env[:max(0, len(sb.Env)-len(base.Env))]
	sb.Name, sb.Labels, sb.Workdir = req.Name, req.Labels, req.Workdir
	sb.Env = append(slices.Clone(env), pr.Env...)
	sb.Created, sb.CreatorPid = time.Now().UTC(), os.Getpid()
	sb.Secrets = secretNames(pr.Secrets)
	setPersistFields(sb, req)
	if err := e.saveClaimed(sb); err != nil {
		return nil, err
	}
	saved = true
	if len(pr.Secrets) > 0 {
		if err := e.writeSecrets(ctx, sb, pr.Secrets); err != nil {
			return nil, err
		}
	}
	if sb.Linked && (sb.Network != pr.Network || !slices.Equal(sb.Allow, req.Allow)) {
		if err := e.updateNetwork(ctx, sb, pr.Network, pr.Allow); err != nil {
			return nil, err
		}
		sb.Network, sb.Allow = pr.Network, req.Allow
	}
	if err := e.startWatchdog(sb); err != nil {
		return nil, err
	}
	sb.CreatorPid = 0
	if err := e.save(sb); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", sb.ShortID(), context.Cause(ctx))
	}
	sb.State = StateRunning
	return sb, nil
}

// saveClaimed makes a claimed sandbox's record sandbox.json, checking
// that its name is free as reserve does.
func (e *Engine) saveClaimed(sb *record) error {
	unlock, err := e.lockNames()
	if err != nil {
		return err
	}
	defer unlock()
	if err := e.nameFree(sb.Name); err != nil {
		return err
	}
	if err := e.save(sb); err != nil {
		return err
	}
	return os.Remove(e.claimingPath(sb.ID))
}

func (e *Engine) poolInfo(ctx context.Context, d *poolDef) *Pool {
	p := &Pool{
		Name: d.Name, Size: d.Size, Image: d.Image, CPUs: d.CPUs, Memory: d.Memory,
		Pids: d.Pids, Disk: d.Disk, Network: d.Network, Allow: d.Allow, DNS: d.DNS,
		Created: d.Created, Members: e.readyMembers(d),
	}
	p.Ready = len(p.Members)
	if b, err := os.ReadFile(filepath.Join(e.poolDir(d.Name), "error")); err == nil {
		p.Error = string(b)
	}
	return p
}

func (e *Engine) loadPool(name string) (*poolDef, error) {
	b, err := os.ReadFile(filepath.Join(e.poolDir(name), "pool.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no such pool: %s: %w", name, errdefs.ErrNotFound)
		}
		return nil, err
	}
	var d poolDef
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("pool %s: corrupt definition: %w", name, err)
	}
	return &d, nil
}

// poolDefs reads every pool's definition, by name.
func (e *Engine) poolDefs() ([]*poolDef, error) {
	ents, err := os.ReadDir(e.poolsDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*poolDef
	for _, ent := range ents {
		d, err := e.loadPool(ent.Name())
		if err != nil {
			continue // being created or removed
		}
		out = append(out, d)
	}
	return out, nil
}

// memberIDs lists the pool's index, oldest first.
func (e *Engine) memberIDs(name string) []string {
	ents, err := os.ReadDir(e.membersDir(name))
	if err != nil {
		return nil
	}
	type member struct {
		id string
		t  time.Time
	}
	var ms []member
	for _, ent := range ents {
		if fi, err := ent.Info(); err == nil {
			ms = append(ms, member{ent.Name(), fi.ModTime()})
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].t.Before(ms[j].t) })
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.id
	}
	return out
}

// readRecord reads a record from path and computes its state.
func (e *Engine) readRecord(path string) (*record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var sb record
	if err := json.Unmarshal(b, &sb); err != nil {
		return nil, fmt.Errorf("%s: corrupt record: %w", path, err)
	}
	sb.State = e.state(&sb)
	return &sb, nil
}

// writeJSON writes v to path atomically, owner-only.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// tryLockFile takes an exclusive flock on existing file path without
// waiting; ok is false if another holds it.
func tryLockFile(path string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return func() { f.Close() }, true, nil
}
