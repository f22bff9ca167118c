package serve

import (
	"context"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/tenant"
)

// admit checks that tenant may take want on top of what its sandboxes and
// the creates in flight hold, and reserves it until release. Running
// sandboxes count for every quota; paused ones hold only their disk; the
// tenant's volumes hold the disk their files take.
func (s *Server) admit(ctx context.Context, tenantName string, want tenant.Usage) (release func(), err error) {
	if s.cfg.Tenants == nil {
		return func() {}, nil
	}
	s.createMu.Lock()
	defer s.createMu.Unlock()
	var q tenant.Quota
	ts, err := s.cfg.Tenants.List()
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		if t.Name == tenantName {
			q = t.Quota
		}
	}
	used := s.reserved[tenantName]
	sbs, err := s.tenantSandboxes(ctx, tenantName)
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		switch {
		// This server's creates in flight are in reserved already.
		case sb.State == engine.StateRunning,
			sb.State == engine.StateCreating && !sb.CreatingHere():
			used.Sandboxes++
			used.CPUs += sb.CPUs
			used.Memory += sb.Memory
			used.Disk += sb.Disk
		case sb.State == engine.StatePaused:
			used.Disk += sb.Disk
		}
	}
	if q.MaxDisk > 0 {
		vd, err := s.place.VolumesDisk(ctx, tenantName)
		if err != nil {
			return nil, err
		}
		used.Disk += vd
	}
	if err := q.Admit(used, want); err != nil {
		return nil, err
	}
	r := s.reserved[tenantName]
	r.Sandboxes += want.Sandboxes
	r.CPUs += want.CPUs
	r.Memory += want.Memory
	r.Disk += want.Disk
	s.reserved[tenantName] = r
	return func() {
		s.createMu.Lock()
		defer s.createMu.Unlock()
		r := s.reserved[tenantName]
		r.Sandboxes -= want.Sandboxes
		r.CPUs -= want.CPUs
		r.Memory -= want.Memory
		r.Disk -= want.Disk
		s.reserved[tenantName] = r
	}, nil
}
