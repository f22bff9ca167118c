package assembly

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/policy"
)

// eval is what runsc does with a call under profile s: the first rule
// whose name and arguments match decides (two conditions on the same
// argument: any one of them), else the default action.
func eval(s *specs.LinuxSeccomp, name string, args [6]uint64) action {
	if s == nil {
		return action{act: specs.ActAllow}
	}
	for _, sc := range s.Syscalls {
		if !contains(sc.Names, name) {
			continue
		}
		if argsMatch(sc.Args, args) {
			a, err := readAction(sc.Action, sc.ErrnoRet)
			if err != nil {
				panic(err)
			}
			return a
		}
	}
	a, err := readAction(s.DefaultAction, s.DefaultErrnoRet)
	if err != nil {
		panic(err)
	}
	return a
}

func contains(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

func argsMatch(conds []specs.LinuxSeccompArg, args [6]uint64) bool {
	seen := map[uint]bool{}
	or := false
	for _, c := range conds {
		or = or || seen[c.Index]
		seen[c.Index] = true
	}
	if len(conds) == 0 {
		return true
	}
	for _, c := range conds {
		h := holds(c, args[c.Index])
		if or && h {
			return true
		}
		if !or && !h {
			return false
		}
	}
	return !or
}

func errno(e uint) *uint { return &e }

func eq(i uint, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: i, Op: specs.OpEqualTo, Value: v}
}

func op(i uint, o specs.LinuxSeccompOperator, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: i, Op: o, Value: v}
}

func maskEq(i uint, m, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: i, Op: specs.OpMaskedEqual, Value: m, ValueTwo: v}
}

func hutchProfile(t *testing.T) *specs.LinuxSeccomp {
	t.Helper()
	s := &specs.Spec{}
	if err := policy.Seccomp()(s); err != nil {
		t.Fatal(err)
	}
	return s.Linux.Seccomp
}

// runtimeDefault is the shape of containerd's RuntimeDefault profile:
// deny by default, an allow list, allow-by-argument rules, and clone3
// denied with ENOSYS.
var runtimeDefault = &specs.LinuxSeccomp{
	DefaultAction: specs.ActErrno,
	Architectures: []specs.Arch{specs.ArchX86_64},
	Syscalls: []specs.LinuxSyscall{
		{Names: []string{"read", "write", "socket", "unshare", "ptrace", "mount", "keyctl", "getpid"}, Action: specs.ActAllow},
		{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{eq(0, 0)}},
		{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{eq(0, 0xffffffff)}},
		{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{maskEq(0, 0x7e020000, 0)}},
		{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: errno(uint(unix.ENOSYS))},
	},
}

