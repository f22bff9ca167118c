package assembly

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/policy"
)

// PodSeccomp combines a pod's own seccomp profile (Kubernetes'
// RuntimeDefault or a Localhost profile, as the container's spec carries
// it) with the profile the spec holds already, hutch's: the result lets a
// call run only if both profiles let it run. A nil profile (Unconfined)
// leaves hutch's alone. A pod profile that gVisor cannot enforce as written
// is refused with an error naming what it uses.
func PodSeccomp(pod *specs.LinuxSeccomp) policy.SpecOpt {
	return func(s *specs.Spec) error {
		if pod == nil {
			return nil
		}
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		c, err := CombineSeccomp(s.Linux.Seccomp, pod)
		if err != nil {
			return err
		}
		s.Linux.Seccomp = c
		return nil
	}
}

// CombineSeccomp returns one profile that acts on every call as the more
// restrictive of outer (hutch's) and inner (the pod's) would: kill before
// SIGSYS (trap) before an errno before allow. When both deny with an
// errno, outer's errno is returned. A nil profile allows everything.
//
// Profiles are read as runsc enforces them (runsc/specutils/seccomp): a
// profile's rules are tried in order and the first whose names and
// arguments match decides, else the default action; a rule's argument
// conditions must all hold, except that a rule with two conditions on
// the same argument matches when any one of its conditions holds.
//
// Refused, with errdefs.ErrInvalidArgument (a pod's spec that the
// sandbox cannot honour is bad input to it, and so said to containerd):
// actions gVisor does not have (SCMP_ACT_NOTIFY and a listener,
// SCMP_ACT_KILL_PROCESS, SCMP_ACT_TRACE: gVisor runs a traced call when
// no tracer is attached, where Linux fails it), filter flags other than
// TSYNC, LOG and SPEC_ALLOW, two conditions on one argument (one from
// each profile) that no single condition expresses, and malformed rules
// (an argument index past 5, an unknown operator, an errno past 16 bits).
func CombineSeccomp(outer, inner *specs.LinuxSeccomp) (*specs.LinuxSeccomp, error) {
	if inner == nil {
		return outer, nil
	}
	in, err := readProfile(inner)
	if err != nil {
		return nil, fmt.Errorf("the pod's seccomp profile: %w", err)
	}
	if outer == nil {
		outer = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}
	}
	out, err := readProfile(outer)
	if err != nil {
		return nil, fmt.Errorf("hutch's seccomp profile: %w", err)
	}
	def := stricter(out.def, in.def)
	c := &specs.LinuxSeccomp{
		DefaultAction: def.act,
		Architectures: unionArchs(outer.Architectures, inner.Architectures),
	}
	if def.act == specs.ActErrno {
		e := def.errno
		c.DefaultErrnoRet = &e
	}
	names := map[string]bool{}
	for n := range out.rules {
		names[n] = true
	}
	for n := range in.rules {
		names[n] = true
	}
	// Each syscall's rules are independent of every other's: group
	// syscalls with the same list into one entry per rule.
	lists := map[string][]rule{}
	var keys []string
	groups := map[string][]string{}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		list, err := product(n, out.rules[n], out.def, in.rules[n], in.def, def)
		if err != nil {
			return nil, err
		}
		if len(list) == 0 {
			continue
		}
		k := listKey(list)
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
			lists[k] = list
		}
		groups[k] = append(groups[k], n)
	}
	for _, k := range keys {
		for _, r := range lists[k] {
			sc := specs.LinuxSyscall{Names: groups[k], Action: r.act.act, Args: r.conds}
			if r.act.act == specs.ActErrno {
				e := r.act.errno
				sc.ErrnoRet = &e
			}
			c.Syscalls = append(c.Syscalls, sc)
		}
	}
	return c, nil
}

// action is what a profile does with a call; errno only for ActErrno.
type action struct {
	act   specs.LinuxSeccompAction
	errno uint
}

// rank orders actions by restrictiveness, as the kernel does when
// several filters apply: lower is stricter.
func (a action) rank() int {
	switch a.act {
	case specs.ActKill:
		return 0
	case specs.ActTrap:
		return 1
	case specs.ActErrno:
		return 2
	default:
		return 3
	}
}

