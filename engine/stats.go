package engine

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/policy"
)

// Stats is a sandbox's resource use, measured from the host.
type Stats struct {
	ID     string      `json:"id"`
	CPU    CPUStats    `json:"cpu"`
	Memory MemoryStats `json:"memory"`
	Pids   PidsStats   `json:"pids"`
	Disk   DiskStats   `json:"disk"`
}

// CPUStats: CPU time of the sandbox's cgroup.
type CPUStats struct {
	// UsageNS is the CPU time used since the sandbox started.
	UsageNS uint64 `json:"usageNs"`
	// Percent is the use over StatsSample, 100 = one core.
	Percent float64 `json:"percent"`
	// Limit is the limit in cores (--cpus).
	Limit float64 `json:"limit"`
}

// MemoryStats: memory of the sandbox's cgroup (gVisor's sentry, which
// holds all of the sandbox's memory, and its gofer).
type MemoryStats struct {
	Usage    uint64 `json:"usage"`
	Limit    uint64 `json:"limit"`
	OOMKills uint64 `json:"oomKills"`
}

// PidsStats: processes inside the sandbox and host tasks of its cgroup.
type PidsStats struct {
	// Current is the number of processes inside the sandbox.
	Current int `json:"current"`
	// Limit is the sandbox's process limit (--pids).
	Limit int64 `json:"limit"`
	// HostTasks is the number of host tasks (gVisor's threads and
	// stubs) in the sandbox's cgroup, HostLimit their limit.
	HostTasks uint64 `json:"hostTasks"`
	HostLimit uint64 `json:"hostLimit"`
}

// DiskStats: the sandbox's writable layer.
type DiskStats struct {
	// Used is the host disk space of the overlay file that holds the
	// sandbox's writes.
	Used uint64 `json:"used"`
	// Limit is its size limit (--disk).
	Limit int64 `json:"limit"`
}

// StatsSample is the window over which Stats measures CPU percent.
const StatsSample = 250 * time.Millisecond

// Stats measures sandbox ref's resource use from the host: its cgroup's
// counters, its overlay file and its process count. It needs a running
// sandbox started as root (a rootless sandbox has no cgroup).
func (e *Engine) Stats(ctx context.Context, ref string) (*Stats, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, err
	}
	if sb.State != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	if sb.Rootless {
		return nil, fmt.Errorf("sandbox %s is rootless: it has no cgroup to measure: %w", sb.ShortID(), errdefs.ErrNotImplemented)
	}
	path := cgroupPath(sb.ID)
	c0, err := readCgroup(path)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: cgroup %s: %w", sb.ShortID(), path, err)
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(StatsSample):
	}
	c1, err := readCgroup(path)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: cgroup %s: %w", sb.ShortID(), path, err)
	}
	st := &Stats{ID: sb.ID}
	st.CPU = CPUStats{UsageNS: c1.CPUUsageNS, Limit: sb.CPUs}
	if wall := time.Since(t0); wall > 0 && c1.CPUUsageNS >= c0.CPUUsageNS {
		st.CPU.Percent = math.Round(float64(c1.CPUUsageNS-c0.CPUUsageNS)/float64(wall.Nanoseconds())*1000) / 10
	}
	st.Memory = MemoryStats{Usage: c1.MemoryUsage, Limit: c1.MemoryLimit, OOMKills: c1.OOMKills}
	st.Pids = PidsStats{Limit: sb.Pids, HostTasks: c1.Pids, HostLimit: c1.PidsLimit}
	if ps, err := e.runscFor(sb).Ps(ctx, sb.ID); err == nil {
		st.Pids.Current = len(ps)
	}
	st.Disk = DiskStats{Used: overlayUsage(sb.Pid, e.sandboxDir(sb.ID)), Limit: sb.Disk}
	return st, nil
}

// overlayUsage is the host disk space taken by the sandbox's overlay
// file. runsc creates it under dir and unlinks it at once, so it is found
// among the sandbox process's open files.
func overlayUsage(pid int, dir string) uint64 {
	fds, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/fd/*")
	var used uint64
	for _, fd := range fds {
		target, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(target, dir+"/runsc-filestore-") {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fd, &st) == nil {
			used += uint64(st.Blocks) * 512
		}
	}
	return used
}

// checkOOM sets sb.OOMKilled when the sandbox ended on its own and its
// cgroup counted an OOM kill. A sandbox's only OOM victim can be gVisor's
// sentry, which holds all of its memory: one kill ends the sandbox.
func (e *Engine) checkOOM(sb *record) {
	if sb.OOMKilled || sb.Rootless || sb.State != StateStopped || sb.Stopped {
		return
	}
	if c, err := readCgroup(cgroupPath(sb.ID)); err == nil && c.OOMKills > 0 {
		sb.OOMKilled = true
	}
}

// ErrOOMKilled: the sandbox was ended by the out-of-memory killer.
var ErrOOMKilled = fmt.Errorf("out of memory")

// ExitOOMKilled is what exec reports for a command whose sandbox was
// OOM-killed under it: 128+SIGKILL, as for a process the OOM killer ends.
const ExitOOMKilled = 137

func oomError(sb *record) error {
	return fmt.Errorf("sandbox %s was killed: %w: it reached its memory limit (%s) and all its processes are gone", sb.ShortID(), ErrOOMKilled, policy.FormatSize(sb.Memory))
}
