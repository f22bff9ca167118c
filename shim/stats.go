package shim

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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

// memoryCgroupDir is the directory of the memory cgroup process pid is in.
func memoryCgroupDir(pid int) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if unified() && parts[0] == "0" {
			return filepath.Join("/sys/fs/cgroup", parts[2])
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				return filepath.Join("/sys/fs/cgroup/memory", parts[2])
			}
		}
	}
	return ""
}

// oomKills is the number of OOM kills the memory cgroup at dir has seen
// (memory.events on cgroup v2, memory.oom_control on v1).
func oomKills(dir string) uint64 {
	if dir == "" {
		return 0
	}
	name := "memory.oom_control"
	if unified() {
		name = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
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
