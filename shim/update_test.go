package shim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"hutch.dev/hutch/runsc"
)

func updateRequest(t *testing.T, id string, res specs.LinuxResources) *taskAPI.UpdateTaskRequest {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return &taskAPI.UpdateTaskRequest{ID: id, Resources: &anypb.Any{Value: b}}
}

func i64(v int64) *int64   { return &v }
func u64(v uint64) *uint64 { return &v }
func mem(v int64) specs.LinuxResources {
	return specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &v}}
}

// An update above the operator's ceiling is refused as a pod's create
// is: PermissionDenied, naming the limit and the ceiling, and the pod's
// limits stay; one below hutch's bounds is InvalidArgument with the
// validator's message. Joined containers share the sandbox: their limits
// together may not exceed the ceiling either.
func TestUpdateCeiling(t *testing.T) {
	ceiling := limits{CPUs: 1, Memory: 512 << 20, Pids: 64}
	for _, tc := range []struct {
		name    string
		res     specs.LinuxResources
		other   *specs.LinuxResources // a second joined container's limits
		code    error
		message string
	}{
		{"memory", mem(1 << 30), nil, errdefs.ErrPermissionDenied, "memory limit 1GiB exceeds the operator's ceiling 512MiB"},
		{"cpu", specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(150000), Period: u64(100000)}}, nil,
			errdefs.ErrPermissionDenied, "cpu limit 1.5 CPUs exceeds the operator's ceiling 1 CPUs"},
		{"cpu without a period", specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(200000)}}, nil,
			errdefs.ErrPermissionDenied, "cpu limit 2 CPUs exceeds"},
		{"pids", specs.LinuxResources{Pids: &specs.LinuxPids{Limit: i64(65)}}, nil,
			errdefs.ErrPermissionDenied, "pids limit 65 exceeds the operator's ceiling 64 processes"},
		{"together", mem(300 << 20), &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(300 << 20)}},
			errdefs.ErrPermissionDenied, "the pod's containers together: memory limit 600MiB exceeds the operator's ceiling 512MiB"},
		{"below the minimum", mem(1 << 20), nil, errdefs.ErrInvalidArgument, "--memory 1MiB below the minimum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, root := testService(t, nil)
			pol := podPolicy{CPUs: 0.5, Memory: 256 << 20, Pids: 32, Max: ceiling}
			s.pod.policy = pol
			s.pod.oomCgroup = "/hutch-test-no-such-cgroup"
			joined := &container{id: "c2", spec: &specs.Spec{Linux: &specs.Linux{}}, execs: map[string]*process{}, init: newProcess("c2", "", stdio{})}
			s.containers["c2"] = joined
			if tc.other != nil {
				s.containers["c3"] = &container{id: "c3", spec: &specs.Spec{Linux: &specs.Linux{Resources: tc.other}}, init: newProcess("c3", "", stdio{})}
			}
			for _, c := range []*container{root, joined} {
				if tc.other != nil && c == root {
					continue // the sum is of joined containers
				}
				_, err := s.Update(context.Background(), updateRequest(t, c.id, tc.res))
				err = errgrpc.ToNative(err)
				if !errorIs(err, tc.code) || !strings.Contains(err.Error(), tc.message) {
					t.Fatalf("update of %s: %v, want %v with %q", c.id, err, tc.code, tc.message)
				}
				if !strings.Contains(err.Error(), "container "+c.id) {
					t.Errorf("the error does not name the container: %v", err)
				}
			}
			if s.pod.policy.CPUs != pol.CPUs || s.pod.policy.Memory != pol.Memory || s.pod.policy.Pids != pol.Pids {
				t.Fatalf("a refused update changed the pod's limits: %+v", s.pod.policy)
			}
		})
	}
}

func errorIs(err, target error) bool {
	switch target {
	case errdefs.ErrPermissionDenied:
		return errdefs.IsPermissionDenied(err)
	case errdefs.ErrInvalidArgument:
		return errdefs.IsInvalidArgument(err)
	}
	return false
}

// An update within the ceiling passes the ceiling and goes to the
// sandbox's cgroup (here one that does not exist, so the write fails).
func TestUpdateWithinCeilingReachesCgroup(t *testing.T) {
	s, root := testService(t, nil)
	s.pod.policy = podPolicy{CPUs: 0.5, Memory: 256 << 20, Pids: 32, Max: limits{CPUs: 1, Memory: 512 << 20, Pids: 64}}
	s.pod.oomCgroup = "/hutch-test-no-such-cgroup"
	_, err := s.Update(context.Background(), updateRequest(t, root.id, mem(512<<20)))
	err = errgrpc.ToNative(err)
	if err == nil || errdefs.IsPermissionDenied(err) || errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "hutch-test-no-such-cgroup") {
		t.Fatalf("update within the ceiling: %v, want the cgroup write's failure", err)
	}
	if s.pod.policy.Memory != 256<<20 {
		t.Fatalf("a failed update changed the pod's memory to %d", s.pod.policy.Memory)
	}
}

