package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/policy"
)

// LimitsReport says which limits hold for the sandboxes this engine
// creates. Root's hold all. An unprivileged user's hold --disk (the
// overlay's size) and --pids (RLIMIT_NPROC inside gVisor) everywhere;
// --cpus and --memory only in a cgroup v2 subtree the host delegates to
// the user (assembly.HostDelegation).
type LimitsReport struct {
	// Enforced and Unenforced name the limits: cpus, memory, pids, disk.
	Enforced, Unenforced []string
	// Delegated is the user's delegated cgroup (rootless), if any.
	Delegated assembly.Delegation
	// Why, when some limit is unenforced, says why and how to fix it.
	Why string
}

// Limits reports which limits hold for sandboxes of this engine.
func (e *Engine) Limits() LimitsReport {
	if !e.rootless {
		return LimitsReport{Enforced: []string{"cpus", "memory", "pids", "disk"}}
	}
	r := LimitsReport{Enforced: []string{"pids", "disk"}}
	d, err := assembly.HostDelegation()
	if err != nil {
		r.Unenforced = []string{"cpus", "memory"}
		r.Why = "an unprivileged user has no cgroup here (" + err.Error() + ")"
		return r
	}
	r.Delegated = d
	for _, l := range []struct{ limit, ctrl string }{{"cpus", "cpu"}, {"memory", "memory"}} {
		if d.Has(l.ctrl) {
			r.Enforced = append(r.Enforced, l.limit)
		} else {
			r.Unenforced = append(r.Unenforced, l.limit)
		}
	}
	if len(r.Unenforced) > 0 {
		r.Why = fmt.Sprintf("the delegated cgroup %s lacks the %s controller (systemd: Delegate=cpu memory pids for user@.service)", d.Path, strings.Join(r.Unenforced, "/"))
	}
	return r
}

// unenforceable names the limits a new sandbox of this engine cannot
// have enforced, and why, for policy.Validate to refuse any of them asked
// for explicitly: root's, none; an unprivileged user's, those Limits
// reports unenforced. The others that cannot hold are recorded as
// unenforced (setRootlessLimits).
func (e *Engine) unenforceable() ([]string, string) {
	if !e.rootless {
		return nil, ""
	}
	rep := e.Limits()
	return rep.Unenforced, "for an unprivileged user on this host: " + rep.Why + "; see `hutch doctor`"
}

// unenforceableLive names the limits an update cannot change on running
// sandbox sb, and why: a rootless sandbox's cgroup, delegated or none,
// keeps the limits it was created with.
func unenforceableLive(sb *record) ([]string, string) {
	if !sb.Rootless {
		return nil, ""
	}
	return []string{"cpus", "memory"}, "on a running sandbox of an unprivileged user (its limits are set when it is created)"
}

// sandboxCgroup is sandbox sb's cgroup: root's under /hutch, a rootless
// sandbox's in the user's delegated subtree, or none.
func (e *Engine) sandboxCgroup(sb *record) string {
	if sb.Rootless {
		return sb.Cgroup
	}
	return cgroupPath(sb.ID)
}

// createDelegatedCgroup creates a rootless sandbox's cgroup in the user's
// delegated subtree with its record's limits (runsc joins it) and puts its
// removal on undo.
func (e *Engine) createDelegatedCgroup(ctx context.Context, sb *record, undo *assembly.Undo) error {
	if sb.Cgroup == "" {
		return nil
	}
	res := policy.HostResources(policy.Request{CPUs: sb.CPUs, Memory: sb.Memory, Pids: sb.Pids})
	if _, err := assembly.CreateDelegated(assembly.Cgroup2Mount, sb.Cgroup, res); err != nil {
		return err
	}
	undo.Add(func() {
		if err := assembly.RemoveDelegated(assembly.Cgroup2Mount, sb.Cgroup); err != nil {
			log.G(ctx).WithError(err).Warn("remove cgroup")
		}
	})
	return nil
}

// setRootlessLimits records on a new rootless sandbox the limits that do
// not hold and the cgroup it gets in the user's delegated subtree.
func (e *Engine) setRootlessLimits(sb *record) {
	if !e.rootless {
		return
	}
	rep := e.Limits()
	sb.Unenforced = rep.Unenforced
	if rep.Delegated.Path != "" {
		sb.Cgroup = rep.Delegated.SandboxPath(sb.ID)
	}
}

// rootlessProcessLimit bounds a rootless sandbox's processes inside
// gVisor (RLIMIT_NPROC), which needs no cgroup: the part of the limits a
// rootless spec gets (assembly.Resources renders none for it).
func (e *Engine) rootlessProcessLimit(spec *specs.Spec, pr policy.Request) error {
	if !e.rootless {
		return nil
	}
	return policy.ProcessLimit(pr)(spec)
}
