// Package policy turns what a user asks of a sandbox into what the sandbox
// gets: validated limits rendered as OCI spec mutators.
//
// It is pure: request in, spec options out. It runs no sandbox, touches no
// host state and execs nothing.
package policy

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Defaults of a sandbox's limits (DESIGN.md).
const (
	DefaultCPUs   = 2.0
	DefaultMemory = 2 << 30
	DefaultPids   = 1024
	DefaultDisk   = 10 << 30
)

// Bounds the validator enforces.
const (
	MinMemory = 32 << 20
	MinDisk   = 1 << 20
	MaxPids   = 1 << 22
)

// NetNone is the default network mode: loopback only.
const NetNone = "none"

// Request is what a user asks of a new sandbox. Zero values mean the
// defaults.
type Request struct {
	CPUs    float64
	Memory  int64
	Pids    int64
	Disk    int64
	Network string
	// Allow holds the parsed --allow rules.
	Allow []AllowRule
	// DNS are upstream resolvers for the sandbox's DNS resolver; empty
	// means the host's.
	DNS     []string
	Env     []string
	Workdir string
	// Rootless is true when the sandbox is started by an unprivileged
	// user: its spec gets no cgroup limits (Resources).
	Rootless bool
	// Explicit names the limits the user set rather than defaulted
	// ("cpus", "memory", ...).
	Explicit []string
	// Unenforceable names the limits the host cannot enforce for this
	// sandbox, as the caller found (an unprivileged user without a
	// delegated cgroup): asking for one explicitly is refused, with
	// UnenforceableWhy in the message.
	Unenforceable    []string
	UnenforceableWhy string
	// Secrets are the --secret values, loaded (LoadSecrets).
	Secrets []Secret
	// Docker asks for what a Docker daemon inside the sandbox needs
	// (DockerSeccomp, DockerMounts, runsc's --net-raw and every
	// capability of gVisor's kernel): docs/docker.md.
	Docker bool
}

// WithDefaults returns r with zero values replaced by the defaults.
func (r Request) WithDefaults() Request {
	if r.CPUs == 0 {
		r.CPUs = DefaultCPUs
	}
	if r.Memory == 0 {
		r.Memory = DefaultMemory
	}
	if r.Pids == 0 {
		r.Pids = DefaultPids
	}
	if r.Disk == 0 {
		r.Disk = DefaultDisk
	}
	if r.Network == "" {
		r.Network = NetNone
	}
	if r.Workdir == "" {
		r.Workdir = "/"
	}
	return r
}

// check is one named validation rule.
type check struct {
	name string
	fn   func(Request) error
}

// checks is the validator: a flat list of named rules, applied in order to
// a request with defaults filled in.
var checks = []check{
	{"cpus", func(r Request) error {
		if math.IsNaN(r.CPUs) || r.CPUs <= 0 || r.CPUs > float64(runtime.NumCPU()*64) {
			return fmt.Errorf("--cpus %v out of range (0, %d]", r.CPUs, runtime.NumCPU()*64)
		}
		return nil
	}},
	{"memory", func(r Request) error {
		if r.Memory < MinMemory {
			return fmt.Errorf("--memory %s below the minimum %s", FormatSize(r.Memory), FormatSize(MinMemory))
		}
		return nil
	}},
	{"pids", func(r Request) error {
		if r.Pids < 8 || r.Pids > MaxPids {
			return fmt.Errorf("--pids %d out of range [8, %d]", r.Pids, MaxPids)
		}
		return nil
	}},
	{"disk", func(r Request) error {
		if r.Disk < MinDisk {
			return fmt.Errorf("--disk %s below the minimum %s", FormatSize(r.Disk), FormatSize(MinDisk))
		}
		return nil
	}},
	{"network", checkNetwork},
	{"env", func(r Request) error {
		for _, kv := range r.Env {
			if err := CheckEnv(kv); err != nil {
				return err
			}
		}
		return nil
	}},
	{"workdir", func(r Request) error {
		if !strings.HasPrefix(r.Workdir, "/") {
			return fmt.Errorf("--workdir %q: must be an absolute path", r.Workdir)
		}
		return nil
	}},
	{"unenforceable-limits", func(r Request) error {
		for _, x := range r.Explicit {
			if slices.Contains(r.Unenforceable, x) {
				why := r.UnenforceableWhy
				if why == "" {
					why = "on this host"
				}
				return fmt.Errorf("--%s cannot be enforced %s", x, why)
			}
		}
		return nil
	}},
}

