package engine

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/policy"
)

// UpdateRequest changes the policy of a running sandbox. Nil fields keep
// their current value.
type UpdateRequest struct {
	// CPUs and Memory replace the host cgroup's limits at once. gVisor
	// sized the sandbox at boot, so /proc/meminfo and nproc inside keep
	// their first values. Lowering Memory below what the sandbox uses
	// gets it OOM-killed.
	CPUs   *float64
	Memory *int64
	// Network is the new mode. A sandbox created with network none has
	// no link to give a network to; it can only stay none. Changing to
	// none drops the allow rules.
	Network *string
	// Allow replaces the allow rules.
	Allow *[]string
}

// Update replaces a running sandbox's limits and network policy. The
// firewall changes in one transaction (addresses admitted for names under
// the old policy are dropped with it) and the resolver answers under the
// new policy from its next query. The request is validated whole before
// anything changes.
func (e *Engine) Update(ctx context.Context, ref string, req UpdateRequest) (*Sandbox, error) {
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	mode, rules := sb.Network, sb.Allow
	if req.Network != nil {
		mode = *req.Network
	}
	if req.Allow != nil {
		rules = *req.Allow
	} else if mode == policy.NetNone {
		// Rules mean nothing without a network; they go with it.
		rules = nil
	}
	allow, err := policy.ParseAllowList(rules)
	if err != nil {
		return nil, err
	}
	cpus, mem := sb.CPUs, sb.Memory
	var explicit []string
	if req.CPUs != nil {
		cpus, explicit = *req.CPUs, append(explicit, "cpus")
	}
	if req.Memory != nil {
		mem, explicit = *req.Memory, append(explicit, "memory")
	}
	unenforceable, why := unenforceableLive(sb)
	pr, err := policy.Validate(policy.Request{
		CPUs: cpus, Memory: mem, Pids: sb.Pids, Disk: sb.Disk,
		Network: mode, Allow: allow, DNS: sb.DNS, Rootless: sb.Rootless, Explicit: explicit,
		Unenforceable: unenforceable, UnenforceableWhy: why,
	})
	if err != nil {
		return nil, err
	}
	if !sb.Linked && pr.Network != policy.NetNone {
		return nil, fmt.Errorf("sandbox %s was created with --net none and has no network link: create it with --net open or allow: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
	}
	if sb.Linked {
		if err := e.updateNetwork(ctx, sb, pr.Network, allow); err != nil {
			return nil, err
		}
	}
	if len(explicit) > 0 {
		if err := updateCgroup(cgroupPath(sb.ID), policy.HostResources(pr)); err != nil {
			return nil, err
		}
	}
	sb.Network, sb.Allow, sb.CPUs, sb.Memory = pr.Network, rules, pr.CPUs, pr.Memory
	if err := e.save(sb); err != nil {
		return nil, err
	}
	return sb.view(), nil
}
