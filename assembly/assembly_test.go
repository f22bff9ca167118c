package assembly

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

func TestRunsc(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    RunscConfig
		want runsc.Runsc
	}{
		{
			name: "CLI sandbox with a link",
			c:    RunscConfig{Path: "/bin/runsc", Root: "/var/lib/hutch/runsc", Linked: true, OverlayDir: "/var/lib/hutch/sandboxes/x", Disk: 1 << 30},
			want: runsc.Runsc{Path: "/bin/runsc", Root: "/var/lib/hutch/runsc", Network: "sandbox", GoferNetNS: "new",
				Overlay: "root:dir=/var/lib/hutch/sandboxes/x,size=1073741824", OCISeccomp: true},
		},
		{
			name: "rootless sandbox without a network",
			c:    RunscConfig{Path: "runsc", Root: "/r", OverlayDir: "/d", Disk: 1 << 20, IgnoreCgroups: true, Platform: "ptrace"},
			want: runsc.Runsc{Path: "runsc", Root: "/r", Platform: "ptrace", Network: "none", GoferNetNS: "new",
				Overlay: "root:dir=/d,size=1048576", IgnoreCgroups: true, OCISeccomp: true},
		},
		{
			name: "pod",
			c:    RunscConfig{Path: "runsc", Root: "/run/hutch/containerd/k8s.io", DebugLogDir: "/tmp/logs", Disk: 4 << 30},
			want: runsc.Runsc{Path: "runsc", Root: "/run/hutch/containerd/k8s.io", DebugLogDir: "/tmp/logs", Network: "none", GoferNetNS: "new",
				Overlay: "root:self,size=4294967296", OCISeccomp: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Runsc(tc.c); !equalRunsc(*got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

func equalRunsc(a, b runsc.Runsc) bool {
	return a.Path == b.Path && a.Root == b.Root && a.Platform == b.Platform && a.Network == b.Network &&
		a.GoferNetNS == b.GoferNetNS && a.Overlay == b.Overlay && a.IgnoreCgroups == b.IgnoreCgroups &&
		a.DebugLogDir == b.DebugLogDir && a.OCISeccomp == b.OCISeccomp && a.LogPath == b.LogPath && len(a.ExtraFlags) == len(b.ExtraFlags)
}

func i64(v int64) *int64   { return &v }
func u64(v uint64) *uint64 { return &v }
func req() policy.Request  { return policy.Request{CPUs: 1.5, Memory: 512 << 20, Pids: 100} }

func nproc(t *testing.T, s *specs.Spec) uint64 {
	t.Helper()
	for _, l := range s.Process.Rlimits {
		if l.Type == "RLIMIT_NPROC" {
			if l.Soft != l.Hard {
				t.Fatalf("RLIMIT_NPROC soft %d != hard %d", l.Soft, l.Hard)
			}
			return l.Hard
		}
	}
	t.Fatal("no RLIMIT_NPROC")
	return 0
}

func TestSandboxOpts(t *testing.T) {
	s := &specs.Spec{Process: &specs.Process{}}
	if err := Apply(s, SandboxOpts(req())...); err != nil {
		t.Fatal(err)
	}
	r := s.Linux.Resources
	if *r.CPU.Quota != 150000 || *r.CPU.Period != policy.CPUPeriod {
		t.Errorf("cpu quota %d/%d, want 150000/%d", *r.CPU.Quota, *r.CPU.Period, policy.CPUPeriod)
	}
	if *r.Memory.Limit != 512<<20 {
		t.Errorf("memory limit %d", *r.Memory.Limit)
	}
	// The host backstop sits above the sandbox's own process limit.
	if *r.Pids.Limit != policy.HostPids(100) || nproc(t, s) != 100 {
		t.Errorf("pids: host %d (want %d), in-sandbox %d (want 100)", *r.Pids.Limit, policy.HostPids(100), nproc(t, s))
	}
	checkSeccomp(t, s)
	if c := s.Process.Capabilities; c == nil || !slices.Equal(c.Effective, runsc.DefaultCapabilities) {
		t.Errorf("capabilities: %+v", c)
	}
}

// A Docker sandbox's init has every capability of gVisor's kernel,
// Docker's seccomp profile and the daemon's mounts; a run's init as
// another user than root has them in its bounding set only.
func TestSandboxOptsDocker(t *testing.T) {
	r := req()
	r.Docker = true
	s := &specs.Spec{Process: &specs.Process{}}
	if err := Apply(s, SandboxOpts(r)...); err != nil {
		t.Fatal(err)
	}
	if c := s.Process.Capabilities; c == nil || !slices.Equal(c.Effective, runsc.AllCapabilities) || !slices.Equal(c.Bounding, runsc.AllCapabilities) {
		t.Errorf("capabilities: %+v", c)
	}
	if n := len(s.Linux.Seccomp.Syscalls); n != len(policy.DockerSeccompRules()) {
		t.Errorf("seccomp: %d rules, want Docker's %d", n, len(policy.DockerSeccompRules()))
	}
	if !slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == policy.DockerDataDir }) {
		t.Errorf("mounts %+v: no %s", s.Mounts, policy.DockerDataDir)
	}
	user := &specs.Spec{Process: &specs.Process{User: specs.User{UID: 1000}, Capabilities: &specs.LinuxCapabilities{Bounding: runsc.DefaultCapabilities}}}
	if err := Apply(user, SandboxOpts(r)...); err != nil {
		t.Fatal(err)
	}
	if c := user.Process.Capabilities; len(c.Effective) != 0 || !slices.Equal(c.Bounding, runsc.AllCapabilities) {
		t.Errorf("a user's init: capabilities %+v, want all in its bounding set only", c)
	}
}

// checkSeccomp checks that s carries hutch's profile: every rule of
// policy.SeccompRules denied with EPERM, everything else allowed.
func checkSeccomp(t *testing.T, s *specs.Spec) {
	t.Helper()
	sc := s.Linux.Seccomp
	if sc == nil || sc.DefaultAction != specs.ActAllow || len(sc.Syscalls) != len(policy.SeccompRules) {
		t.Fatalf("seccomp profile: %+v", sc)
	}
	for i, r := range policy.SeccompRules {
		if got := sc.Syscalls[i]; !slices.Equal(got.Names, r.Syscalls) || got.Action != specs.ActErrno {
			t.Errorf("rule %s: got %+v", r.Name, got)
		}
	}
}

func TestContainerOpts(t *testing.T) {
	// A joining container keeps its own (Kubernetes') resources: its
	// cgroup is the sandbox's; it gets the process limit and seccomp.
	mem := i64(1 << 30)
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Effective: []string{"CAP_KILL"}}},
		Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: mem}}}}
	if err := Apply(s, ContainerOpts(req())...); err != nil {
		t.Fatal(err)
	}
	if s.Linux.Resources.Pids != nil || *s.Linux.Resources.Memory.Limit != 1<<30 {
		t.Errorf("resources changed: %+v", s.Linux.Resources)
	}
	if nproc(t, s) != 100 {
		t.Errorf("RLIMIT_NPROC %d", nproc(t, s))
	}
	checkSeccomp(t, s)
	if !slices.Equal(s.Process.Capabilities.Effective, []string{"CAP_KILL"}) {
		t.Errorf("the container's own capabilities were replaced: %+v", s.Process.Capabilities)
	}
}