func TestCombineSeccomp(t *testing.T) {
	hutch := hutchProfile(t)
	eperm := action{act: specs.ActErrno, errno: uint(unix.EPERM)}
	enosys := action{act: specs.ActErrno, errno: uint(unix.ENOSYS)}
	eacces := action{act: specs.ActErrno, errno: uint(unix.EACCES)}
	allow := action{act: specs.ActAllow}
	kill := action{act: specs.ActKill}
	trap := action{act: specs.ActTrap}
	type call struct {
		name string
		args [6]uint64
		want action
	}
	for _, tc := range []struct {
		name  string
		pod   *specs.LinuxSeccomp
		calls []call
	}{
		{
			name: "localhost profile denying sethostname",
			pod: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
				{Names: []string{"sethostname"}, Action: specs.ActErrno},
			}},
			calls: []call{
				{"sethostname", [6]uint64{}, eperm},
				{"unshare", [6]uint64{unix.CLONE_NEWNET}, eperm},
				{"clone", [6]uint64{unix.CLONE_NEWUSER}, eperm},
				{"clone", [6]uint64{uint64(unix.SIGCHLD)}, allow},
				{"socket", [6]uint64{unix.AF_INET, unix.SOCK_RAW}, eperm},
				{"socket", [6]uint64{unix.AF_INET, unix.SOCK_STREAM}, allow},
				{"getpid", [6]uint64{}, allow},
			},
		},
		{
			name: "runtime default",
			pod:  runtimeDefault,
			calls: []call{
				{"read", [6]uint64{}, allow},
				{"getpid", [6]uint64{}, allow},
				{"sethostname", [6]uint64{}, eperm},
				{"unshare", [6]uint64{}, eperm},
				{"mount", [6]uint64{}, eperm},
				{"keyctl", [6]uint64{}, eperm},
				{"ptrace", [6]uint64{unix.PTRACE_TRACEME}, allow},
				{"ptrace", [6]uint64{unix.PTRACE_ATTACH}, eperm},
				{"socket", [6]uint64{unix.AF_INET, unix.SOCK_STREAM}, allow},
				{"socket", [6]uint64{unix.AF_PACKET, unix.SOCK_RAW}, eperm},
				{"personality", [6]uint64{0}, allow},
				{"personality", [6]uint64{0xffffffff}, allow},
				{"personality", [6]uint64{8}, eperm},
				{"clone", [6]uint64{uint64(unix.SIGCHLD) | unix.CLONE_VM}, allow},
				{"clone", [6]uint64{unix.CLONE_NEWNET}, eperm},
				{"clone3", [6]uint64{}, enosys},
				{"bpf", [6]uint64{}, eperm},
			},
		},
		{
			name: "stricter actions of the pod win over hutch's errno",
			pod: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
				{Names: []string{"unshare"}, Action: specs.ActKill},
				{Names: []string{"bpf"}, Action: specs.ActTrap},
				{Names: []string{"ptrace"}, Action: specs.ActErrno, ErrnoRet: errno(uint(unix.EACCES))},
				{Names: []string{"getpid"}, Action: specs.ActLog},
			}},
			calls: []call{
				{"unshare", [6]uint64{}, kill},
				{"bpf", [6]uint64{}, trap},
				{"ptrace", [6]uint64{unix.PTRACE_ATTACH}, eperm}, // both deny with an errno: hutch's
				{"ptrace", [6]uint64{unix.PTRACE_TRACEME}, eacces},
				{"getpid", [6]uint64{}, allow},
			},
		},
		{
			name: "default errno and first match of the pod",
			pod: &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: errno(uint(unix.EACCES)), Syscalls: []specs.LinuxSyscall{
				{Names: []string{"socket"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{eq(0, unix.AF_INET)}},
				{Names: []string{"socket"}, Action: specs.ActKill, Args: []specs.LinuxSeccompArg{eq(1, unix.SOCK_RAW)}},
				{Names: []string{"socket"}, Action: specs.ActAllow},
				{Names: []string{"write"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{op(2, specs.OpGreaterThan, 100)}},
				{Names: []string{"write"}, Action: specs.ActAllow},
			}},
			calls: []call{
				{"socket", [6]uint64{unix.AF_INET, unix.SOCK_STREAM}, allow},
				{"socket", [6]uint64{unix.AF_INET, unix.SOCK_RAW}, eperm}, // pod allows (first match), hutch denies
				{"socket", [6]uint64{unix.AF_PACKET, unix.SOCK_RAW}, kill},
				{"socket", [6]uint64{unix.AF_PACKET, unix.SOCK_DGRAM}, eperm},
				{"socket", [6]uint64{unix.AF_UNIX, unix.SOCK_STREAM}, allow},
				{"write", [6]uint64{1, 0, 101}, eperm}, // a rule's errno is its own, not the default's
				{"write", [6]uint64{1, 0, 100}, allow},
				{"read", [6]uint64{}, eacces},
				{"bpf", [6]uint64{}, eperm},
			},
		},
		{
			name: "two conditions on one argument are alternatives",
			pod: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
				{Names: []string{"socket"}, Action: specs.ActErrno, ErrnoRet: errno(uint(unix.EACCES)),
					Args: []specs.LinuxSeccompArg{eq(0, unix.AF_INET6), eq(0, unix.AF_UNIX)}},
			}},
			calls: []call{
				{"socket", [6]uint64{unix.AF_INET6, unix.SOCK_STREAM}, eacces},
				{"socket", [6]uint64{unix.AF_UNIX, unix.SOCK_STREAM}, eacces},
				{"socket", [6]uint64{unix.AF_INET, unix.SOCK_STREAM}, allow},
				{"socket", [6]uint64{unix.AF_INET6, unix.SOCK_RAW}, eperm},
			},
		},
		{
			name: "pod conditions on hutch's arguments",
			pod: &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
				{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{maskEq(0, unix.CLONE_NEWUSER|unix.CLONE_NEWNS, 0)}},
				{Names: []string{"clone"}, Action: specs.ActKill},
				{Names: []string{"socket"}, Action: specs.ActTrap, Args: []specs.LinuxSeccompArg{op(0, specs.OpGreaterEqual, unix.AF_INET6)}},
				{Names: []string{"ptrace"}, Action: specs.ActTrap, Args: []specs.LinuxSeccompArg{op(0, specs.OpNotEqual, unix.PTRACE_TRACEME)}},
			}},
			calls: []call{
				{"clone", [6]uint64{uint64(unix.SIGCHLD)}, allow},
				{"clone", [6]uint64{unix.CLONE_NEWNET}, eperm},
				{"clone", [6]uint64{unix.CLONE_NEWUSER}, kill},
				{"clone", [6]uint64{unix.CLONE_NEWNS | unix.CLONE_NEWNET}, kill},
				{"socket", [6]uint64{unix.AF_INET, unix.SOCK_RAW}, eperm},
				{"socket", [6]uint64{unix.AF_INET6, unix.SOCK_RAW}, trap},
				{"socket", [6]uint64{unix.AF_PACKET}, trap},
				{"socket", [6]uint64{unix.AF_UNIX}, allow},
				{"ptrace", [6]uint64{unix.PTRACE_ATTACH}, trap},
				{"ptrace", [6]uint64{unix.PTRACE_TRACEME}, allow},
			},
		},
		{
			name: "unconfined",
			pod:  &specs.LinuxSeccomp{DefaultAction: specs.ActAllow},
			calls: []call{
				{"unshare", [6]uint64{}, eperm},
				{"getpid", [6]uint64{}, allow},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := CombineSeccomp(hutch, tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			for _, call := range tc.calls {
				want := stricter(eval(hutch, call.name, call.args), eval(tc.pod, call.name, call.args))
				if want != call.want {
					t.Fatalf("table is wrong for %s%v: the profiles give %v, the table %v", call.name, call.args, want, call.want)
				}
				if got := eval(c, call.name, call.args); got != call.want {
					t.Errorf("%s%x: combined profile gives %v, want %v", call.name, call.args, got, call.want)
				}
			}
		})
	}
}

