package serve

import (
	"fmt"
	"net/http"
	"sort"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/serve/tenant"
)

// OperatorTenantsPath is the operator's view of every tenant: its quota,
// what it holds and its sandboxes. hutch's own; the operator's key only.
const OperatorTenantsPath = "/operator/tenants"

// tenantUseJSON is what a tenant holds, in the units of its quota.
type tenantUseJSON struct {
	Sandboxes   int     `json:"sandboxes"`
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memoryBytes"`
	DiskBytes   int64   `json:"diskBytes"`
	Snapshots   int     `json:"snapshots"`
}

// operatorTenantJSON is one tenant of the operator's view.
type operatorTenantJSON struct {
	Name      string        `json:"name"`
	Quota     tenant.Quota  `json:"quota"`
	Use       tenantUseJSON `json:"use"`
	Sandboxes []detailJSON  `json:"sandboxes"`
}

// serveOperatorTenants is GET /operator/tenants: every tenant, with its
// quota (zero: unbounded), what it holds as admit counts it (running
// sandboxes all of their limits, paused ones their disk; volumes',
// snapshots' and checkpoints' disk, snapshots and checkpoints), and its
// running and paused sandboxes. A server without tenants has one,
// DefaultTenant.
func (s *Server) serveOperatorTenants(w http.ResponseWriter, r *http.Request) {
	p, err := s.authenticate(r)
	if err == nil && !p.Operator {
		err = fmt.Errorf("GET %s names every tenant: it needs the operator's key (hutch serve --operator-key-file), not a tenant's: %w", OperatorTenantsPath, errdefs.ErrPermissionDenied)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	ts := []tenant.Tenant{{Name: DefaultTenant}}
	if s.cfg.Tenants != nil {
		if ts, err = s.cfg.Tenants.List(); err != nil {
			writeErr(w, err)
			return
		}
	}
	out := make([]operatorTenantJSON, 0, len(ts))
	for _, t := range ts {
		s.createMu.Lock()
		u, sbs, err := s.inUse(r.Context(), t.Name, true, true)
		s.createMu.Unlock()
		if err != nil {
			writeErr(w, err)
			return
		}
		ot := operatorTenantJSON{Name: t.Name, Quota: t.Quota, Sandboxes: []detailJSON{},
			Use: tenantUseJSON{Sandboxes: u.Sandboxes, CPUs: u.CPUs, MemoryBytes: u.Memory, DiskBytes: u.Disk, Snapshots: u.Snapshots}}
		for _, sb := range sbs {
			if !listed(sb) {
				continue
			}
			// E2B's SandboxDetail: no token of the sandbox's.
			ot.Sandboxes = append(ot.Sandboxes, s.detailJSON(sb))
		}
		sort.Slice(ot.Sandboxes, func(i, j int) bool { return ot.Sandboxes[i].StartedAt.Before(ot.Sandboxes[j].StartedAt) })
		out = append(out, ot)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}
