package policy

import (
	"math"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// CPUPeriod is the CFS period of a sandbox's CPU quota, in microseconds.
const CPUPeriod = 100000

// HostPids is the host cgroup's pids limit for a sandbox allowed pids
// processes inside.
//
// The host cgroup counts the host tasks of gVisor, not the sandbox's own
// processes: the sentry's and gofer's threads and, on the systrap
// platform, about two host tasks per sandboxed process (measured: 100
// sleeping processes add 211 host tasks). A host limit equal to pids would
// kill the whole sandbox (the sentry cannot make a thread) long before its
// processes reach pids. So the sandbox's own count is bounded inside gVisor
// (ProcessLimit) and the host limit is a backstop above it that still
// stops a runaway sandbox from exhausting the host's PIDs.
func HostPids(pids int64) int64 { return 3*pids + 256 }

// HostResources renders r's limits as the host cgroup's resources: CPU
// quota over CPUPeriod, memory (the sentry's memory, which holds all of the
// sandbox's), and the HostPids backstop.
func HostResources(r Request) *specs.LinuxResources {
	quota := int64(math.Ceil(r.CPUs * CPUPeriod))
	period := uint64(CPUPeriod)
	mem, pids := r.Memory, HostPids(r.Pids)
	return &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
		Memory: &specs.LinuxMemory{Limit: &mem},
		Pids:   &specs.LinuxPids{Limit: &pids},
	}
}

// ProcessLimit bounds the number of processes (threads) inside the
// sandbox: RLIMIT_NPROC, soft and hard, which gVisor enforces per user on
// every process of the sandbox (init and exec alike, all take the init's
// rlimits). A fork past it fails with EAGAIN, as on Linux, and the
// sandbox lives on. The sandbox's processes lack CAP_SYS_RESOURCE and
// CAP_SYS_ADMIN, so they cannot raise it or bypass it.
func ProcessLimit(r Request) SpecOpt {
	return func(s *specs.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		n := uint64(r.Pids)
		var out []specs.POSIXRlimit
		for _, l := range s.Process.Rlimits {
			if l.Type != "RLIMIT_NPROC" {
				out = append(out, l)
			}
		}
		s.Process.Rlimits = append(out, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
		return nil
	}
}
