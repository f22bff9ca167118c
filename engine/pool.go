package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine/pool"
)

// A warm pool keeps sandboxes of one class booted and unused, so that a
// create that matches the class takes one instead of booting its own
// (engine/pool holds the pools themselves). A pool's sandboxes are
// ordinary sandboxes whose record is kept as pooled.json instead of
// sandbox.json, so that List and Get do not see them; the pool's index
// lists them. A claim renames a member's pooled.json to claiming.json: the
// rename succeeds for exactly one claimer, which then applies the request
// and saves the record as sandbox.json. A filler (FillPool) boots
// sandboxes until the pool is full again: a detached hutch
// (PoolFillCommand), or a goroutine in a long-lived process
// (FillPoolsInProcess).

// PoolFillCommand is the hutch subcommand that fills a pool (FillPool): its
// argument is the pool's name, after a flag --delay DURATION to wait first.
const PoolFillCommand = "__pool-fill"

// MaxPoolSize bounds a pool's size.
const MaxPoolSize = pool.MaxSize

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

// poolRequest is the create that boots one of pool d's sandboxes.
func poolRequest(d *pool.Def) CreateRequest {
	return CreateRequest{
		Image: d.Image, CPUs: d.CPUs, Memory: d.Memory, Pids: d.Pids, Disk: d.Disk,
		Network: d.Network, Allow: d.Allow, DNS: d.DNS, Explicit: d.Explicit,
		Docker: d.Docker, Labels: map[string]string{poolLabel: d.Name}, pool: d.Name,
	}
}

// pools are the state root's warm pools.
func (e *Engine) pools() pool.Pools { return pool.At(filepath.Join(e.opts.Root, "pools")) }

func (e *Engine) pooledPath(id string) string { return filepath.Join(e.sandboxDir(id), "pooled.json") }
func (e *Engine) claimingPath(id string) string {
	return filepath.Join(e.sandboxDir(id), "claiming.json")
}

// CreatePool defines a pool and starts filling it in the background
// (FillPool). The class is validated as a create's would be.
func (e *Engine) CreatePool(ctx context.Context, req PoolRequest) (*Pool, error) {
	if !pool.ValidName(req.Name) {
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
	def := &pool.Def{
		Gen: gen, Name: req.Name, Size: req.Size, Image: img.Name,
		CPUs: pr.CPUs, Memory: pr.Memory, Pids: pr.Pids, Disk: pr.Disk,
		Network: pr.Network, Allow: c.Allow, DNS: c.DNS, Explicit: c.Explicit,
		Docker: pr.Docker || wantsDocker(img), Created: time.Now().UTC(),
	}
	if err := e.pools().Create(def); err != nil {
		return nil, err
	}
	e.kickFill(req.Name, 0)
	return e.poolInfo(ctx, def), nil
}

// Pools lists the pools, by name.
func (e *Engine) Pools(ctx context.Context) ([]*Pool, error) {
	defs, err := e.pools().Defs()
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
	if !pool.ValidName(name) {
		return fmt.Errorf("pool name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	pools := e.pools()
	def, err := pools.Load(name)
	if err != nil {
		return err
	}
	// Without its definition, no filler registers a sandbox it boots:
	// it removes it instead.
	if err := pools.Undefine(name); err != nil {
		return err
	}
	// Wait for the fillers, started or waiting to start, which end once
	// they see the pool gone.
	unlockFillers, err := pools.LockFillers(name)
	if err != nil {
		return err
	}
	defer unlockFillers()
	unlockFill, err := pools.LockFill(name)
	if err != nil {
		return err
	}
	defer unlockFill()
	e.collectBoot(ctx, name)
	var errs []error
	for _, id := range pools.Members(name) {
		if os.Rename(e.pooledPath(id), e.claimingPath(id)) != nil {
			// Claimed meanwhile: its claimer owns it.
			pools.DropMember(name, id)
			continue
		}
		if err := e.destroyMember(ctx, id); err != nil {
			errs = append(errs, err)
		}
		pools.DropMember(name, id)
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove pool %s: %w", def.Name, errors.Join(errs...))
	}
	return pools.Remove(name)
}

func (e *Engine) poolInfo(ctx context.Context, d *pool.Def) *Pool {
	p := &Pool{
		Name: d.Name, Size: d.Size, Image: d.Image, CPUs: d.CPUs, Memory: d.Memory,
		Pids: d.Pids, Disk: d.Disk, Network: d.Network, Allow: d.Allow, DNS: d.DNS,
		Created: d.Created, Members: e.readyMembers(d),
	}
	p.Ready = len(p.Members)
	p.Error = e.pools().Error(d.Name)
	return p
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