func TestResourcesTighten(t *testing.T) {
	for _, tc := range []struct {
		name      string
		have      *specs.LinuxResources
		quota     int64
		mem, pids int64
		shares    bool
	}{
		{name: "none", quota: 150000, mem: 512 << 20, pids: policy.HostPids(100)},
		{name: "looser kept out", have: &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Quota: i64(400000), Period: u64(100000), Shares: u64(2)},
			Memory: &specs.LinuxMemory{Limit: i64(4 << 30)}, Pids: &specs.LinuxPids{Limit: i64(100000)},
		}, quota: 150000, mem: 512 << 20, pids: policy.HostPids(100), shares: true},
		{name: "tighter kept", have: &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Quota: i64(50000), Period: u64(100000)},
			Memory: &specs.LinuxMemory{Limit: i64(64 << 20)}, Pids: &specs.LinuxPids{Limit: i64(50)},
		}, quota: 50000, mem: 64 << 20, pids: 50},
		{name: "unlimited replaced", have: &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Quota: i64(-1), Period: u64(100000), Shares: u64(2)},
			Memory: &specs.LinuxMemory{Limit: i64(-1)}, Pids: &specs.LinuxPids{Limit: i64(0)},
		}, quota: 150000, mem: 512 << 20, pids: policy.HostPids(100), shares: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{Resources: tc.have}}
			if err := Resources(req())(s); err != nil {
				t.Fatal(err)
			}
			r := s.Linux.Resources
			if *r.CPU.Quota != tc.quota || *r.Memory.Limit != tc.mem || *r.Pids.Limit != tc.pids {
				t.Fatalf("got quota %d memory %d pids %d, want %d %d %d", *r.CPU.Quota, *r.Memory.Limit, *r.Pids.Limit, tc.quota, tc.mem, tc.pids)
			}
			if tc.shares && (r.CPU.Shares == nil || *r.CPU.Shares != 2) {
				t.Fatalf("the spec's CPU shares were lost: %+v", r.CPU)
			}
		})
	}
}

func TestResourcesRootless(t *testing.T) {
	r := req()
	r.Rootless = true
	s := &specs.Spec{Process: &specs.Process{}}
	if err := Apply(s, append(SandboxOpts(r), ContainerOpts(r)...)...); err != nil {
		t.Fatal(err)
	}
	if s.Linux.Resources != nil || len(s.Process.Rlimits) != 0 {
		t.Fatalf("a rootless sandbox got limits: %+v %+v", s.Linux.Resources, s.Process.Rlimits)
	}
	checkSeccomp(t, s)
}
