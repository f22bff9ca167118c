package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

// createSandbox is POST /sandboxes: checked once here (checkCreate),
// then by the placement (its templates, what it mounts), admitted to the
// tenant's quota and made.
func (s *Server) createSandbox(r *http.Request, tenantName string) (int, any, error) {
	var req newSandboxJSON
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	creq, err := s.checkCreate(req, tenantName)
	if err != nil {
		return 0, nil, err
	}
	prep, err := s.place.Prepare(r.Context(), creq)
	if err != nil {
		return 0, nil, err
	}
	// In a burst, creates queue here, before they hold any quota.
	leave, err := s.creates.enter(r.Context())
	if err != nil {
		return 0, nil, err
	}
	defer leave()
	release, err := s.admit(r.Context(), tenantName, prep.Usage())
	if err != nil {
		return 0, nil, err
	}
	defer release()
	start := time.Now()
	ctx, span := s.tracer.Start(r.Context(), "sandbox.create",
		trace.WithAttributes(attrTemplate.String(req.TemplateID), attrTenant.String(tenantName)))
	sb, err := s.place.Create(context.WithoutCancel(ctx), prep)
	if err == nil {
		span.SetAttributes(attrSandbox.String(sb.ID))
	}
	endSpan(span, err)
	if err != nil {
		return 0, nil, err
	}
	s.metrics.created(tenantName, time.Since(start))
	s.log.Info("created", "sandbox", sb.ID, "tenant", tenantName, "template", req.TemplateID, "duration", time.Since(start))
	out, err := s.sandboxJSON(sb)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, out, nil
}

