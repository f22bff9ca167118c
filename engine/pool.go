package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
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
// (FillPool) boots sandboxes until the pool is full again: a detached hutch
// (PoolFillCommand), or a goroutine in a long-lived process
// (FillPoolsInProcess). Locks: fill.lock is held by the one filler of a
// pool; lock guards the definition and the index against pool rm.

// PoolFillCommand is the hutch subcommand that fills a pool (FillPool): its
// argument is the pool's name, after a flag --delay DURATION to wait first.
const PoolFillCommand = "__pool-fill"

// MaxPoolSize bounds a pool's size.
const MaxPoolSize = 256

// poolLabel marks a pool's sandbox while it is being booted, when it is
// briefly listed; a claim replaces the labels.
const poolLabel = "hutch.pool"

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

// poolNameRE bounds no length: a bounded repetition costs every hutch process
// a large compile at start. validPoolName checks the length.
var poolNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

func validPoolName(n string) bool { return len(n) <= 63 && poolNameRE.MatchString(n) }

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
	if !validPoolName(req.Name) {
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
	if !validPoolName(name) {
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
	var d poolDef
	if err := readJSON(filepath.Join(e.poolDir(name), "pool.json"), &d,
		"no such pool: "+name, "pool "+name+": corrupt definition"); err != nil {
		return nil, err
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
	var sb record
	if err := readJSON(path, &sb, path, path+": corrupt record"); err != nil {
		return nil, err
	}
	sb.State = e.state(&sb)
	return &sb, nil
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
