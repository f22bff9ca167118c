package engine

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/containerd/log"

	"hutch.dev/hutch/engine/pool"
	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/policy"
)

// Claiming a warm pool's sandbox for a create that matches its class.
// See pool.go.

// poolServes reports whether a pool has a ready sandbox for req, which
// Create would then claim.
func (e *Engine) poolServes(ctx context.Context, req CreateRequest) bool {
	if !claimable(req) {
		return false
	}
	defs, err := e.pools().Defs()
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
		if poolMatches(def, image, req, pr) && len(e.readyMembers(def)) > 0 {
			return true
		}
	}
	return false
}

// Claim takes a pooled sandbox for req, as Create does when a pool serves
// req, and returns nil, nil when none does: nothing was done, and Create
// would boot a fresh sandbox. A caller that runs a command in the new
// sandbox right away (hutch run) claims first and creates only on nil.
func (e *Engine) Claim(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	pr, err := e.validate(req)
	if err != nil {
		return nil, err
	}
	sb, err := e.claim(ctx, req, pr)
	return sb.view(), err
}

// claimable reports whether req asks for nothing a pool's sandbox cannot
// be given after its boot.
func claimable(req CreateRequest) bool {
	return len(req.Ports) == 0 && len(req.Mounts) == 0 && req.NetRate == 0 && len(req.Setup) == 0 && len(req.CACerts) == 0 && len(req.Inject) == 0 && req.Pull != PullAlways
}

// claim takes a pooled sandbox that matches req, if there is one, and
// makes it what req asks for. It returns nil, nil when no pool can serve
// req: the caller creates a fresh sandbox.
func (e *Engine) claim(ctx context.Context, req CreateRequest, pr policy.Request) (*record, error) {
	if !claimable(req) {
		return nil, nil
	}
	pools := e.pools()
	defs, err := pools.Defs()
	if err != nil || len(defs) == 0 {
		return nil, nil
	}
	image, err := overlay.ParseName(req.image())
	if err != nil {
		return nil, nil
	}
	img, err := e.images.Get(ctx, image)
	if err != nil {
		return nil, nil
	}
	pr.Docker = pr.Docker || wantsDocker(img)
	for _, def := range defs {
		if !poolMatches(def, image, req, pr) {
			continue
		}
		for _, id := range pools.Members(def.Name) {
			if os.Rename(e.pooledPath(id), e.claimingPath(id)) != nil {
				continue // another claim, or the filler, took it
			}
			pools.DropMember(def.Name, id)
			// Not waited for, and in the CLI started only once the
			// claimer's first command had its turn (DeferPoolFills).
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

// poolMatches reports whether pool d's sandboxes can become what req asks
// for: what gVisor fixes at boot must be equal (image, CPUs and memory,
// which it sizes /proc/cpuinfo and /proc/meminfo by, pids, disk, whether
// there is a network link, DNS upstreams).
func poolMatches(d *pool.Def, image string, req CreateRequest, pr policy.Request) bool {
	return d.Image == image && d.CPUs == pr.CPUs && d.Memory == pr.Memory && d.Pids == pr.Pids &&
		d.Disk == pr.Disk && (d.Network == policy.NetNone) == (pr.Network == policy.NetNone) &&
		slices.Equal(d.DNS, req.DNS) && d.Docker == pr.Docker
}

// finishClaim applies req to a claimed sandbox: what a fresh create would
// have recorded, secrets written in, network policy replaced, lifetime
// started. On failure the sandbox is removed.
func (e *Engine) finishClaim(ctx context.Context, def *pool.Def, sb *record, req CreateRequest, pr policy.Request) (_ *record, err error) {
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
	base, err := e.validate(poolRequest(def))
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
	relink := sb.Linked && (sb.Network != pr.Network || !slices.Equal(sb.Allow, req.Allow))
	// A member restored from a template runs the template's processes,
	// started with the pool's environment: they read the claim's.
	warmEnv := len(pr.Env) > 0 && sb.Template != nil && sb.Template.Warm
	if len(pr.Secrets) == 0 && !relink && !warmEnv && sb.Timeout == "" {
		// Nothing left to do after the record: it is saved once, final.
		sb.CreatorPid = 0
	}
	if err := e.saveClaimed(sb); err != nil {
		return nil, err
	}
	saved = true
	if sb.CreatorPid != 0 {
		if len(pr.Secrets) > 0 {
			if err := e.writeSecrets(ctx, sb, pr.Secrets); err != nil {
				return nil, err
			}
		}
		if warmEnv {
			if err := e.writeEnv(ctx, sb, pr.Env); err != nil {
				return nil, err
			}
		}
		if relink {
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
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", sb.ShortID(), context.Cause(ctx))
	}
	sb.State = StateRunning
	return sb, nil
}

// saveClaimed makes a claimed sandbox's record sandbox.json, checking
// that its name is free as reserve does. Without a name there is nothing
// to check and no lock to take.
func (e *Engine) saveClaimed(sb *record) error {
	if sb.Name != "" {
		unlock, err := e.lockNames()
		if err != nil {
			return err
		}
		defer unlock()
		if err := e.takeName(sb.Name, sb.ID); err != nil {
			return err
		}
	}
	if err := e.save(sb); err != nil {
		return err
	}
	return os.Remove(e.claimingPath(sb.ID))
}
