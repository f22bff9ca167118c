package policy

import (
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// DockerDataDir is where a Docker sandbox's daemon keeps its images,
// containers and volumes: a tmpfs of gVisor's, the only upper layer
// gVisor's overlay filesystem takes, so that dockerd's overlay2 driver
// works there (on the sandbox's root, itself one of gVisor's overlays,
// it cannot mount one).
const DockerDataDir = "/var/lib/docker"

// dockerLifted names the rules of SeccompRules that a Docker sandbox goes
// without, and why it must. Each is still confined by gVisor's kernel: the
// mounts, namespaces and raw sockets it lets the sandbox make are
// gVisor's, not the host's (docs/security.md).
var dockerLifted = map[string]string{
	"mount":       "runc builds each container's root with mount and pivot_root",
	"namespaces":  "runc puts each container in namespaces of its own",
	"raw-socket":  "iptables talks to gVisor's netfilter through a raw socket",
	"raw-socket6": "as raw-socket, for ip6tables",
}

// dockerENOSYS names the rules that a Docker sandbox keeps but answers with
// ENOSYS rather than EPERM: runc skips a missing kernel keyring (ENOSYS)
// but fails a container on EPERM.
var dockerENOSYS = []string{"keyring"}

// DockerSeccompRules is SeccompRules as a Docker sandbox has them: the
// rules of dockerLifted gone, and every clone-new* rule with them (runc's
// containers are new namespaces), and dockerENOSYS's rules answering
// ENOSYS.
func DockerSeccompRules() []SeccompRule {
	var out []SeccompRule
	for _, r := range SeccompRules {
		if DockerLiftedWhy(r.Name) == "" {
			out = append(out, r)
		}
	}
	return out
}

// DockerSeccomp is Seccomp for a Docker sandbox (DockerSeccompRules).
func DockerSeccomp() SpecOpt {
	return func(s *specs.Spec) error {
		if err := Seccomp()(s); err != nil {
			return err
		}
		// Seccomp renders one syscall rule per SeccompRules entry, in
		// its order.
		var keep []specs.LinuxSyscall
		for i, r := range SeccompRules {
			if DockerLiftedWhy(r.Name) != "" {
				continue
			}
			sc := s.Linux.Seccomp.Syscalls[i]
			if slices.Contains(dockerENOSYS, r.Name) {
				errno := uint(unix.ENOSYS)
				sc.ErrnoRet = &errno
			}
			keep = append(keep, sc)
		}
		s.Linux.Seccomp.Syscalls = keep
		return nil
	}
}

// DockerLiftedWhy says why a Docker sandbox goes without seccomp rule
// name, or "" if it keeps it.
func DockerLiftedWhy(name string) string {
	if w, ok := dockerLifted[name]; ok {
		return w
	}
	if strings.HasPrefix(name, "clone-new") {
		return "runc starts each container's first process in new namespaces"
	}
	return ""
}

// DockerMounts adds a Docker sandbox's mounts: DockerDataDir, a tmpfs
// bounded by the sandbox's disk size, and gVisor's cgroup file systems at
// /sys/fs/cgroup, which dockerd and runc put containers in (nested under
// the sandbox's own limits, which the host enforces).
func DockerMounts(r Request) SpecOpt {
	return func(s *specs.Spec) error {
		disk := r.Disk
		if disk == 0 {
			disk = DefaultDisk
		}
		s.Mounts = append(s.Mounts,
			specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup"},
			specs.Mount{Destination: DockerDataDir, Type: "tmpfs", Source: "tmpfs",
				Options: []string{"mode=0710", "size=" + strconv.FormatInt(disk, 10)}},
		)
		return nil
	}
}
