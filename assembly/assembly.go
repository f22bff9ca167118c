// Package assembly turns a validated policy request into the sandbox that
// runs: the runsc global flags of a sandbox and the spec options policy
// renders (seccomp, resources, the pids backstop). engine and the
// containerd shim both build their sandboxes through it, so that a pod gets
// what a CLI sandbox gets.
package assembly

import (
	"fmt"
	"math"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// RunscConfig is what differs between sandboxes in runsc's global flags.
type RunscConfig struct {
	// Path is the runsc binary, Root its state directory.
	Path, Root string
	// Platform is gVisor's platform ("" for runsc's default, systrap).
	Platform string
	// DebugLogDir, if set, receives runsc's debug logs.
	DebugLogDir string
	// Linked says the sandbox runs in a network namespace with a link
	// (hutch's veth, or a pod's CNI interfaces) that gVisor's netstack
	// takes over; otherwise it has loopback only.
	Linked bool
	// OverlayDir holds the file that backs the sandbox's writable layer;
	// empty puts it in the rootfs directory (runsc's root:self).
	OverlayDir string
	// Disk bounds the writable layer, in bytes; 0 leaves it unbounded.
	Disk int64
	// IgnoreCgroups is set for rootless sandboxes.
	IgnoreCgroups bool
	// AllowSUID lets setuid binaries (sudo) raise a process's privileges
	// inside the sandbox; the sandbox's own bounds hold as ever
	// (docs/security.md).
	AllowSUID bool
	// NetRaw turns on raw sockets in gVisor's netstack (a Docker
	// sandbox's iptables and bridge).
	NetRaw bool
}

// Runsc is the runsc wrapper for a sandbox: the same global flags for
// every command run against it. The spec's seccomp profile is always in
// force (--oci-seccomp).
func Runsc(c RunscConfig) *runsc.Runsc {
	overlay := "root:self"
	if c.OverlayDir != "" {
		overlay = "root:dir=" + c.OverlayDir
	}
	if c.Disk > 0 {
		overlay += ",size=" + strconv.FormatInt(c.Disk, 10)
	}
	network := "none"
	if c.Linked {
		network = "sandbox"
	}
	return &runsc.Runsc{
		Path:          c.Path,
		Root:          c.Root,
		Platform:      c.Platform,
		Network:       network,
		GoferNetNS:    "new",
		Overlay:       overlay,
		IgnoreCgroups: c.IgnoreCgroups,
		DebugLogDir:   c.DebugLogDir,
		OCISeccomp:    true,
		AllowSUID:     c.AllowSUID,
		NetRaw:        c.NetRaw,
	}
}

// SandboxOpts are the spec options of a sandbox's first container (the
// one that boots gVisor): host resources, the in-sandbox process limit,
// the seccomp profile and default capabilities. A Docker sandbox
// (r.Docker) gets Docker's profile, its mounts and every capability
// instead (docs/docker.md).
func SandboxOpts(r policy.Request) []policy.SpecOpt {
	if r.Docker {
		return []policy.SpecOpt{Resources(r), policy.DockerSeccomp(), policy.DockerMounts(r), AllCapabilities()}
	}
	return []policy.SpecOpt{Resources(r), policy.Seccomp(), DefaultCapabilities()}
}

// ContainerOpts are the spec options of a container that joins a running
// sandbox (a pod's second and later containers): its cgroup is the
// sandbox's, so only the process limit, seccomp and capabilities apply.
func ContainerOpts(r policy.Request) []policy.SpecOpt {
	opts := []policy.SpecOpt{policy.Seccomp(), DefaultCapabilities()}
	if !r.Rootless {
		opts = append(opts, policy.ProcessLimit(r))
	}
	return opts
}

// Apply applies opts to s in order.
func Apply(s *specs.Spec, opts ...policy.SpecOpt) error {
	for _, o := range opts {
		if err := o(s); err != nil {
			return fmt.Errorf("sandbox spec: %w", err)
		}
	}
	return nil
}

// Resources renders r's limits into the spec: the host cgroup's CPU,
// memory and pids backstop (policy.HostResources) and the in-sandbox
// process limit (policy.ProcessLimit). A limit the spec already holds
// stays when it is tighter (a Kubernetes pod's own limits); a rootless
// request gets none, as it runs without cgroups.
func Resources(r policy.Request) policy.SpecOpt {
	return func(s *specs.Spec) error {
		if r.Rootless {
			return nil
		}
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		s.Linux.Resources = tighten(s.Linux.Resources, policy.HostResources(r))
		return policy.ProcessLimit(r)(s)
	}
}

// tighten returns have with each of want's CPU quota, memory limit and
// pids limit put in where have sets none or a looser one.
func tighten(have, want *specs.LinuxResources) *specs.LinuxResources {
	if have == nil {
		return want
	}
	out := *have
	if cpus(have.CPU) > cpus(want.CPU) {
		c := specs.LinuxCPU{}
		if have.CPU != nil {
			c = *have.CPU
		}
		c.Quota, c.Period = want.CPU.Quota, want.CPU.Period
		out.CPU = &c
	}
	if limit(memLimit(have.Memory)) > limit(memLimit(want.Memory)) {
		m := specs.LinuxMemory{}
		if have.Memory != nil {
			m = *have.Memory
		}
		m.Limit = want.Memory.Limit
		out.Memory = &m
	}
	if limit(pidsLimit(have.Pids)) > limit(pidsLimit(want.Pids)) {
		out.Pids = want.Pids
	}
	return &out
}

// cpus is a CPU quota in CPUs; +Inf when there is none.
func cpus(c *specs.LinuxCPU) float64 {
	if c == nil || c.Quota == nil || c.Period == nil || *c.Quota <= 0 || *c.Period == 0 {
		return math.Inf(1)
	}
	return float64(*c.Quota) / float64(*c.Period)
}

func memLimit(m *specs.LinuxMemory) *int64 {
	if m == nil {
		return nil
	}
	return m.Limit
}

func pidsLimit(p *specs.LinuxPids) *int64 {
	if p == nil {
		return nil
	}
	return p.Limit
}

// limit is a cgroup limit; none (nil, or -1 for unlimited) is the largest.
func limit(v *int64) int64 {
	if v == nil || *v <= 0 {
		return math.MaxInt64
	}
	return *v
}

// AllCapabilities gives the sandbox's first process every capability of
// gVisor's kernel (runsc.AllCapabilities): a Docker sandbox's init, which
// its daemon descends from. A process started as another user than root
// (no effective capabilities) gets them in its bounding set only, for
// sudo.
func AllCapabilities() policy.SpecOpt {
	return func(s *specs.Spec) error {
		if s.Process == nil {
			return nil
		}
		caps := append([]string(nil), runsc.AllCapabilities...)
		if c := s.Process.Capabilities; c != nil && len(c.Effective) == 0 {
			s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps}
			return nil
		}
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
		return nil
	}
}

// DefaultCapabilities gives a process with no capabilities of its own
// the sandbox's default set (runsc.DefaultCapabilities), which are
// capabilities within gVisor's kernel, not the host's.
func DefaultCapabilities() policy.SpecOpt {
	return func(s *specs.Spec) error {
		if s.Process == nil || s.Process.Capabilities != nil {
			return nil
		}
		caps := append([]string(nil), runsc.DefaultCapabilities...)
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
		return nil
	}
}