// Validate fills in defaults and applies every check. The error names the
// first rule that failed and wraps errdefs.ErrInvalidArgument.
func Validate(r Request) (Request, error) {
	r = r.WithDefaults()
	for _, c := range append(checks[:len(checks):len(checks)], secretChecks...) {
		if err := c.fn(r); err != nil {
			return r, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
		}
	}
	return r, nil
}

// CheckEnv validates one K=V environment entry.
func CheckEnv(kv string) error {
	k, _, ok := strings.Cut(kv, "=")
	if !ok || k == "" || strings.ContainsAny(k, "\x00") || strings.Contains(kv, "\x00") {
		return fmt.Errorf("environment entry %q: want KEY=VALUE", kv)
	}
	return nil
}

// SpecOpt changes a spec; policy renders a request as a list of them.
type SpecOpt func(*specs.Spec) error

// Resources renders r's limits: the host cgroup's (HostResources) in
// spec.linux.resources, from which runsc sizes the sandbox (CPUs and
// /proc/meminfo inside), and the in-sandbox process limit (ProcessLimit).
// Rootless requests get none: the sandbox runs without cgroups.
func Resources(r Request) SpecOpt {
	return func(s *specs.Spec) error {
		if r.Rootless {
			return nil
		}
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		s.Linux.Resources = HostResources(r)
		return ProcessLimit(r)(s)
	}
}

// ParseSize parses a size such as "512m", "2GiB", "1.5g" or "1048576"
// (bytes). Units are binary: k=KiB, m=MiB, g=GiB, t=TiB, optionally followed
// by "b", "ib" (any case).
func ParseSize(s string) (int64, error) {
	in := s
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return 0, fmt.Errorf("%w: size %q: empty", errdefs.ErrInvalidArgument, in)
	}
	s = strings.TrimSuffix(strings.TrimSuffix(s, "b"), "i")
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		}
		if mult != 1 {
			s = s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || s == "" || strings.ContainsAny(s, "xpe+-_") || math.IsNaN(f) || f < 0 {
		return 0, fmt.Errorf("%w: size %q: want a number with an optional unit (k, m, g, t)", errdefs.ErrInvalidArgument, in)
	}
	v := f * float64(mult)
	if v >= math.MaxInt64/2 {
		return 0, fmt.Errorf("%w: size %q: too large", errdefs.ErrInvalidArgument, in)
	}
	return int64(v), nil
}

// FormatSize formats n bytes with a binary unit.
func FormatSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%dB", n)
	}
	return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", f), "0"), ".") + units[i]
}

// MinNetRate and MaxNetRate bound a sandbox's egress rate (--net-rate),
// in bits per second.
const (
	MinNetRate = 64_000
	MaxNetRate = 32_000_000_000
)

// ParseRate parses a network rate such as "10mbit", "1.5gbit", "500kbit"
// or "64000" (bits per second; units decimal, as tc's), within
// MinNetRate and MaxNetRate.
func ParseRate(s string) (int64, error) {
	in := s
	s = strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"bit", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || s == "" || strings.ContainsAny(s, "xpe+-_") || math.IsNaN(f) {
		return 0, fmt.Errorf("%w: rate %q: want a number of bits per second with an optional unit (kbit, mbit, gbit), e.g. 10mbit", errdefs.ErrInvalidArgument, in)
	}
	v := f * mult
	if v < MinNetRate || v > MaxNetRate {
		return 0, fmt.Errorf("%w: rate %q: want between 64kbit and 32gbit", errdefs.ErrInvalidArgument, in)
	}
	return int64(v), nil
}

// FormatRate formats a rate in bits per second as ParseRate reads it.
func FormatRate(r int64) string {
	switch {
	case r >= 1e9 && r%1e7 == 0:
		return strconv.FormatFloat(float64(r)/1e9, 'f', -1, 64) + "gbit"
	case r >= 1e6 && r%1e4 == 0:
		return strconv.FormatFloat(float64(r)/1e6, 'f', -1, 64) + "mbit"
	case r >= 1e3:
		return strconv.FormatFloat(float64(r)/1e3, 'f', -1, 64) + "kbit"
	}
	return strconv.FormatInt(r, 10) + "bit"
}
