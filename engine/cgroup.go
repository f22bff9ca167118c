package engine

import (
	"errors"
	"fmt"
	"os"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// cgroup2Mount is where a unified (v2) host mounts its cgroup hierarchy.
const cgroup2Mount = "/sys/fs/cgroup"

// createCgroup creates the sandbox's cgroup at path with res, before runsc
// runs: runsc then joins a cgroup it did not create, applies nothing to it
// and never deletes it (docs/decisions/0004-sandbox-cgroups.md). sbx
// deletes it (hostcgroup.Remove) when the sandbox is stopped or removed, so a
// sandbox that died on its own (out of memory) keeps its counters until
// then.
//
// The host's mode decides the API: cgroup v1 (and hybrid hosts, whose
// controllers are all v1, like runsc's choice there) or unified v2.
func createCgroup(path string, res *specs.LinuxResources) error {
	if cgroups.Mode() == cgroups.Unified {
		return createCgroup2(cgroup2Mount, path, res)
	}
	if _, err := cgroup1.New(cgroup1.StaticPath(path), res); err != nil {
		return fmt.Errorf("create cgroup %s: %w", path, err)
	}
	return nil
}

// createCgroup2 creates a cgroup v2 group at path under the unified
// hierarchy mounted at mount, enabling the controllers res needs in its
// parents.
func createCgroup2(mount, path string, res *specs.LinuxResources) error {
	if _, err := cgroup2.NewManager(mount, path, cgroup2.ToResources(res)); err != nil {
		return fmt.Errorf("create cgroup %s: %w", path, err)
	}
	return nil
}

// updateCgroup replaces the limits of the sandbox's cgroup at path.
func updateCgroup(path string, res *specs.LinuxResources) error {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path, cgroup2.WithMountpoint(cgroup2Mount))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", path, err)
		}
		return m.Update(cgroup2.ToResources(res))
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	return c.Update(res)
}

// cgroupStats are the counters of a sandbox's cgroup that sbx reports.
type cgroupStats struct {
	CPUUsageNS  uint64
	MemoryUsage uint64
	MemoryLimit uint64
	OOMKills    uint64
	Pids        uint64
	PidsLimit   uint64
}

// errNoCgroup: the sandbox has no cgroup (rootless, or already removed).
var errNoCgroup = errors.New("no cgroup")

// readCgroup reads the counters of the cgroup at path.
func readCgroup(path string) (cgroupStats, error) {
	var s cgroupStats
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path, cgroup2.WithMountpoint(cgroup2Mount))
		if err != nil {
			return s, errNoCgroup
		}
		if _, err := os.Stat(cgroup2Mount + path); err != nil {
			return s, errNoCgroup
		}
		st, err := m.Stat()
		if err != nil {
			return s, err
		}
		if c := st.GetCPU(); c != nil {
			s.CPUUsageNS = c.UsageUsec * 1000
		}
		if mem := st.GetMemory(); mem != nil {
			s.MemoryUsage, s.MemoryLimit = mem.Usage, mem.UsageLimit
		}
		if ev := st.GetMemoryEvents(); ev != nil {
			s.OOMKills = ev.OomKill
		}
		if p := st.GetPids(); p != nil {
			s.Pids, s.PidsLimit = p.Current, p.Limit
		}
		return s, nil
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		return s, errNoCgroup
	}
	st, err := c.Stat(cgroup1.IgnoreNotExist)
	if err != nil {
		return s, err
	}
	return v1Counters(st), nil
}

func v1Counters(st *v1stats.Metrics) cgroupStats {
	var s cgroupStats
	if c := st.GetCPU(); c != nil && c.Usage != nil {
		s.CPUUsageNS = c.Usage.Total
	}
	if m := st.GetMemory(); m != nil && m.Usage != nil {
		s.MemoryUsage, s.MemoryLimit = m.Usage.Usage, m.Usage.Limit
	}
	if o := st.GetMemoryOomControl(); o != nil {
		s.OOMKills = o.OomKill
	}
	if p := st.GetPids(); p != nil {
		s.Pids, s.PidsLimit = p.Current, p.Limit
	}
	return s
}
