package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"1048576", 1 << 20, false},
		{"512m", 512 << 20, false},
		{"512M", 512 << 20, false},
		{"2GiB", 2 << 30, false},
		{"2gb", 2 << 30, false},
		{"1.5g", 3 << 29, false},
		{"64k", 64 << 10, false},
		{"1t", 1 << 40, false},
		{" 10m ", 10 << 20, false},
		{"", 0, true},
		{"m", 0, true},
		{"abc", 0, true},
		{"-1m", 0, true},
		{"1x", 0, true},
		{"1e3", 0, true},
		{"0x10", 0, true},
		{"NaN", 0, true},
		{"inf", 0, true},
		{"99999999999t", 0, true},
	} {
		got, err := ParseSize(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("ParseSize(%q) error = %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.in) {
				t.Errorf("ParseSize(%q) error %q: want invalid argument naming the input", tc.in, err)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("ParseSize(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1", "512m", "2GiB", "1.5g", "", "-1", "1e9", "NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d: negative", s, n)
		}
		// A formatted size parses back to within rounding.
		back, err := ParseSize(strings.TrimSuffix(FormatSize(n), "B"))
		if err != nil {
			t.Fatalf("FormatSize(%d) = %q does not parse: %v", n, FormatSize(n), err)
		}
		if diff := back - n; diff > n/10+1 || diff < -(n/10+1) {
			t.Fatalf("round trip of %d gave %d", n, back)
		}
	})
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  Request
		want string // substring of the error; empty: valid
	}{
		{"defaults", Request{}, ""},
		{"cpus negative", Request{CPUs: -1}, "--cpus"},
		{"memory tiny", Request{Memory: 1 << 20}, "--memory"},
		{"pids tiny", Request{Pids: 1}, "--pids"},
		{"disk tiny", Request{Disk: 10}, "--disk"},
		{"net unknown", Request{Network: "bogus"}, "--net"},
		{"env no equals", Request{Env: []string{"FOO"}}, "FOO"},
		{"workdir relative", Request{Workdir: "tmp"}, "--workdir"},
		{"unenforceable limit asked for", Request{Explicit: []string{"pids", "memory"}, Unenforceable: []string{"cpus", "memory"}, UnenforceableWhy: "for an unprivileged user here"}, "--memory cannot be enforced for an unprivileged user here"},
		{"unenforceable limit defaulted", Request{Unenforceable: []string{"cpus", "memory"}}, ""},
		{"enforceable limit asked for", Request{Explicit: []string{"pids"}, Unenforceable: []string{"cpus", "memory"}}, ""},
		// Whether a limit holds is the caller's to say, rootless or not.
		{"rootless limit the host enforces", Request{Rootless: true, Explicit: []string{"memory", "cpus"}}, ""},
		{"rootless defaults", Request{Rootless: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Validate(tc.req)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if got.CPUs != DefaultCPUs || got.Memory != DefaultMemory || got.Network != NetNone {
					t.Fatalf("defaults not applied: %+v", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Validate error = %v, want invalid argument mentioning %q", err, tc.want)
			}
		})
	}
}

func TestResourcesAndSeccomp(t *testing.T) {
	r, err := Validate(Request{CPUs: 0.5, Memory: 256 << 20, Pids: 100})
	if err != nil {
		t.Fatal(err)
	}
	s := &specs.Spec{}
	for _, opt := range []SpecOpt{Resources(r), Seccomp()} {
		if err := opt(s); err != nil {
			t.Fatal(err)
		}
	}
	res := s.Linux.Resources
	if *res.CPU.Quota != 50000 || *res.CPU.Period != 100000 || *res.Memory.Limit != 256<<20 || *res.Pids.Limit != HostPids(100) {
		t.Fatalf("resources %+v %+v %+v", *res.CPU, *res.Memory, *res.Pids)
	}
	if HostPids(100) <= 100 {
		t.Fatalf("host pids backstop %d is not above the sandbox's limit", HostPids(100))
	}
	if l := s.Process.Rlimits; len(l) != 1 || l[0].Type != "RLIMIT_NPROC" || l[0].Hard != 100 || l[0].Soft != 100 {
		t.Fatalf("rlimits %+v", l)
	}
	sc := s.Linux.Seccomp
	if sc.DefaultAction != specs.ActAllow || len(sc.Syscalls) != len(SeccompRules) {
		t.Fatalf("seccomp %+v", sc)
	}
	denied := map[string]bool{}
	for _, sys := range sc.Syscalls {
		if sys.Action != specs.ActErrno || *sys.ErrnoRet != uint(unix.EPERM) {
			t.Fatalf("rule %v: action %s", sys.Names, sys.Action)
		}
		if len(sys.Args) == 0 {
			for _, n := range sys.Names {
				denied[n] = true
			}
		}
	}
	for _, n := range []string{"bpf", "keyctl", "add_key", "mount", "unshare", "setns", "perf_event_open", "userfaultfd", "kexec_load", "init_module"} {
		if !denied[n] {
			t.Errorf("%s is not denied outright", n)
		}
	}
	for _, n := range []string{"socket", "clone", "ptrace", "clone3"} {
		if denied[n] {
			t.Errorf("%s is denied outright; only some of its uses should be", n)
		}
	}
	// Rootless: no cgroup, no limits.
	s = &specs.Spec{}
	if err := Resources(Request{Rootless: true})(s); err != nil || s.Linux != nil {
		t.Fatalf("rootless resources: %v %+v", err, s.Linux)
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]int64{"10mbit": 10_000_000, "1.5gbit": 1_500_000_000, "500kbit": 500_000, "64000": 64_000, " 8Mbit ": 8_000_000} {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "fast", "10mb", "-1mbit", "1kbit", "100gbit", "1e9", "NaN"} {
		if _, err := ParseRate(in); err == nil || !strings.Contains(err.Error(), "rate") {
			t.Errorf("ParseRate(%q): %v, want an error naming the rate", in, err)
		}
	}
	for _, r := range []int64{64_000, 8_000_000, 1_500_000_000, 123_456} {
		if got, err := ParseRate(FormatRate(r)); err != nil || got != r {
			t.Errorf("FormatRate(%d) = %q, which parses as %d, %v", r, FormatRate(r), got, err)
		}
	}
}
