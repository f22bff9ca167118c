package assembly

import (
	"fmt"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
)

// JoinCgroup moves process pid (a helper hutch runs on the host for one
// sandbox, such as its DNS resolver) into the sandbox's cgroup at path,
// so that what the sandbox makes it spend counts against the sandbox's
// own limits, and it goes with the sandbox's cgroup.
func JoinCgroup(path string, pid int) error {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path, cgroup2.WithMountpoint(Cgroup2Mount))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", path, err)
		}
		return m.AddProc(uint64(pid))
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	if err := c.Add(cgroup1.Process{Pid: pid}); err != nil {
		return fmt.Errorf("move %d into cgroup %s: %w", pid, path, err)
	}
	return nil
}
