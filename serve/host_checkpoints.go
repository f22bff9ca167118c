package serve

import (
	"context"
	"time"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

func (h *hostPlacement) Checkpoint(ctx context.Context, id string, req engine.CheckpointRequest) (engine.CheckpointInfo, error) {
	return h.eng.Checkpoint(ctx, id, req)
}

func (h *hostPlacement) Checkpoints(ctx context.Context, id string) ([]engine.CheckpointInfo, error) {
	return h.eng.Checkpoints(ctx, id)
}

func (h *hostPlacement) RemoveCheckpoint(ctx context.Context, id, ck string) error {
	return h.eng.RemoveCheckpoint(ctx, id, ck)
}

// Restore restores in the engine, then gives the sandbox its lifetime
// again from now, as a resume does.
func (h *hostPlacement) Restore(ctx context.Context, id, ck string) (*engine.Sandbox, error) {
	return h.eng.Restore(ctx, id, ck)
}

func (h *hostPlacement) DiffCheckpoints(ctx context.Context, id, a, b string) ([]engine.CheckpointChange, error) {
	return h.eng.DiffCheckpoints(ctx, id, a, b)
}

// ForkFrom forks in the engine, then gives each fork its lifetime, as
// Fork does.
func (h *hostPlacement) ForkFrom(ctx context.Context, parent *engine.Sandbox, ck string, count int, timeout time.Duration) ([]placement.Forked, error) {
	kids, err := h.eng.ForkFrom(ctx, parent.ID, ck, engine.ForkRequest{Count: count})
	if err != nil {
		return nil, err
	}
	return h.lifetimes(ctx, kids, timeout), nil
}

// CheckpointsUsage counts every checkpoint of tenant's sandboxes for
// max-snapshots, and the disk of its own for max-disk: the chunks it
// added, and its memory while kept whole.
func (h *hostPlacement) CheckpointsUsage(ctx context.Context, tenantName string) (tenant.Usage, error) {
	sbs, err := h.List(ctx, tenantName)
	if err != nil {
		return tenant.Usage{}, err
	}
	var u tenant.Usage
	for _, sb := range sbs {
		cks, err := h.eng.Checkpoints(ctx, sb.ID)
		if err != nil {
			return tenant.Usage{}, err
		}
		for _, c := range cks {
			u.Snapshots++
			u.Disk += c.Disk
		}
	}
	return u, nil
}