// stricter returns the more restrictive of a and b, a on a tie.
func stricter(a, b action) action {
	if b.rank() < a.rank() {
		return b
	}
	return a
}

// rule is one decision: when all conds hold (each on its own argument),
// act.
type rule struct {
	conds []specs.LinuxSeccompArg
	act   action
}

// profile is a seccomp profile as runsc evaluates it: per syscall, rules
// tried in order, then def.
type profile struct {
	rules map[string][]rule
	def   action
}

var allowedFlags = map[specs.LinuxSeccompFlag]bool{
	specs.LinuxSeccompFlag("SECCOMP_FILTER_FLAG_TSYNC"):      true,
	specs.LinuxSeccompFlag("SECCOMP_FILTER_FLAG_LOG"):        true,
	specs.LinuxSeccompFlag("SECCOMP_FILTER_FLAG_SPEC_ALLOW"): true,
}

func readProfile(s *specs.LinuxSeccomp) (profile, error) {
	if s.ListenerPath != "" {
		return profile{}, fmt.Errorf("listenerPath %q: gVisor has no seccomp user notification: %w", s.ListenerPath, errdefs.ErrInvalidArgument)
	}
	for _, f := range s.Flags {
		if !allowedFlags[f] {
			return profile{}, fmt.Errorf("flag %s is not supported under gVisor: %w", f, errdefs.ErrInvalidArgument)
		}
	}
	def, err := readAction(s.DefaultAction, s.DefaultErrnoRet)
	if err != nil {
		return profile{}, fmt.Errorf("default action: %w", err)
	}
	p := profile{rules: map[string][]rule{}, def: def}
	for i, sc := range s.Syscalls {
		a, err := readAction(sc.Action, sc.ErrnoRet)
		if err != nil {
			return profile{}, fmt.Errorf("rule %d (%s): %w", i, strings.Join(sc.Names, ","), err)
		}
		alts, err := readArgs(sc.Args)
		if err != nil {
			return profile{}, fmt.Errorf("rule %d (%s): %w", i, strings.Join(sc.Names, ","), err)
		}
		for _, n := range sc.Names {
			for _, conds := range alts {
				p.rules[n] = append(p.rules[n], rule{conds: conds, act: a})
			}
		}
	}
	return p, nil
}

// readAction reads an action as gVisor runs it, with its errno (EPERM
// unless given: a rule's own errnoRet, the default action's
// defaultErrnoRet, as runc reads them). SCMP_ACT_LOG lets the call run,
// as it does on Linux (the log line is not written).
func readAction(a specs.LinuxSeccompAction, errno *uint) (action, error) {
	switch a {
	case specs.ActKill, specs.ActKillThread:
		return action{act: specs.ActKill}, nil
	case specs.ActTrap:
		return action{act: specs.ActTrap}, nil
	case specs.ActAllow, specs.ActLog:
		return action{act: specs.ActAllow}, nil
	case specs.ActErrno:
		e := uint(unix.EPERM)
		if errno != nil {
			e = *errno
		}
		if e > 0xffff {
			return action{}, fmt.Errorf("errno %d does not fit seccomp's 16 bits: %w", e, errdefs.ErrInvalidArgument)
		}
		return action{act: specs.ActErrno, errno: e}, nil
	case specs.ActKillProcess:
		return action{}, fmt.Errorf("%s: gVisor's seccomp kills only the calling thread: %w", a, errdefs.ErrInvalidArgument)
	case specs.ActTrace:
		return action{}, fmt.Errorf("%s: gVisor runs a traced call when no tracer is attached, where Linux fails it: %w", a, errdefs.ErrInvalidArgument)
	case specs.ActNotify:
		return action{}, fmt.Errorf("%s: gVisor has no seccomp user notification: %w", a, errdefs.ErrInvalidArgument)
	default:
		return action{}, fmt.Errorf("unknown action %q: %w", a, errdefs.ErrInvalidArgument)
	}
}

