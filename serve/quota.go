package serve

import (
	"context"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

// admit checks that tenant may take want on top of what its sandboxes,
// its snapshots and the calls in flight hold, and reserves it until
// release. Every call that starts a sandbox (create, resume, fork) or
// keeps one (snapshot) is admitted here, under createMu, before it acts.
// Running sandboxes count for every quota; paused ones hold only their
// disk; the tenant's volumes and snapshots hold the disk their files
// take, and its snapshots and checkpoints count for max-snapshots (and
// their files and memory for max-disk).
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
	used, _, err := s.inUse(ctx, tenantName, q.MaxDisk > 0, q.MaxDisk > 0 || q.MaxSnapshots > 0)
	if err != nil {
		return nil, err
	}
	if err := q.Admit(used, want); err != nil {
		return nil, err
	}
	s.reserved[tenantName] = s.reserved[tenantName].Add(want)
	return func() {
		s.createMu.Lock()
		defer s.createMu.Unlock()
		s.reserved[tenantName] = s.reserved[tenantName].Sub(want)
	}, nil
}

// resumeUsage is what resuming paused sandbox sb asks of its tenant's
// quota: a running sandbox's, less the disk it holds paused already.
func resumeUsage(sb *engine.Sandbox) tenant.Usage {
	u := placement.UsageOf(sb.CPUs, sb.Memory, sb.Disk)
	u.Disk = 0
	return u
}

// snapshotUsage is what a snapshot of sb asks: one snapshot, and the most
// disk its files may take, its writable layer's bound (the export stops
// there). Once made, it holds the disk it takes.
func snapshotUsage(sb *engine.Sandbox) tenant.Usage {
	return tenant.Usage{Snapshots: 1, Disk: placement.UsageOf(sb.CPUs, sb.Memory, sb.Disk).Disk}
}

// inUse is what tenant holds (see admit): its calls in flight and its
// sandboxes, which it returns too; with volumes, its volumes' disk; with
// snapshots, its snapshots' and checkpoints' disk and count. The caller
// holds createMu.
func (s *Server) inUse(ctx context.Context, tenantName string, volumes, snapshots bool) (tenant.Usage, []*engine.Sandbox, error) {
	used := s.reserved[tenantName]
	sbs, err := s.tenantSandboxes(ctx, tenantName)
	if err != nil {
		return used, nil, err
	}
	for _, sb := range sbs {
		switch {
		// This server's creates in flight are in reserved already.
		case sb.State == engine.StateRunning,
			sb.State == engine.StateCreating && !sb.CreatingHere():
			used = used.Add(placement.UsageOf(sb.CPUs, sb.Memory, sb.Disk))
		case sb.State == engine.StatePaused:
			used.Disk += placement.UsageOf(sb.CPUs, sb.Memory, sb.Disk).Disk
		}
	}
	if volumes {
		vd, err := s.place.VolumesDisk(ctx, tenantName)
		if err != nil {
			return used, nil, err
		}
		used.Disk += vd
	}
	if snapshots {
		su, err := s.place.SnapshotsUsage(ctx, tenantName)
		if err != nil {
			return used, nil, err
		}
		used.Disk += su.Disk
		used.Snapshots += su.Snapshots
		cu, err := s.place.CheckpointsUsage(ctx, tenantName)
		if err != nil {
			return used, nil, err
		}
		used.Disk += cu.Disk
		used.Snapshots += cu.Snapshots
	}
	return used, sbs, nil
}