// checkCreate checks E2B's fields of a create for every placement, and
// asks the placement about those it may not do.
func (s *Server) checkCreate(req newSandboxJSON, tenantName string) (placement.CreateRequest, error) {
	if req.TemplateID == "" {
		return placement.CreateRequest{}, fmt.Errorf("templateID: required: %w", errdefs.ErrInvalidArgument)
	}
	for _, f := range []struct {
		used    bool
		feature placement.Feature
		what    string
	}{
		{!isNull(req.MCP), placement.FeatureMCP, "mcp"},
		{!isNull(req.IAM), placement.FeatureIAM, "iam"},
		{!isNull(req.VolumeMounts), placement.FeatureVolumeMounts, "volumeMounts"},
		{req.AutoPause != nil && *req.AutoPause, placement.FeatureAutoPause, "autoPause"},
		{req.AutoPauseMemory != nil && !*req.AutoPauseMemory, placement.FeatureMemorylessPause, "autoPauseMemory false"},
	} {
		if !f.used {
			continue
		}
		if err := s.place.Unsupported(f.feature, f.what); err != nil {
			return placement.CreateRequest{}, err
		}
	}
	timeout, err := checkTimeout(req.Timeout, defaultTimeout)
	if err != nil {
		return placement.CreateRequest{}, err
	}
	if err := checkTemplateID(req.TemplateID); err != nil {
		return placement.CreateRequest{}, err
	}
	mode, allow, err := s.networkPolicy(req.AllowInternetAccess, req.Network, s.defaultNetwork())
	if err != nil {
		return placement.CreateRequest{}, err
	}
	if mode == "allow" || len(allow) > 0 {
		if err := s.place.Unsupported(placement.FeatureAllowOut, "network allowOut lists"); err != nil {
			return placement.CreateRequest{}, err
		}
	}
	if len(req.Metadata) > 64 {
		return placement.CreateRequest{}, fmt.Errorf("metadata: at most 64 entries: %w", errdefs.ErrInvalidArgument)
	}
	for k, v := range req.Metadata {
		if k == "" || len(k) > 256 || len(v) > 4096 {
			return placement.CreateRequest{}, fmt.Errorf("metadata %q: keys of 1-256 and values of up to 4096 characters: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	return placement.CreateRequest{
		Tenant: tenantName, TemplateID: req.TemplateID, Timeout: timeout,
		AutoPause:  req.AutoPause != nil && *req.AutoPause,
		AutoResume: req.AutoResume != nil && req.AutoResume.Enabled,
		Network:    mode, Allow: allow, NetworkGiven: req.AllowInternetAccess != nil || req.Network != nil,
		Private:  req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic,
		Metadata: req.Metadata, Env: req.EnvVars, VolumeMounts: req.VolumeMounts,
	}, nil
}

// sandboxJSON is sb as E2B's Sandbox, with its tokens of its current
// generation: only its tenant is ever given this.
func (s *Server) sandboxJSON(sb *engine.Sandbox) (sandboxJSON, error) {
	toks, err := s.tokensOf(sb)
	if err != nil {
		return sandboxJSON{}, err
	}
	domain := s.cfg.Domain
	out := sandboxJSON{
		TemplateID: sb.Labels[placement.LabelTemplate], SandboxID: sb.ID, ClientID: "hutch",
		EnvdVersion: EnvdVersion, Domain: &domain, EnvdAccessToken: toks.Envd,
	}
	if sb.Labels[placement.LabelPrivate] == "true" {
		out.TrafficAccessToken = &toks.Traffic
	}
	return out, nil
}

func (s *Server) detailJSON(sb *engine.Sandbox) detailJSON {
	domain := s.cfg.Domain
	meta := map[string]string{}
	for k, v := range sb.Labels {
		if m, ok := strings.CutPrefix(k, placement.MetaPrefix); ok {
			meta[m] = v
		}
	}
	state := sb.State
	if state == engine.StateCreating {
		state = engine.StateRunning
	}
	end := sb.Created
	if sb.Deadline != nil {
		end = *sb.Deadline
	}
	internet := sb.Network == "open"
	d := detailJSON{
		TemplateID: sb.Labels[placement.LabelTemplate], SandboxID: sb.ID, ClientID: "hutch",
		StartedAt: sb.Created, EndAt: end, EnvdVersion: EnvdVersion, Domain: &domain,
		CPUCount: max(1, int(sb.CPUs+0.5)), MemoryMB: sb.Memory >> 20, DiskSizeMB: sb.Disk >> 20,
		Metadata: meta, State: state, AllowInternetAccess: &internet,
		Lifecycle: &lifecycleJSON{OnTimeout: "kill", AutoResume: sb.Labels[placement.LabelAutoResume] == "true"},
	}
	if sb.Labels[placement.LabelAutoPause] == "true" {
		d.Lifecycle.OnTimeout = "pause"
	}
	d.VolumeMounts = sandboxVolumeMounts(sb)
	if sb.Network == "allow" {
		d.Network = &networkJSON{AllowOut: sb.Allow, DenyOut: []string{"0.0.0.0/0"}}
	} else if sb.Network == "none" {
		d.Network = &networkJSON{DenyOut: []string{"0.0.0.0/0"}}
	}
	if sb.Labels[placement.LabelPrivate] == "true" {
		f := false
		if d.Network == nil {
			d.Network = &networkJSON{}
		}
		d.Network.AllowPublicTraffic = &f
	}
	return d
}

// tenantSandboxes are tenant's sandboxes, oldest first.
func (s *Server) tenantSandboxes(ctx context.Context, tenantName string) ([]*engine.Sandbox, error) {
	return s.place.List(ctx, tenantName)
}

// listed reports whether sb is shown in lists: running or paused. A
// stopped sandbox (its command or host is gone) is of no use to an E2B
// client; rm removes it.
func listed(sb *engine.Sandbox) bool {
	return sb.State == engine.StateRunning || sb.State == engine.StatePaused
}

// metadataQuery parses E2B's metadata filter: a URL-encoded query string
// of key=value pairs, every one of which must match.
func metadataQuery(r *http.Request) (map[string]string, error) {
	raw := r.URL.Query().Get("metadata")
	if raw == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, pair := range strings.Split(raw, "&") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("metadata filter %q: want key=value pairs: %w", raw, errdefs.ErrInvalidArgument)
		}
		var err error
		if k, err = urlUnescape(k); err != nil {
			return nil, err
		}
		if v, err = urlUnescape(v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

func urlUnescape(s string) (string, error) {
	u, err := url.QueryUnescape(s)
	if err != nil {
		return "", fmt.Errorf("metadata filter: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return u, nil
}

func matchesMeta(sb *engine.Sandbox, want map[string]string) bool {
	for k, v := range want {
		if got, ok := sb.Labels[placement.MetaPrefix+k]; !ok || got != v {
			return false
		}
	}
	return true
}

// checkQuery refuses a query parameter the call does not know: none is
// ignored.
func checkQuery(r *http.Request, known ...string) error {
	for k := range r.URL.Query() {
		if !slices.Contains(known, k) {
			return fmt.Errorf("query parameter %q: %s %s takes only %s: %w", k, r.Method, r.URL.Path, strings.Join(known, ", "), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func (s *Server) listSandboxesV1(r *http.Request, tenantName string) (int, any, error) {
	if err := checkQuery(r, "metadata"); err != nil {
		return 0, nil, err
	}
	meta, err := metadataQuery(r)
	if err != nil {
		return 0, nil, err
	}
	sbs, err := s.tenantSandboxes(r.Context(), tenantName)
	if err != nil {
		return 0, nil, err
	}
	out := []detailJSON{}
	for _, sb := range sbs {
		if sb.State == engine.StateRunning && matchesMeta(sb, meta) {
			out = append(out, s.detailJSON(sb))
		}
	}
	return http.StatusOK, out, nil
}

// listSandboxes is GET /v2/sandboxes: state, metadata, template and
// start-time filters, newest or oldest first (order), pagination by the
// x-next-token header.
func (s *Server) listSandboxes(r *http.Request, tenantName string) (int, any, error) {
	if err := checkQuery(r, "metadata", "state", "order", "startedAfter", "startedBefore", "template", "limit", "nextToken"); err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	meta, err := metadataQuery(r)
	if err != nil {
		return 0, nil, err
	}
	asc := false
	switch v := q.Get("order"); v {
	case "", "desc":
	case "asc":
		asc = true
	default:
		return 0, nil, fmt.Errorf("order %q: want asc or desc: %w", v, errdefs.ErrInvalidArgument)
	}
	var after, before time.Time
	for _, f := range []struct {
		name string
		t    *time.Time
	}{{"startedAfter", &after}, {"startedBefore", &before}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		if *f.t, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return 0, nil, fmt.Errorf("%s %q: want a time as RFC 3339 (2006-01-02T15:04:05Z): %w", f.name, v, errdefs.ErrInvalidArgument)
		}
	}
	template := q.Get("template")
	states := map[string]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				return 0, nil, fmt.Errorf("state %q: want running or paused: %w", st, errdefs.ErrInvalidArgument)
			}
			states[st] = true
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			return 0, nil, fmt.Errorf("limit %q: want 1 to 100: %w", v, errdefs.ErrInvalidArgument)
		}
	}
	next := q.Get("nextToken")
	if next != "" && !placement.ValidID(next) {
		return 0, nil, fmt.Errorf("nextToken %q: not a token this server gave: %w", next, errdefs.ErrInvalidArgument)
	}
	sbs, err := s.tenantSandboxes(r.Context(), tenantName)
	if err != nil {
		return 0, nil, err
	}
	var match []*engine.Sandbox
	for _, sb := range sbs {
		if !listed(sb) || !matchesMeta(sb, meta) {
			continue
		}
		if len(states) > 0 && !states[s.detailJSON(sb).State] {
			continue
		}
		if template != "" && sb.Labels[placement.LabelTemplate] != template {
			continue
		}
		// Started at or after startedAfter, and before startedBefore.
		if (!after.IsZero() && sb.Created.Before(after)) || (!before.IsZero() && !sb.Created.Before(before)) {
			continue
		}
		match = append(match, sb)
	}
	// Newest first unless asked, as E2B lists; ties by ID so pages are
	// stable.
	sort.Slice(match, func(i, j int) bool {
		if !match[i].Created.Equal(match[j].Created) {
			return match[i].Created.After(match[j].Created) != asc
		}
		return match[i].ID < match[j].ID
	})
	startAt := 0
	if next != "" {
		startAt = len(match)
		for i, sb := range match {
			if sb.ID == next {
				startAt = i
				break
			}
		}
	}
	out := []detailJSON{}
	for i := startAt; i < len(match) && len(out) < limit; i++ {
		out = append(out, s.detailJSON(match[i]))
	}
	if end := startAt + len(out); end < len(match) {
		pagination := match[end].ID
		return http.StatusOK, paged{items: out, next: pagination}, nil
	}
	return http.StatusOK, out, nil
}

// paged is a page of a list with the token of the next one.
type paged struct {
	items any
	next  string
}

func (p paged) MarshalJSON() ([]byte, error) { return json.Marshal(p.items) }

func (s *Server) getSandbox(r *http.Request, tenantName string) (int, any, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.detailJSON(sb), nil
}

func (s *Server) deleteSandbox(r *http.Request, tenantName string) (int, any, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	// Its requests under way are dropped first, as E2B drops a killed
	// sandbox's: their clients see it gone, not a process that goes on,
	// and so does every request from now on.
	defer s.beginKill(sb.ID)()
	s.cuts.cut(sb.ID, errSandboxGone)
	s.forget(sb.ID)
	if err := s.place.Remove(context.WithoutCancel(r.Context()), sb.ID); err != nil {
		return 0, nil, err
	}
	s.log.Info("removed", "sandbox", sb.ID, "tenant", tenantName)
	return http.StatusNoContent, nil, nil
}
