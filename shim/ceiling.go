package shim

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/policy"
)

// podPolicy is a pod's validated hutch policy.
type podPolicy struct {
	// Network is none, open, allow, or "" for the pod's own network
	// namespace (CNI) when it has one.
	Network string
	Allow   []policy.AllowRule
	// AllowRaw keeps the rules as written, for the resolver.
	AllowRaw []string
	DNS      []string
	// Egress is EgressPublic when the pod's own network is held to
	// public egress on the node.
	Egress string
	Disk   int64
	CPUs   float64
	Memory int64
	Pids   int64
	// Max is the operator's ceiling of CPUs, memory and pids, which a
	// live update (UpdateTask) may not exceed either.
	Max limits
}

// limits are a sandbox's CPUs, memory (bytes) and processes; zero is
// unset.
type limits struct {
	CPUs   float64
	Memory int64
	Pids   int64
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
		Disk: r.Disk, CPUs: r.CPUs, Memory: r.Memory, Pids: r.Pids,
		Max: limits{CPUs: r.CPUs, Memory: r.Memory, Pids: r.Pids}}
	if c.Network == "" && hasNetns {
		p.Network = ""
	}
	switch c.Egress {
	case "", EgressPublic:
		p.Egress = c.Egress
	default:
		return bad(fmt.Errorf("egress %q: want %q or nothing: %w", c.Egress, EgressPublic, errdefs.ErrInvalidArgument))
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
		return podPolicy{}, fmt.Errorf("hutch policy: annotation %s=%q %s: %w", k, v, fmt.Sprintf(why, args...), errdefs.ErrPermissionDenied)
	}
	invalid := func(k string, err error) (podPolicy, error) {
		return podPolicy{}, fmt.Errorf("hutch policy (annotation %s): %w", k, err)
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
	if v, ok := a[AnnotationEgress]; ok {
		if v != EgressPublic {
			return invalid(AnnotationEgress, fmt.Errorf("%q: want %q: %w", v, EgressPublic, errdefs.ErrInvalidArgument))
		}
		p.Egress = v
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
		// The pod's own namespace: hutch sets up no network, so allow
		// rules and DNS servers have nothing to apply to.
		req.Network = policy.NetNone
	}
	if _, err := policy.Validate(req); err != nil {
		return podPolicy{}, fmt.Errorf("hutch policy (annotations dev.hutch.*): %w", err)
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

// cfsPeriod is the kernel's default CFS period (µs): that of a CPU quota
// that comes without a period.
const cfsPeriod = 100000

// limitsOf reads the CPUs, memory and pids limits of resources (an
// update, or a container's spec). Unset or unlimited (0, -1) is zero.
func limitsOf(res *specs.LinuxResources) (limits, error) {
	var l limits
	if res == nil {
		return l, nil
	}
	if m := res.Memory; m != nil && m.Limit != nil && *m.Limit > 0 {
		l.Memory = *m.Limit
	}
	if p := res.Pids; p != nil && p.Limit != nil && *p.Limit > 0 {
		l.Pids = *p.Limit
	}
	if c := res.CPU; c != nil && c.Quota != nil && *c.Quota > 0 {
		period := uint64(cfsPeriod)
		if c.Period != nil && *c.Period > 0 {
			period = *c.Period
		}
		l.CPUs = float64(*c.Quota) / float64(period)
		if math.IsInf(l.CPUs, 0) || math.IsNaN(l.CPUs) {
			return l, fmt.Errorf("cpu quota %d over period %d: %w", *c.Quota, period, errdefs.ErrInvalidArgument)
		}
	}
	return l, nil
}

// checkCeiling refuses limits l above the operator's ceiling max with
// errdefs.ErrPermissionDenied, naming what asked (what), the limit and the
// ceiling, as resolvePolicy refuses an annotation.
func checkCeiling(what string, l, max limits) error {
	refuse := func(field, v, ceiling string) error {
		return fmt.Errorf("hutch policy: %s: %s %s exceeds the operator's ceiling %s: %w", what, field, v, ceiling, errdefs.ErrPermissionDenied)
	}
	switch {
	case max.CPUs > 0 && l.CPUs > max.CPUs:
		return refuse("cpu limit", fmt.Sprintf("%v CPUs", l.CPUs), fmt.Sprintf("%v CPUs", max.CPUs))
	case max.Memory > 0 && l.Memory > max.Memory:
		return refuse("memory limit", policy.FormatSize(l.Memory), policy.FormatSize(max.Memory))
	case max.Pids > 0 && l.Pids > max.Pids:
		return refuse("pids limit", strconv.FormatInt(l.Pids, 10), fmt.Sprintf("%d processes", max.Pids))
	}
	return nil
}

// sandboxLimits are a pod's sandbox limits once one of its containers
// asks for l, where cur are the sandbox's limits now and others the
// limits of the pod's other joined containers. An update of the sandbox
// container (the pod's first) sets the sandbox's limits. A joined
// container's share of one sandbox, as containers share a pod's cgroup
// under kubelet: each limit becomes the sum of the joined containers'
// where every one of them sets it; otherwise the sandbox keeps its own.
func sandboxLimits(cur limits, root bool, l limits, others []limits) limits {
	if root {
		if l.CPUs > 0 {
			cur.CPUs = l.CPUs
		}
		if l.Memory > 0 {
			cur.Memory = l.Memory
		}
		if l.Pids > 0 {
			cur.Pids = l.Pids
		}
		return cur
	}
	sum, all := l, limits{CPUs: 1, Memory: 1, Pids: 1}
	for _, o := range others {
		sum.CPUs, sum.Memory, sum.Pids = sum.CPUs+o.CPUs, sum.Memory+o.Memory, sum.Pids+o.Pids
		all.CPUs, all.Memory, all.Pids = min(all.CPUs, o.CPUs), min(all.Memory, o.Memory), min(all.Pids, o.Pids)
	}
	all.CPUs, all.Memory, all.Pids = min(all.CPUs, l.CPUs), min(all.Memory, l.Memory), min(all.Pids, l.Pids)
	if all.CPUs > 0 {
		cur.CPUs = sum.CPUs
	}
	if all.Memory > 0 {
		cur.Memory = sum.Memory
	}
	if all.Pids > 0 {
		cur.Pids = sum.Pids
	}
	return cur
}

// update applies an update of container c's resources (UpdateTask: CRI's
// UpdateContainerResources) to the pod's sandbox, within the operator's
// ceiling: a limit above it is refused, whole, before anything changes.
// The sandbox's new limits (sandboxLimits) are validated and rendered as
// a sandbox's are at create (policy.HostResources: CPU quota, memory, the
// pids backstop), and those that change are written to the sandbox's
// cgroup. gVisor sized the sandbox at
// boot, so the memory and CPUs its kernel shows inside keep their first
// values; the host cgroup holds the new limits.
func (s *service) update(c *container, res *specs.LinuxResources) error {
	what := "update of container " + c.id
	want, err := limitsOf(res)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pd := s.pod
	if pd == nil {
		return fmt.Errorf("%s: its sandbox is gone: %w", what, errdefs.ErrFailedPrecondition)
	}
	// The limits asked for are validated as a sandbox's would be, even
	// where they do not change the sandbox's (a share of its limits).
	if _, err := policy.Validate(policy.Request{CPUs: want.CPUs, Memory: want.Memory, Pids: want.Pids}); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := checkCeiling(what, want, pd.policy.Max); err != nil {
		return err
	}
	var others []limits
	for _, o := range s.containers {
		if o == c || o.root || o.spec == nil || o.spec.Linux == nil {
			continue
		}
		l, _ := limitsOf(o.spec.Linux.Resources)
		others = append(others, l)
	}
	cur := limits{CPUs: pd.policy.CPUs, Memory: pd.policy.Memory, Pids: pd.policy.Pids}
	next := sandboxLimits(cur, c.root, want, others)
	if err := checkCeiling(what+": the pod's containers together", next, pd.policy.Max); err != nil {
		return err
	}
	pr, err := policy.Validate(policy.Request{CPUs: next.CPUs, Memory: next.Memory, Pids: next.Pids})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if next != cur {
		if pd.oomCgroup == "" {
			return fmt.Errorf("%s: the sandbox's cgroup is unknown: %w", what, errdefs.ErrFailedPrecondition)
		}
		// Only what changes is written: a limit the pod's cgroup holds
		// of its own (kubelet's) stays.
		host := policy.HostResources(pr)
		if next.CPUs == cur.CPUs {
			host.CPU = nil
		}
		if next.Memory == cur.Memory {
			host.Memory = nil
		}
		if next.Pids == cur.Pids {
			host.Pids = nil
		}
		if err := assembly.UpdateCgroup(pd.oomCgroup, host); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		pd.policy.CPUs, pd.policy.Memory, pd.policy.Pids = pr.CPUs, pr.Memory, pr.Pids
	}
	if !c.root && c.spec != nil {
		recordLimits(c.spec, res)
	}
	return nil
}

// recordLimits keeps a joined container's updated limits in its spec, as
// runsc keeps a container's resources, for the sums of later updates.
func recordLimits(s *specs.Spec, res *specs.LinuxResources) {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.Resources == nil {
		s.Linux.Resources = &specs.LinuxResources{}
	}
	have := s.Linux.Resources
	if res.Memory != nil && res.Memory.Limit != nil {
		m := specs.LinuxMemory{}
		if have.Memory != nil {
			m = *have.Memory
		}
		m.Limit = res.Memory.Limit
		have.Memory = &m
	}
	if res.CPU != nil && res.CPU.Quota != nil {
		cpu := specs.LinuxCPU{}
		if have.CPU != nil {
			cpu = *have.CPU
		}
		cpu.Quota = res.CPU.Quota
		if res.CPU.Period != nil {
			cpu.Period = res.CPU.Period
		}
		have.CPU = &cpu
	}
	if res.Pids != nil && res.Pids.Limit != nil {
		have.Pids = &specs.LinuxPids{Limit: res.Pids.Limit}
	}
}