// readArgs returns a rule's conditions as alternatives, each a
// conjunction with at most one condition per argument: the conditions
// themselves, or, when two name the same argument, each one alone.
func readArgs(args []specs.LinuxSeccompArg) ([][]specs.LinuxSeccompArg, error) {
	seen := map[uint]bool{}
	repeated := false
	for _, a := range args {
		if a.Index > 5 {
			return nil, fmt.Errorf("argument index %d (a call has 6): %w", a.Index, errdefs.ErrInvalidArgument)
		}
		switch a.Op {
		case specs.OpEqualTo, specs.OpNotEqual, specs.OpGreaterThan, specs.OpGreaterEqual,
			specs.OpLessThan, specs.OpLessEqual, specs.OpMaskedEqual:
		default:
			return nil, fmt.Errorf("unknown operator %q: %w", a.Op, errdefs.ErrInvalidArgument)
		}
		repeated = repeated || seen[a.Index]
		seen[a.Index] = true
	}
	if !repeated {
		conds := slices.Clone(args)
		slices.SortFunc(conds, func(a, b specs.LinuxSeccompArg) int { return int(a.Index) - int(b.Index) })
		return [][]specs.LinuxSeccompArg{conds}, nil
	}
	var alts [][]specs.LinuxSeccompArg
	for _, a := range args {
		alts = append(alts, []specs.LinuxSeccompArg{a})
	}
	return alts, nil
}

// product is syscall n's combined rule list: for each of outer's rules in
// order (its default last), each of inner's in order (its default last),
// a rule matching when both do, with the stricter action. The first match
// in that order is the pair of first matches of the two profiles. Rules
// that can never match are left out, and so are the last rules when they
// do what def does.
func product(n string, outer []rule, outerDef action, inner []rule, innerDef action, def action) ([]rule, error) {
	outer = append(slices.Clip(outer), rule{act: outerDef})
	inner = append(slices.Clip(inner), rule{act: innerDef})
	var list []rule
	for _, o := range outer {
		for _, i := range inner {
			conds, ok, err := conjoin(o.conds, i.conds)
			if err != nil {
				return nil, fmt.Errorf("seccomp rules for %s of hutch's profile and the pod's: %w", n, err)
			}
			if ok {
				list = append(list, rule{conds: conds, act: stricter(o.act, i.act)})
			}
			if ok && slices.Equal(conds, o.conds) {
				// inner's rule matches whenever o's does: later
				// ones never decide.
				break
			}
		}
	}
	for len(list) > 0 && list[len(list)-1].act == def {
		list = list[:len(list)-1]
	}
	return list, nil
}

// conjoin returns the conditions that hold when both a and b hold, one
// per argument; ok is false when they never hold together.
func conjoin(a, b []specs.LinuxSeccompArg) (_ []specs.LinuxSeccompArg, ok bool, _ error) {
	byIndex := map[uint]specs.LinuxSeccompArg{}
	for _, c := range a {
		byIndex[c.Index] = c
	}
	for _, c := range b {
		have, dup := byIndex[c.Index]
		if !dup {
			byIndex[c.Index] = c
			continue
		}
		m, ok, err := both(have, c)
		if err != nil || !ok {
			return nil, ok, err
		}
		byIndex[c.Index] = m
	}
	var out []specs.LinuxSeccompArg
	for _, i := range slices.Sorted(maps.Keys(byIndex)) {
		out = append(out, byIndex[i])
	}
	return out, true, nil
}

