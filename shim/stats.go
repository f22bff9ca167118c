package shim

import (
	"context"
	"fmt"
	"math"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	"github.com/containerd/cgroups/v3/cgroup2"
	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/assembly"
	"sbx.dev/sbx/policy"
)

// Stats reports a container's usage as cgroups v3 metrics (v1 or v2, as
// the host's cgroups are): the sandbox container's are its host cgroup's,
// which hold the whole pod; a joined container's are what gVisor's kernel
// accounts for it.
func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	var m any
	if c.root {
		m, err = hostCgroupStats(c.init.getPid())
	} else {
		m, err = s.sandboxStats(ctx, c.id)
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

// hostCgroupStats reads the metrics of the cgroup process pid is in.
func hostCgroupStats(pid int) (any, error) {
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

// sandboxStats renders runsc's per-container accounting as metrics.
func (s *service) sandboxStats(ctx context.Context, id string) (any, error) {
	st, err := s.runsc().Stats(ctx, id)
	if err != nil {
		return nil, err
	}
	if unified() {
		return &v2stats.Metrics{
			Pids:   &v2stats.PidsStat{Current: st.Pids.Current, Limit: st.Pids.Limit},
			CPU:    &v2stats.CPUStat{UsageUsec: st.CPU.Usage.Total / 1000},
			Memory: &v2stats.MemoryStat{Usage: st.Memory.Usage.Usage, UsageLimit: st.Memory.Usage.Limit, MaxUsage: st.Memory.Usage.Max},
		}, nil
	}
	return &v1stats.Metrics{
		Pids: &v1stats.PidsStat{Current: st.Pids.Current, Limit: st.Pids.Limit},
		CPU:  &v1stats.CPUStat{Usage: &v1stats.CPUUsage{Total: st.CPU.Usage.Total, PerCPU: st.CPU.Usage.PerCPU}},
		Memory: &v1stats.MemoryStat{Usage: &v1stats.MemoryEntry{
			Usage: st.Memory.Usage.Usage, Limit: st.Memory.Usage.Limit, Max: st.Memory.Usage.Max, Failcnt: st.Memory.Usage.Failcnt,
		}},
	}, nil
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

// checkResources validates an update's limits with sbx's own bounds.
func checkResources(res *specs.LinuxResources) error {
	req := policy.Request{}
	if res.Memory != nil && res.Memory.Limit != nil && *res.Memory.Limit > 0 {
		req.Memory = *res.Memory.Limit
	}
	if res.Pids != nil && res.Pids.Limit != nil && *res.Pids.Limit > 0 {
		req.Pids = *res.Pids.Limit
	}
	if res.CPU != nil && res.CPU.Quota != nil && res.CPU.Period != nil && *res.CPU.Quota > 0 && *res.CPU.Period > 0 {
		req.CPUs = float64(*res.CPU.Quota) / float64(*res.CPU.Period)
		if math.IsInf(req.CPUs, 0) {
			return fmt.Errorf("cpu quota %d: %w", *res.CPU.Quota, errdefs.ErrInvalidArgument)
		}
	}
	_, err := policy.Validate(req)
	return err
}
