package shim

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/policy"
)

// podPolicy is a pod's validated sbx policy.
type podPolicy struct {
	// Network is none, open, allow, or "" for the pod's own network
	// namespace (CNI) when it has one.
	Network string
	Allow   []policy.AllowRule
	// AllowRaw keeps the rules as written, for the resolver.
	AllowRaw []string
	DNS      []string
	Disk     int64
	CPUs     float64
	Memory   int64
	Pids     int64
}

// request is the policy request assembly renders the pod's sandbox from.
func (p podPolicy) request() policy.Request {
	return policy.Request{CPUs: p.CPUs, Memory: p.Memory, Pids: p.Pids, Disk: p.Disk}
}

// netRank orders network modes from the tightest: none < allow < open.
func netRank(mode string) int {
	switch mode {
	case policy.NetNone:
		return 0
	case policy.NetAllow:
		return 1
	}
	return 2
}

// operatorPolicy is the operator's config as a pod policy: the defaults
// of a pod and the ceiling of its annotations. hasNetns says the pod has
// a network namespace of its own (CNI), which an unset network keeps.
func operatorPolicy(c Config, hasNetns bool) (podPolicy, error) {
	bad := func(err error) (podPolicy, error) {
		return podPolicy{}, fmt.Errorf("runtime config: %w", err)
	}
	allow, err := policy.ParseAllowList(c.Allow)
	if err != nil {
		return bad(err)
	}
	req := policy.Request{Network: c.Network, Allow: allow, DNS: c.DNS, CPUs: c.CPUs, Pids: c.Pids}
	if c.Disk != "" {
		if req.Disk, err = policy.ParseSize(c.Disk); err != nil {
			return bad(fmt.Errorf("disk: %w", err))
		}
	}
	if c.Memory != "" {
		if req.Memory, err = policy.ParseSize(c.Memory); err != nil {
			return bad(fmt.Errorf("memory: %w", err))
		}
	}
	r, err := policy.Validate(req)
	if err != nil {
		return bad(err)
	}
	p := podPolicy{Network: r.Network, Allow: allow, AllowRaw: c.Allow, DNS: c.DNS,
		Disk: r.Disk, CPUs: r.CPUs, Memory: r.Memory, Pids: r.Pids}
	if c.Network == "" && hasNetns {
		p.Network = ""
	}
	return p, nil
}