// both is one condition on an argument that holds exactly when a and b
// hold; ok is false when they never hold together.
func both(a, b specs.LinuxSeccompArg) (_ specs.LinuxSeccompArg, ok bool, _ error) {
	if a == b {
		return a, true, nil
	}
	if v, isEq := equalTo(a); isEq {
		return a, holds(b, v), nil
	}
	if v, isEq := equalTo(b); isEq {
		return b, holds(a, v), nil
	}
	am, aMasked := masked(a)
	bm, bMasked := masked(b)
	switch {
	case aMasked && bMasked:
		if am.ValueTwo&^am.Value != 0 || bm.ValueTwo&^bm.Value != 0 {
			return a, false, nil // a masked value with bits outside its mask never matches
		}
		common := am.Value & bm.Value
		if am.ValueTwo&common != bm.ValueTwo&common {
			return a, false, nil
		}
		m := specs.LinuxSeccompArg{Index: a.Index, Op: specs.OpMaskedEqual,
			Value: am.Value | bm.Value, ValueTwo: am.ValueTwo | bm.ValueTwo}
		if m.Value == math.MaxUint64 {
			return specs.LinuxSeccompArg{Index: a.Index, Op: specs.OpEqualTo, Value: m.ValueTwo}, true, nil
		}
		return m, true, nil
	case a.Op == specs.OpNotEqual && b.Op != specs.OpNotEqual && !holds(b, a.Value):
		return b, true, nil
	case b.Op == specs.OpNotEqual && a.Op != specs.OpNotEqual && !holds(a, b.Value):
		return a, true, nil
	}
	alo, ahi, aRange := bounds(a)
	blo, bhi, bRange := bounds(b)
	if aRange && bRange {
		lo, hi := max(alo, blo), min(ahi, bhi)
		switch {
		case lo > hi:
			return a, false, nil
		case lo == hi:
			return specs.LinuxSeccompArg{Index: a.Index, Op: specs.OpEqualTo, Value: lo}, true, nil
		case lo == 0:
			return specs.LinuxSeccompArg{Index: a.Index, Op: specs.OpLessEqual, Value: hi}, true, nil
		case hi == math.MaxUint64:
			return specs.LinuxSeccompArg{Index: a.Index, Op: specs.OpGreaterEqual, Value: lo}, true, nil
		}
	}
	return a, false, fmt.Errorf("argument %d must meet both %s and %s, which no one seccomp condition expresses under gVisor: %w",
		a.Index, describe(a), describe(b), errdefs.ErrInvalidArgument)
}

// equalTo reports whether c holds for one value only, and which.
func equalTo(c specs.LinuxSeccompArg) (uint64, bool) {
	switch {
	case c.Op == specs.OpEqualTo:
		return c.Value, true
	case c.Op == specs.OpMaskedEqual && c.Value == math.MaxUint64:
		return c.ValueTwo, true
	}
	return 0, false
}

// masked is c as a masked comparison (Value the mask, ValueTwo the
// value), if it is one.
func masked(c specs.LinuxSeccompArg) (specs.LinuxSeccompArg, bool) {
	switch c.Op {
	case specs.OpMaskedEqual:
		return c, true
	case specs.OpEqualTo:
		return specs.LinuxSeccompArg{Index: c.Index, Op: specs.OpMaskedEqual, Value: math.MaxUint64, ValueTwo: c.Value}, true
	}
	return c, false
}

// bounds is c as an inclusive range, if it is one.
func bounds(c specs.LinuxSeccompArg) (lo, hi uint64, ok bool) {
	switch c.Op {
	case specs.OpGreaterEqual:
		return c.Value, math.MaxUint64, true
	case specs.OpGreaterThan:
		if c.Value == math.MaxUint64 {
			return 1, 0, true // empty
		}
		return c.Value + 1, math.MaxUint64, true
	case specs.OpLessEqual:
		return 0, c.Value, true
	case specs.OpLessThan:
		if c.Value == 0 {
			return 1, 0, true // empty
		}
		return 0, c.Value - 1, true
	case specs.OpEqualTo:
		return c.Value, c.Value, true
	}
	return 0, 0, false
}

// holds reports whether condition c holds for argument value v.
func holds(c specs.LinuxSeccompArg, v uint64) bool {
	switch c.Op {
	case specs.OpEqualTo:
		return v == c.Value
	case specs.OpNotEqual:
		return v != c.Value
	case specs.OpGreaterThan:
		return v > c.Value
	case specs.OpGreaterEqual:
		return v >= c.Value
	case specs.OpLessThan:
		return v < c.Value
	case specs.OpLessEqual:
		return v <= c.Value
	case specs.OpMaskedEqual:
		return v&c.Value == c.ValueTwo
	}
	return false
}

func describe(c specs.LinuxSeccompArg) string {
	if c.Op == specs.OpMaskedEqual {
		return fmt.Sprintf("%s(%#x, %#x)", c.Op, c.Value, c.ValueTwo)
	}
	return fmt.Sprintf("%s %#x", c.Op, c.Value)
}

func listKey(l []rule) string {
	var b strings.Builder
	for _, r := range l {
		fmt.Fprintf(&b, "%s/%d:", r.act.act, r.act.errno)
		for _, c := range r.conds {
			fmt.Fprintf(&b, "%d%s%d,%d;", c.Index, c.Op, c.Value, c.ValueTwo)
		}
		b.WriteByte('|')
	}
	return b.String()
}

func unionArchs(a, b []specs.Arch) []specs.Arch {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}
