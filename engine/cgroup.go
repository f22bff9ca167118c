package engine

import (
	"context"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly"
)

// createCgroup creates sandbox sb's cgroup with the host resources of its
// record through assembly (hutch owns it; runsc joins it: see
// assembly.CreateCgroup) and puts its removal on undo. Create, resume and
// fork all start a sandbox this way. A rootless sandbox has one only in
// its user's delegated subtree (createDelegatedCgroup).
func (e *Engine) createCgroup(ctx context.Context, sb *record, res *specs.LinuxResources, undo *assembly.Undo) error {
	if e.rootless {
		return e.createDelegatedCgroup(ctx, sb, undo)
	}
	rm, err := assembly.CreateCgroup(cgroupPath(sb.ID), res)
	if err != nil {
		return err
	}
	undo.Add(func() {
		if err := rm(); err != nil {
			log.G(ctx).WithError(err).Warn("remove cgroup")
		}
	})
	// The sandbox's DNS resolver serves its queries on the host: what a
	// flood of them costs counts against the sandbox's own limits.
	if sb.ResolverPid != 0 && assembly.SameProcess(sb.ResolverPid, sb.ResolverStart) {
		if err := assembly.JoinCgroup(cgroupPath(sb.ID), sb.ResolverPid); err != nil {
			return err
		}
	}
	return nil
}

// updateCgroup replaces the limits of the sandbox's cgroup at path.
func updateCgroup(path string, res *specs.LinuxResources) error {
	return assembly.UpdateCgroup(path, res)
}

// cgroupStats are the counters of a sandbox's cgroup that hutch reports.
type cgroupStats = assembly.CgroupStats

// errNoCgroup: the sandbox has no cgroup (rootless, or already removed).
var errNoCgroup = assembly.ErrNoCgroup

// readCgroup reads the counters of the cgroup at path.
func readCgroup(path string) (cgroupStats, error) { return assembly.ReadCgroup(path) }
