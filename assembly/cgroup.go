package assembly

import (
	"errors"
	"fmt"
	"os"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	"github.com/containerd/cgroups/v3/cgroup2"
	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Cgroup2Mount is where a unified (v2) host mounts its cgroup hierarchy.
const Cgroup2Mount = "/sys/fs/cgroup"

// CreateCgroup creates a sandbox's cgroup at path (a cgroupfs path such as
// /hutch/ID) with res, before runsc runs: runsc then joins a cgroup it did
// not create, applies nothing to it and never deletes it
// (docs/decisions/0004-sandbox-cgroups.md). The cgroup is the caller's to
// remove (RemoveCgroup) when the sandbox is stopped or removed, so a
// sandbox that died on its own (out of memory) keeps its counters until
// then. Every way a sandbox starts (create, resume, fork) goes through it.
//
// It returns the undo of a start that fails later: RemoveCgroup of path.
// On error nothing of the cgroup is left (on cgroup v1 a failure can leave
// the controllers made before it; they are removed).
//
// The host's mode decides the API: cgroup v1 (and hybrid hosts, whose
// controllers are all v1, like runsc's choice there) or unified v2.
func CreateCgroup(path string, res *specs.LinuxResources) (undo func() error, err error) {
	if cgroups.Mode() == cgroups.Unified {
		err = createCgroup2(Cgroup2Mount, path, res)
	} else if _, err = cgroup1.New(cgroup1.StaticPath(path), res); err != nil {
		err = fmt.Errorf("create cgroup %s: %w", path, err)
	}
	undo = func() error { return RemoveCgroup(path) }
	if err != nil {
		if rerr := undo(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	return undo, nil
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

// RemoveCgroup deletes the cgroup at path in every hierarchy it exists in,
// killing what is still in it first; a missing cgroup is not an error. It
// is the teardown of CreateCgroup, and safe to repeat.
func RemoveCgroup(path string) error {
	return removeCgroup(path)
}

// UpdateCgroup replaces the limits of the sandbox's cgroup at path.
func UpdateCgroup(path string, res *specs.LinuxResources) error {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path, cgroup2.WithMountpoint(Cgroup2Mount))
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

// CgroupStats are the counters of a sandbox's cgroup that hutch reports.
type CgroupStats struct {
	CPUUsageNS uint64
	// CPUPeriods, CPUThrottledPeriods and CPUThrottledNS are the CFS
	// bandwidth counters: the periods that had a quota in force, those in
	// which the cgroup used all of it and was throttled, and the time it
	// spent throttled.
	CPUPeriods          uint64
	CPUThrottledPeriods uint64
	CPUThrottledNS      uint64
	MemoryUsage         uint64
	MemoryLimit         uint64
	// SwapUsage is the cgroup's memory in swap; KernelUsage the host
	// kernel's memory charged to it (stacks, slab).
	SwapUsage   uint64
	KernelUsage uint64
	OOMKills    uint64
	Pids        uint64
	PidsLimit   uint64
}

// ErrNoCgroup: the sandbox has no cgroup (rootless, or already removed).
var ErrNoCgroup = errors.New("no cgroup")

// ReadCgroup reads the counters of the cgroup at path (a cgroupfs path
// such as /hutch/ID): those of a sandbox's cgroup, including its OOM kills,
// which stay readable after the sandbox died until the cgroup is removed.
func ReadCgroup(path string) (CgroupStats, error) {
	m, err := CgroupMetrics(path)
	if err != nil {
		return CgroupStats{}, err
	}
	if v2, ok := m.(*v2stats.Metrics); ok {
		return v2Counters(v2), nil
	}
	return v1Counters(m.(*v1stats.Metrics)), nil
}

// CgroupMetrics reads the cgroup at path (a cgroupfs path) whole, as the
// cgroups metrics containerd carries in a task's stats: *v1stats.Metrics
// on cgroup v1 (and hybrid) hosts, *v2stats.Metrics on unified ones. A
// cgroup that does not exist is ErrNoCgroup.
func CgroupMetrics(path string) (any, error) {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path, cgroup2.WithMountpoint(Cgroup2Mount))
		if err != nil {
			return nil, ErrNoCgroup
		}
		if _, err := os.Stat(Cgroup2Mount + path); err != nil {
			return nil, ErrNoCgroup
		}
		return m.Stat()
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		return nil, ErrNoCgroup
	}
	return c.Stat(cgroup1.IgnoreNotExist)
}

func v1Counters(st *v1stats.Metrics) CgroupStats {
	var s CgroupStats
	if c := st.GetCPU(); c != nil {
		s.CPUUsageNS = c.GetUsage().GetTotal()
		if t := c.GetThrottling(); t != nil {
			s.CPUPeriods, s.CPUThrottledPeriods, s.CPUThrottledNS = t.Periods, t.ThrottledPeriods, t.ThrottledTime
		}
	}
	if m := st.GetMemory(); m != nil {
		s.MemoryUsage, s.MemoryLimit = m.GetUsage().GetUsage(), m.GetUsage().GetLimit()
		// v1 accounts memory and swap together (memory.memsw).
		if sw := m.GetSwap().GetUsage(); sw > s.MemoryUsage {
			s.SwapUsage = sw - s.MemoryUsage
		}
		s.KernelUsage = m.GetKernel().GetUsage()
	}
	if o := st.GetMemoryOomControl(); o != nil {
		s.OOMKills = o.OomKill
	}
	if p := st.GetPids(); p != nil {
		s.Pids, s.PidsLimit = p.Current, p.Limit
	}
	return s
}

func v2Counters(st *v2stats.Metrics) CgroupStats {
	var s CgroupStats
	if c := st.GetCPU(); c != nil {
		s.CPUUsageNS = c.UsageUsec * 1000
		s.CPUPeriods, s.CPUThrottledPeriods, s.CPUThrottledNS = c.NrPeriods, c.NrThrottled, c.ThrottledUsec*1000
	}
	if m := st.GetMemory(); m != nil {
		s.MemoryUsage, s.MemoryLimit = m.Usage, m.UsageLimit
		s.SwapUsage = m.SwapUsage
		s.KernelUsage = m.KernelStack + m.Slab
	}
	if ev := st.GetMemoryEvents(); ev != nil {
		s.OOMKills = ev.OomKill
	}
	if p := st.GetPids(); p != nil {
		s.Pids, s.PidsLimit = p.Current, p.Limit
	}
	return s
}

// ProcessCgroup is the cgroupfs path of the cgroup process pid runs in, as
// ReadCgroup takes it: its memory controller's on cgroup v1 (and hybrid)
// hosts, its unified group on v2. A pod's sandbox runs in the cgroup
// kubelet made for the pod, which the shim finds this way.
func ProcessCgroup(pid int) (string, error) {
	if cgroups.Mode() == cgroups.Unified {
		return cgroup2.PidGroupPath(pid)
	}
	paths, err := cgroup1.ParseCgroupFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	p, ok := paths["memory"]
	if !ok {
		return "", fmt.Errorf("process %d: no memory cgroup: %w", pid, ErrNoCgroup)
	}
	return p, nil
}