// The sandbox's limits after an update: the sandbox container's own
// update sets them; a joined container's sets each limit to the joined
// containers' sum where every one of them has that limit.
func TestSandboxLimits(t *testing.T) {
	cur := limits{CPUs: 2, Memory: 2 << 30, Pids: 1024}
	for _, tc := range []struct {
		name   string
		root   bool
		l      limits
		others []limits
		want   limits
	}{
		{"sandbox container", true, limits{Memory: 1 << 30}, nil, limits{CPUs: 2, Memory: 1 << 30, Pids: 1024}},
		{"only container", false, limits{CPUs: 0.5, Memory: 1 << 30}, nil, limits{CPUs: 0.5, Memory: 1 << 30, Pids: 1024}},
		{"sum", false, limits{Memory: 1 << 30}, []limits{{Memory: 256 << 20}}, limits{CPUs: 2, Memory: 1<<30 + 256<<20, Pids: 1024}},
		{"one without a limit", false, limits{Memory: 1 << 30}, []limits{{CPUs: 1}}, cur},
	} {
		if got := sandboxLimits(cur, tc.root, tc.l, tc.others); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// A joined container's metrics: its own usage from gVisor, and the
// sandbox cgroup's throttling, swap, kernel memory, limit and OOM kills,
// in the v1 and in the v2 form kubelet's CRI stats read.
func TestJoinedMetrics(t *testing.T) {
	var st runsc.Stats
	st.CPU.Usage.Total = 7e9
	st.Memory.Usage.Usage = 10 << 20
	st.Pids.Current = 3

	v1 := joinedMetrics(&v1stats.Metrics{
		CPU: &v1stats.CPUStat{Usage: &v1stats.CPUUsage{Total: 99e9}, Throttling: &v1stats.Throttle{Periods: 50, ThrottledPeriods: 40, ThrottledTime: 3e9}},
		Memory: &v1stats.MemoryStat{TotalInactiveFile: 1 << 30, Usage: &v1stats.MemoryEntry{Usage: 1 << 30, Limit: 512 << 20},
			Swap: &v1stats.MemoryEntry{Usage: 5 << 20}, Kernel: &v1stats.MemoryEntry{Usage: 2 << 20}},
		MemoryOomControl: &v1stats.MemoryOomControl{OomKill: 2},
	}, &st).(*v1stats.Metrics)
	if v1.CPU.Usage.Total != 7e9 || v1.Memory.Usage.Usage != 10<<20 || v1.Pids.Current != 3 {
		t.Errorf("v1: usage is not the container's: %v", v1)
	}
	if v1.Memory.TotalInactiveFile != 0 {
		t.Errorf("v1: the sandbox's page cache is counted against the container (working set 0): %v", v1.Memory)
	}
	if v1.CPU.Throttling.GetThrottledPeriods() != 40 || v1.CPU.Throttling.GetThrottledTime() != 3e9 || v1.Memory.Usage.Limit != 512<<20 ||
		v1.Memory.Swap.GetUsage() != 5<<20 || v1.Memory.Kernel.GetUsage() != 2<<20 || v1.MemoryOomControl.GetOomKill() != 2 {
		t.Errorf("v1: the sandbox's shared counters are missing: %v", v1)
	}

	v2 := joinedMetrics(&v2stats.Metrics{
		CPU:          &v2stats.CPUStat{UsageUsec: 99e6, NrPeriods: 50, NrThrottled: 40, ThrottledUsec: 3e6},
		Memory:       &v2stats.MemoryStat{Usage: 1 << 30, UsageLimit: 512 << 20, InactiveFile: 1 << 30, SwapUsage: 5 << 20, KernelStack: 1 << 20, Slab: 1 << 20},
		MemoryEvents: &v2stats.MemoryEvents{OomKill: 2},
	}, &st).(*v2stats.Metrics)
	if v2.CPU.UsageUsec != 7e6 || v2.Memory.Usage != 10<<20 || v2.Memory.InactiveFile != 0 || v2.Pids.Current != 3 {
		t.Errorf("v2: usage is not the container's: %v", v2)
	}
	if v2.CPU.NrThrottled != 40 || v2.CPU.ThrottledUsec != 3e6 || v2.Memory.UsageLimit != 512<<20 ||
		v2.Memory.SwapUsage != 5<<20 || v2.Memory.KernelStack != 1<<20 || v2.MemoryEvents.GetOomKill() != 2 {
		t.Errorf("v2: the sandbox's shared counters are missing: %v", v2)
	}
}
