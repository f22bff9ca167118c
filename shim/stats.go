package shim

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	"github.com/containerd/cgroups/v3/cgroup2"
	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/runsc"
)

// Stats reports a container's usage as cgroups v3 metrics (v1 or v2, as
// the host's cgroups are), with the fields kubelet reads through CRI: CPU
// usage and CFS throttling, memory with swap and kernel usage, OOM kills,
// processes.
//
// The sandbox container's are its host cgroup's, which holds the whole
// pod; they stay readable after the sandbox died (an OOM kill) until the
// container is deleted. A joined container's usage (CPU, memory,
// processes) is what gVisor's kernel accounts for it; what it shares with
// the pod's other containers is the sandbox cgroup's: its memory limit,
// swap and kernel memory, CFS throttling (one quota for the sandbox) and
// OOM kills (an OOM kill ends the sandbox and every container in it).
func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	var cg string
	var gone chan struct{}
	if s.pod != nil {
		cg, gone = s.pod.oomCgroup, s.pod.gone
	}
	s.mu.Unlock()
	var m any
	if c.root {
		m, err = sandboxCgroupStats(cg, c.init.getPid())
	} else {
		m, err = s.joinedStats(ctx, c.id, cg, gone)
	}
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	a, err := typeurl.MarshalAnyToProto(m)
	if err != nil {
		return nil, err
	}
	return &taskAPI.StatsResponse{Stats: a}, nil
}

func unified() bool { return cgroups.Mode() == cgroups.Unified }

// sandboxCgroupStats reads the metrics of the sandbox's cgroup: the one
// found when it started (path), else the cgroup of process pid.
func sandboxCgroupStats(path string, pid int) (any, error) {
	if path != "" {
		return assembly.CgroupMetrics(path)
	}
	if unified() {
		path, err := cgroup2.PidGroupPath(pid)
		if err != nil {
			return nil, err
		}
		cg, err := cgroup2.Load(path)
		if err != nil {
			return nil, err
		}
		return cg.Stat()
	}
	cg, err := cgroup1.Load(cgroup1.PidPath(pid))
	if err != nil {
		return nil, err
	}
	return cg.Stat(cgroup1.IgnoreNotExist)
}

// joinedStats are a joined container's metrics: gVisor's accounting of
// it over what it shares of the sandbox cgroup at path. Once the sandbox
// is gone (gone closed), only the shared part is left to report.
func (s *service) joinedStats(ctx context.Context, id, path string, gone <-chan struct{}) (any, error) {
	var shared any
	if path != "" {
		m, err := assembly.CgroupMetrics(path)
		if err != nil && !errors.Is(err, assembly.ErrNoCgroup) {
			return nil, err
		}
		shared = m
	}
	rs := s.runsc()
	if rs == nil {
		return nil, fmt.Errorf("container %s: its sandbox is gone: %w", id, errdefs.ErrNotFound)
	}
	st, err := rs.Stats(ctx, id)
	if err != nil {
		select {
		case <-gone:
			if shared != nil {
				return joinedMetrics(shared, &runsc.Stats{}), nil
			}
			return nil, errors.Join(err, errdefs.ErrNotFound)
		default:
			return nil, err
		}
	}
	if shared == nil {
		if unified() {
			shared = &v2stats.Metrics{}
		} else {
			shared = &v1stats.Metrics{}
		}
	}
	return joinedMetrics(shared, st), nil
}

// joinedMetrics renders a joined container's metrics from the sandbox
// cgroup's (v1 or v2) and gVisor's accounting of the container, st: usage
// is the container's own; limits, swap, kernel memory, CFS throttling and
// OOM kills are the sandbox's, which its containers share.
func joinedMetrics(sandbox any, st *runsc.Stats) any {
	if sb, ok := sandbox.(*v2stats.Metrics); ok {
		m := &v2stats.Metrics{
			Pids:   &v2stats.PidsStat{Current: st.Pids.Current, Limit: st.Pids.Limit},
			CPU:    &v2stats.CPUStat{UsageUsec: st.CPU.Usage.Total / 1000},
			Memory: &v2stats.MemoryStat{Usage: st.Memory.Usage.Usage, MaxUsage: st.Memory.Usage.Max, UsageLimit: st.Memory.Usage.Limit},
		}
		if c := sb.GetCPU(); c != nil {
			m.CPU.NrPeriods, m.CPU.NrThrottled, m.CPU.ThrottledUsec = c.NrPeriods, c.NrThrottled, c.ThrottledUsec
		}
		if mem := sb.GetMemory(); mem != nil {
			m.Memory.UsageLimit = mem.UsageLimit
			m.Memory.SwapUsage, m.Memory.SwapLimit = mem.SwapUsage, mem.SwapLimit
			m.Memory.KernelStack, m.Memory.Slab = mem.KernelStack, mem.Slab
		}
		if ev := sb.GetMemoryEvents(); ev != nil {
			m.MemoryEvents = &v2stats.MemoryEvents{Oom: ev.Oom, OomKill: ev.OomKill, Max: ev.Max, High: ev.High}
		}
		return m
	}
	sb, _ := sandbox.(*v1stats.Metrics)
	m := &v1stats.Metrics{
		Pids: &v1stats.PidsStat{Current: st.Pids.Current, Limit: st.Pids.Limit},
		CPU:  &v1stats.CPUStat{Usage: &v1stats.CPUUsage{Total: st.CPU.Usage.Total, PerCPU: st.CPU.Usage.PerCPU}},
		Memory: &v1stats.MemoryStat{Usage: &v1stats.MemoryEntry{
			Usage: st.Memory.Usage.Usage, Limit: st.Memory.Usage.Limit, Max: st.Memory.Usage.Max, Failcnt: st.Memory.Usage.Failcnt,
		}},
	}
	if t := sb.GetCPU().GetThrottling(); t != nil {
		m.CPU.Throttling = &v1stats.Throttle{Periods: t.Periods, ThrottledPeriods: t.ThrottledPeriods, ThrottledTime: t.ThrottledTime}
	}
	if mem := sb.GetMemory(); mem != nil {
		if u := mem.GetUsage(); u != nil {
			m.Memory.Usage.Limit, m.Memory.Usage.Failcnt = u.Limit, u.Failcnt
		}
		m.Memory.HierarchicalMemoryLimit, m.Memory.HierarchicalSwapLimit = mem.HierarchicalMemoryLimit, mem.HierarchicalSwapLimit
		m.Memory.Swap, m.Memory.Kernel, m.Memory.KernelTCP = mem.Swap, mem.Kernel, mem.KernelTCP
	}
	if o := sb.GetMemoryOomControl(); o != nil {
		m.MemoryOomControl = &v1stats.MemoryOomControl{OomKillDisable: o.OomKillDisable, UnderOom: o.UnderOom, OomKill: o.OomKill}
	}
	return m
}

// oomKills is the number of OOM kills the cgroup at path (a cgroupfs
// path, from assembly.ProcessCgroup) has seen; 0 if it cannot be read.
func oomKills(path string) uint64 {
	if path == "" {
		return 0
	}
	st, err := assembly.ReadCgroup(path)
	if err != nil {
		return 0
	}
	return st.OOMKills
}

// processCgroup is the cgroup process pid runs in, or "" if it cannot be
// read (the process is gone).
func processCgroup(pid int) string {
	path, err := assembly.ProcessCgroup(pid)
	if err != nil {
		return ""
	}
	return path
}
