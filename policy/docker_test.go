package policy

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// A Docker sandbox's profile lifts the rules runc and iptables need and
// keeps every other one; the keyring answers ENOSYS, which runc skips.
func TestDockerSeccomp(t *testing.T) {
	s := &specs.Spec{}
	if err := DockerSeccomp()(s); err != nil {
		t.Fatal(err)
	}
	denied := map[string]uint{}
	for _, sc := range s.Linux.Seccomp.Syscalls {
		for _, n := range sc.Names {
			denied[n] = *sc.ErrnoRet
		}
	}
	for _, n := range []string{"mount", "pivot_root", "unshare", "setns"} {
		if _, ok := denied[n]; ok {
			t.Errorf("%s is still denied", n)
		}
	}
	for _, sc := range s.Linux.Seccomp.Syscalls {
		if slices.Contains(sc.Names, "clone") || slices.Contains(sc.Names, "socket") && len(sc.Args) == 2 && sc.Args[0].Value != unix.AF_PACKET {
			t.Errorf("rule %v %v is still there", sc.Names, sc.Args)
		}
	}
	for n, want := range map[string]uint{"bpf": uint(unix.EPERM), "kexec_load": uint(unix.EPERM), "perf_event_open": uint(unix.EPERM), "keyctl": uint(unix.ENOSYS), "io_uring_setup": uint(unix.EPERM)} {
		if got, ok := denied[n]; !ok || got != want {
			t.Errorf("%s: denied %v with errno %d, want errno %d", n, ok, got, want)
		}
	}
	if len(DockerSeccompRules()) != len(s.Linux.Seccomp.Syscalls) {
		t.Errorf("DockerSeccompRules has %d rules, the profile %d", len(DockerSeccompRules()), len(s.Linux.Seccomp.Syscalls))
	}
}

func TestDockerMounts(t *testing.T) {
	s := &specs.Spec{}
	if err := DockerMounts(Request{Disk: 1 << 30})(s); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == DockerDataDir })
	if i < 0 || s.Mounts[i].Type != "tmpfs" || !slices.Contains(s.Mounts[i].Options, "size=1073741824") {
		t.Fatalf("mounts %+v: want a tmpfs at %s of the disk's size", s.Mounts, DockerDataDir)
	}
	if !slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/sys/fs/cgroup" && m.Type == "cgroup" }) {
		t.Fatalf("mounts %+v: want cgroups at /sys/fs/cgroup", s.Mounts)
	}
}