// resolvePolicy applies the pod's annotations to the operator's config
// and validates the result with policy.Validate. The config is a
// ceiling: an annotation may only tighten it (network none < allow <
// open, and only none in place of the pod's own network namespace; allow
// rules within the operator's; DNS servers among the operator's; disk,
// CPUs, memory and pids no higher). A looser annotation is refused with
// errdefs.ErrPermissionDenied, naming it and the ceiling. hasNetns says
// the pod spec names a network namespace of its own (CNI).
func resolvePolicy(c Config, s *specs.Spec, hasNetns bool) (podPolicy, error) {
	ceil, err := operatorPolicy(c, hasNetns)
	if err != nil {
		return podPolicy{}, err
	}
	p := ceil
	a := s.Annotations
	refuse := func(k, v, why string, args ...any) (podPolicy, error) {
		return podPolicy{}, fmt.Errorf("sbx policy: annotation %s=%q %s: %w", k, v, fmt.Sprintf(why, args...), errdefs.ErrPermissionDenied)
	}
	invalid := func(k string, err error) (podPolicy, error) {
		return podPolicy{}, fmt.Errorf("sbx policy (annotation %s): %w", k, err)
	}

	if v, ok := a[AnnotationNetwork]; ok {
		switch {
		case !slices.Contains(policy.NetworkModes, v):
			return invalid(AnnotationNetwork, fmt.Errorf("%w: --net %q: want one of %s", errdefs.ErrInvalidArgument, v, strings.Join(policy.NetworkModes, ", ")))
		case ceil.Network == "" && v != policy.NetNone:
			return refuse(AnnotationNetwork, v, "exceeds the operator's ceiling: pods keep their own network namespace (Kubernetes networking and its NetworkPolicy); only %q tightens it", policy.NetNone)
		case ceil.Network != "" && netRank(v) > netRank(ceil.Network):
			return refuse(AnnotationNetwork, v, "exceeds the operator's ceiling network %q (none < allow < open)", ceil.Network)
		}
		p.Network = v
		if v == policy.NetNone {
			p.Allow, p.AllowRaw = nil, nil
		}
	}
	if v, ok := a[AnnotationAllow]; ok {
		raw := splitList(v)
		allow, err := policy.ParseAllowList(raw)
		if err != nil {
			return invalid(AnnotationAllow, err)
		}
		// Rules under a pod network of none are the validator's to
		// refuse: they mean nothing there.
		if p.Network == policy.NetAllow || p.Network == policy.NetOpen {
			for _, r := range allow {
				if !withinCeiling(r, ceil) {
					return refuse(AnnotationAllow, v, "exceeds the operator's ceiling: rule %s is not within the operator's network %q allow list [%s]", r, ceil.Network, strings.Join(ceil.AllowRaw, ", "))
				}
			}
		}
		p.Allow, p.AllowRaw = allow, raw
	}
	if v, ok := a[AnnotationDNS]; ok {
		dns := splitList(v)
		for _, d := range dns {
			if !slices.Contains(ceil.DNS, d) {
				return refuse(AnnotationDNS, v, "exceeds the operator's ceiling: server %s is not one the operator lists [%s]", d, strings.Join(ceil.DNS, ", "))
			}
		}
		p.DNS = dns
	}
	for _, sz := range []struct {
		key   string
		value *int64
		max   int64
	}{{AnnotationDisk, &p.Disk, ceil.Disk}, {AnnotationMemory, &p.Memory, ceil.Memory}} {
		v, ok := a[sz.key]
		if !ok {
			continue
		}
		n, err := policy.ParseSize(v)
		if err != nil {
			return invalid(sz.key, err)
		}
		if n <= 0 {
			// Zero would mean the default, not zero.
			return invalid(sz.key, fmt.Errorf("%w: size %q: want more than 0", errdefs.ErrInvalidArgument, v))
		}
		if n > sz.max {
			return refuse(sz.key, v, "exceeds the operator's ceiling %s", policy.FormatSize(sz.max))
		}
		*sz.value = n
	}
	if v, ok := a[AnnotationCPUs]; ok {
		n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(n) || n <= 0 {
			return invalid(AnnotationCPUs, fmt.Errorf("%w: --cpus %q: want a number above 0", errdefs.ErrInvalidArgument, v))
		}
		if n > ceil.CPUs {
			return refuse(AnnotationCPUs, v, "exceeds the operator's ceiling of %v CPUs", ceil.CPUs)
		}
		p.CPUs = n
	}
	if v, ok := a[AnnotationPids]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n <= 0 {
			return invalid(AnnotationPids, fmt.Errorf("%w: --pids %q: want a whole number above 0", errdefs.ErrInvalidArgument, v))
		}
		if n > ceil.Pids {
			return refuse(AnnotationPids, v, "exceeds the operator's ceiling of %d processes", ceil.Pids)
		}
		p.Pids = n
	}

	req := policy.Request{Network: p.Network, Allow: p.Allow, DNS: p.DNS, Disk: p.Disk, CPUs: p.CPUs, Memory: p.Memory, Pids: p.Pids}
	if p.Network == "" {
		// The pod's own namespace: sbx sets up no network, so allow
		// rules and DNS servers have nothing to apply to.
		req.Network = policy.NetNone
	}
	if _, err := policy.Validate(req); err != nil {
		return podPolicy{}, fmt.Errorf("sbx policy (annotations dev.sbx.*): %w", err)
	}
	return p, nil
}

// withinCeiling reports whether allow rule r admits nothing the
// operator's policy ceil does not: an operator rule covers it, or, under
// an open operator, it names addresses open mode reaches anyway. A domain
// rule needs an operator rule: names may resolve to addresses open mode
// denies (private ranges, cloud metadata).
func withinCeiling(r policy.AllowRule, ceil podPolicy) bool {
	for _, o := range ceil.Allow {
		if covers(o, r) {
			return true
		}
	}
	if ceil.Network != policy.NetOpen || r.IsDomain() {
		return false
	}
	for _, d := range policy.DeniedRanges {
		if d.Overlaps(r.Prefix) {
			return false
		}
	}
	return true
}

// covers reports whether rule o admits everything rule r admits.
func covers(o, r policy.AllowRule) bool {
	if o.Port != 0 && o.Port != r.Port {
		return false
	}
	if !o.IsDomain() {
		return !r.IsDomain() && o.Prefix.Bits() <= r.Prefix.Bits() && o.Prefix.Contains(r.Prefix.Addr())
	}
	if !r.IsDomain() {
		return false
	}
	if o.Domain == r.Domain {
		return true
	}
	// *.example.com covers a.example.com and *.a.example.com.
	base, ok := strings.CutPrefix(o.Domain, "*.")
	return ok && strings.HasSuffix(strings.TrimPrefix(r.Domain, "*."), "."+base)
}

func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
