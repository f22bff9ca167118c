package policy

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// SeccompRule is one rule of the sandbox's seccomp profile: syscalls an
// agent never needs, denied with EPERM inside gVisor, and why.
type SeccompRule struct {
	// Name identifies the rule (docs/security.md lists them).
	Name string
	// Syscalls are denied when all of Args match (OCI semantics; gVisor
	// ORs several conditions on the same argument).
	Syscalls []string
	Args     []specs.LinuxSeccompArg
	// Why the rule exists.
	Why string
}

func argEq(i uint, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: i, Value: v, Op: specs.OpEqualTo}
}

func argMasked(i uint, mask, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: i, Value: mask, ValueTwo: v, Op: specs.OpMaskedEqual}
}

// SeccompRules is hutch's deny list. Everything else is allowed: gVisor's
// sentry, not this list, is the boundary between the sandbox and the host;
// the list removes attack surface of the sentry and abilities a tenant's
// code has no use for.
var SeccompRules = func() []SeccompRule {
	rules := []SeccompRule{
		{Name: "packet-socket", Syscalls: []string{"socket", "socketpair"}, Args: []specs.LinuxSeccompArg{argEq(0, unix.AF_PACKET)},
			Why: "link-layer sockets see and forge whole frames on the sandbox's interface: sniffing and spoofing past the network policy"},
		{Name: "raw-socket", Syscalls: []string{"socket"}, Args: []specs.LinuxSeccompArg{argEq(0, unix.AF_INET), argMasked(1, 0xf, unix.SOCK_RAW)},
			Why: "raw IP sockets forge source addresses and arbitrary protocols; ping works without them (ICMP datagram sockets). Netlink's SOCK_RAW stays allowed: ip(8) and Go's net.Interfaces use it"},
		{Name: "raw-socket6", Syscalls: []string{"socket"}, Args: []specs.LinuxSeccompArg{argEq(0, unix.AF_INET6), argMasked(1, 0xf, unix.SOCK_RAW)},
			Why: "as raw-socket, for IPv6"},
		{Name: "vsock", Syscalls: []string{"socket", "socketpair"}, Args: []specs.LinuxSeccompArg{argEq(0, unix.AF_VSOCK)},
			Why: "AF_VSOCK talks to the hypervisor and the host's VM services, a channel the network policy does not see"},
		{Name: "keyring", Syscalls: []string{"add_key", "keyctl", "request_key"},
			Why: "the kernel keyring is a credential store agents do not use and a recurring source of kernel bugs"},
		{Name: "bpf", Syscalls: []string{"bpf"},
			Why: "eBPF programs run inside the kernel: the largest attack surface an unprivileged process can reach"},
		{Name: "ptrace-attach", Syscalls: []string{"ptrace"}, Args: []specs.LinuxSeccompArg{argEq(0, unix.PTRACE_ATTACH)},
			Why: "attaching to another process reads its memory (tokens, keys of other tools); a debugger may still trace its own child (PTRACE_TRACEME)"},
		{Name: "ptrace-seize", Syscalls: []string{"ptrace"}, Args: []specs.LinuxSeccompArg{argEq(0, unix.PTRACE_SEIZE)},
			Why: "as ptrace-attach"},
		{Name: "process-vm", Syscalls: []string{"process_vm_readv", "process_vm_writev"},
			Why: "reads and writes another process's memory without ptrace"},
		{Name: "mount", Syscalls: []string{"mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "move_mount", "open_tree", "mount_setattr"},
			Why: "the sandbox's mounts (its rootfs, /run/secrets, the agent) are fixed by hutch; remounting could hide or replace them"},
		{Name: "kexec", Syscalls: []string{"kexec_load", "kexec_file_load"},
			Why: "replacing the kernel has no place in a sandbox"},
		{Name: "modules", Syscalls: []string{"init_module", "finit_module", "delete_module"},
			Why: "loading kernel code has no place in a sandbox"},
		{Name: "perf", Syscalls: []string{"perf_event_open"},
			Why: "performance counters leak timing of other tenants (side channels) and are a large kernel surface"},
		{Name: "userfaultfd", Syscalls: []string{"userfaultfd"},
			Why: "userfaultfd stalls kernel code at will, the classic tool to win kernel races"},
		{Name: "io-uring", Syscalls: []string{"io_uring_setup", "io_uring_enter", "io_uring_register"},
			Why: "io_uring is a second syscall interface with its own history of kernel bugs; agents' tools fall back to ordinary I/O"},
		{Name: "namespaces", Syscalls: []string{"unshare", "setns"},
			Why: "new namespaces give a process CAP_SYS_ADMIN over them and unlock the mount and network code of the sentry; nothing in a sandbox needs to nest one (Chrome's own sandbox needs it, but Chrome as root runs with --no-sandbox anyway)"},
	}
	for _, ns := range []struct {
		name string
		flag uint64
	}{
		{"user", unix.CLONE_NEWUSER}, {"mount", unix.CLONE_NEWNS}, {"net", unix.CLONE_NEWNET},
		{"pid", unix.CLONE_NEWPID}, {"ipc", unix.CLONE_NEWIPC}, {"uts", unix.CLONE_NEWUTS},
		{"cgroup", unix.CLONE_NEWCGROUP},
	} {
		rules = append(rules, SeccompRule{
			Name: "clone-new" + ns.name, Syscalls: []string{"clone"},
			Args: []specs.LinuxSeccompArg{argMasked(0, ns.flag, ns.flag)},
			Why:  "as namespaces, through clone's flags (clone3 passes its flags in memory, which seccomp cannot read: see docs/security.md)",
		})
	}
	return rules
}()

// Seccomp sets the sandbox's seccomp profile: SeccompRules denied with
// EPERM, everything else allowed. runsc applies it inside gVisor to the
// init and to every exec'd process (with --oci-seccomp).
func Seccomp() SpecOpt {
	return func(s *specs.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		sc := &specs.LinuxSeccomp{
			DefaultAction: specs.ActAllow,
			Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchAARCH64},
		}
		for _, r := range SeccompRules {
			errno := uint(unix.EPERM)
			sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{
				Names: r.Syscalls, Action: specs.ActErrno, ErrnoRet: &errno, Args: r.Args,
			})
		}
		s.Linux.Seccomp = sc
		return nil
	}
}
