package assembly

import (
	"testing"

	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
)

// A cgroup's counters as hutch reports them, from a v1 and a v2 hierarchy's
// metrics alike: CFS throttling, swap (v1 counts memory and swap
// together), kernel memory and OOM kills.
func TestCgroupCounters(t *testing.T) {
	want := CgroupStats{
		CPUUsageNS: 9e9, CPUPeriods: 50, CPUThrottledPeriods: 40, CPUThrottledNS: 3e9,
		MemoryUsage: 100 << 20, MemoryLimit: 256 << 20, SwapUsage: 5 << 20, KernelUsage: 2 << 20,
		OOMKills: 2, Pids: 4, PidsLimit: 556,
	}
	v1 := v1Counters(&v1stats.Metrics{
		CPU: &v1stats.CPUStat{Usage: &v1stats.CPUUsage{Total: 9e9}, Throttling: &v1stats.Throttle{Periods: 50, ThrottledPeriods: 40, ThrottledTime: 3e9}},
		Memory: &v1stats.MemoryStat{
			Usage:  &v1stats.MemoryEntry{Usage: 100 << 20, Limit: 256 << 20},
			Swap:   &v1stats.MemoryEntry{Usage: 105 << 20},
			Kernel: &v1stats.MemoryEntry{Usage: 2 << 20},
		},
		MemoryOomControl: &v1stats.MemoryOomControl{OomKill: 2},
		Pids:             &v1stats.PidsStat{Current: 4, Limit: 556},
	})
	if v1 != want {
		t.Errorf("v1:\n got %+v\nwant %+v", v1, want)
	}
	v2 := v2Counters(&v2stats.Metrics{
		CPU:          &v2stats.CPUStat{UsageUsec: 9e6, NrPeriods: 50, NrThrottled: 40, ThrottledUsec: 3e6},
		Memory:       &v2stats.MemoryStat{Usage: 100 << 20, UsageLimit: 256 << 20, SwapUsage: 5 << 20, KernelStack: 1 << 20, Slab: 1 << 20},
		MemoryEvents: &v2stats.MemoryEvents{OomKill: 2},
		Pids:         &v2stats.PidsStat{Current: 4, Limit: 556},
	})
	if v2 != want {
		t.Errorf("v2:\n got %+v\nwant %+v", v2, want)
	}
	// A cgroup without swap accounting shows no memsw use.
	if got := v1Counters(&v1stats.Metrics{Memory: &v1stats.MemoryStat{Usage: &v1stats.MemoryEntry{Usage: 1 << 20}}}); got.SwapUsage != 0 {
		t.Errorf("v1 without swap accounting: swap %d", got.SwapUsage)
	}
}
