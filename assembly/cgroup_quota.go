package assembly

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// cgroup1CPU is where a cgroup v1 (or hybrid) host mounts its cpu
// controller.
const cgroup1CPU = "/sys/fs/cgroup/cpu"

// CPUQuota reads the CFS quota and period of the cgroup at path (a
// cgroupfs path such as /kubepods/podUID). A quota of zero means none.
func CPUQuota(path string) (quota int64, period uint64, err error) {
	if cgroups.Mode() == cgroups.Unified {
		return cpuMax(Cgroup2Mount, path)
	}
	return cfsQuota(cgroup1CPU, path)
}

// cpuMax reads a cgroup v2 group's cpu.max ("max 100000" or "25000
// 100000") under mount.
func cpuMax(mount, path string) (int64, uint64, error) {
	b, err := os.ReadFile(filepath.Join(mount, path, "cpu.max"))
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("cpu.max of %s: unexpected %q", path, b)
	}
	period, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cpu.max of %s: %w", path, err)
	}
	if f[0] == "max" {
		return 0, period, nil
	}
	quota, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cpu.max of %s: %w", path, err)
	}
	return quota, period, nil
}

// cfsQuota reads a cgroup v1 group's cpu.cfs_quota_us (-1: none) and
// cpu.cfs_period_us under mount.
func cfsQuota(mount, path string) (int64, uint64, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(mount, path, name))
		return strings.TrimSpace(string(b)), err
	}
	q, err := read("cpu.cfs_quota_us")
	if err != nil {
		return 0, 0, err
	}
	p, err := read("cpu.cfs_period_us")
	if err != nil {
		return 0, 0, err
	}
	quota, err := strconv.ParseInt(q, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cpu.cfs_quota_us of %s: %w", path, err)
	}
	period, err := strconv.ParseUint(p, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cpu.cfs_period_us of %s: %w", path, err)
	}
	return max(quota, 0), period, nil
}

// ClampCPU lowers res's CPU quota to the parent cgroup's, quota over
// period: a child may not ask for more CPU than its parent has (cgroup v1
// refuses the write with EINVAL), and the parent bounds it anyway. An
// unset quota under a limited parent takes the parent's.
func ClampCPU(res *specs.LinuxResources, parentQuota int64, parentPeriod uint64) {
	if parentQuota <= 0 || parentPeriod == 0 {
		return
	}
	if res.CPU != nil && res.CPU.Quota != nil && *res.CPU.Quota > 0 {
		period := uint64(100000)
		if res.CPU.Period != nil && *res.CPU.Period > 0 {
			period = *res.CPU.Period
		}
		if float64(*res.CPU.Quota)/float64(period) <= float64(parentQuota)/float64(parentPeriod) {
			return
		}
	}
	cpu := specs.LinuxCPU{}
	if res.CPU != nil {
		cpu = *res.CPU
	}
	q, p := parentQuota, parentPeriod
	cpu.Quota, cpu.Period = &q, &p
	res.CPU = &cpu
}