// TestCombineSeccompExhaustive checks the combined profile against the
// two profiles on every argument value the rules name, and their
// neighbours.
func TestCombineSeccompExhaustive(t *testing.T) {
	hutch := hutchProfile(t)
	pod := runtimeDefault
	c, err := CombineSeccomp(hutch, pod)
	if err != nil {
		t.Fatal(err)
	}
	values := map[uint][]uint64{}
	names := map[string]bool{"getpid": true, "nosuchcall": true}
	for _, s := range []*specs.LinuxSeccomp{hutch, pod} {
		for _, sc := range s.Syscalls {
			for _, n := range sc.Names {
				names[n] = true
			}
			for _, a := range sc.Args {
				values[a.Index] = append(values[a.Index], a.Value, a.Value+1, a.Value-1, a.ValueTwo, a.Value|a.ValueTwo)
			}
		}
	}
	n := 0
	for name := range names {
		for _, v0 := range append(values[0], 0, math.MaxUint64) {
			for _, v1 := range append(values[1], 0) {
				args := [6]uint64{v0, v1}
				want := stricter(eval(hutch, name, args), eval(pod, name, args))
				if got := eval(c, name, args); got != want {
					t.Errorf("%s%x: combined %v, profiles %v", name, args, got, want)
				}
				n++
			}
		}
	}
	t.Logf("%d calls checked", n)
}

func TestCombineSeccompRefuses(t *testing.T) {
	hutch := hutchProfile(t)
	for _, tc := range []struct {
		name string
		pod  *specs.LinuxSeccomp
		kind error
		msg  string
	}{
		{"notify", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"mkdir"}, Action: specs.ActNotify}}},
			errdefs.ErrInvalidArgument, "SCMP_ACT_NOTIFY: gVisor has no seccomp user notification"},
		{"listener", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, ListenerPath: "/run/agent.sock"},
			errdefs.ErrInvalidArgument, "listenerPath"},
		{"trace", &specs.LinuxSeccomp{DefaultAction: specs.ActTrace},
			errdefs.ErrInvalidArgument, "SCMP_ACT_TRACE"},
		{"kill process", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"bpf"}, Action: specs.ActKillProcess}}},
			errdefs.ErrInvalidArgument, "kills only the calling thread"},
		{"flag", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Flags: []specs.LinuxSeccompFlag{"SECCOMP_FILTER_FLAG_NEW_LISTENER"}},
			errdefs.ErrInvalidArgument, "SECCOMP_FILTER_FLAG_NEW_LISTENER"},
		{"index", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"bpf"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{eq(6, 1)}}}},
			errdefs.ErrInvalidArgument, "argument index 6"},
		{"errno", &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: errno(70000)},
			errdefs.ErrInvalidArgument, "errno 70000"},
		// hutch denies socket(AF_INET, SOCK_RAW & 0xf); a pod rule on a
		// range of the same argument meets a masked comparison.
		{"inexpressible", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
			{Names: []string{"socket"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{op(1, specs.OpLessThan, 3)}}}},
			errdefs.ErrInvalidArgument, "argument 1 must meet both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CombineSeccomp(hutch, tc.pod)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.kind, tc.msg)
			}
		})
	}
}

func TestPodSeccompUnconfinedKeepsHutch(t *testing.T) {
	s := &specs.Spec{}
	if err := Apply(s, policy.Seccomp(), PodSeccomp(nil)); err != nil {
		t.Fatal(err)
	}
	if got := eval(s.Linux.Seccomp, "unshare", [6]uint64{}); got.act != specs.ActErrno {
		t.Fatalf("unshare under an unconfined pod: %v, want hutch's EPERM", got)
	}
}
