package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"sbx.dev/sbx/engine"
)

// apiHandler is a control-plane handler: it gets the request's tenant and
// answers with a status and a JSON body (nil: none), or an error.
type apiHandler func(r *http.Request, tenant string) (int, any, error)

// routes is the control plane: E2B's REST API.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.Handle("GET /metrics", s.metrics.handler())

	handle := func(pattern string, mutating bool, h apiHandler) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			s.serveAPI(w, r, mutating, h)
		})
	}
	handle("POST /sandboxes", true, s.createSandbox)
	handle("POST /v2/sandboxes", true, s.createSandbox)
	handle("GET /sandboxes", false, s.listSandboxesV1)
	handle("GET /v2/sandboxes", false, s.listSandboxes)
	handle("GET /sandboxes/{id}", false, s.getSandbox)
	handle("DELETE /sandboxes/{id}", true, s.deleteSandbox)
	handle("POST /sandboxes/{id}/pause", true, s.pauseSandbox)
	handle("POST /sandboxes/{id}/resume", true, s.resumeSandbox)
	handle("POST /sandboxes/{id}/connect", true, s.connectSandbox)
	handle("POST /v2/sandboxes/{id}/connect", true, s.connectSandbox)
	handle("POST /sandboxes/{id}/timeout", true, s.setTimeout)
	handle("POST /sandboxes/{id}/refreshes", true, s.refresh)
	handle("POST /sandboxes/{id}/fork", true, s.forkSandbox)
	handle("POST /sandboxes/{id}/snapshots", true, s.snapshotSandbox)
	handle("GET /snapshots", false, s.listSnapshots)
	handle("PUT /sandboxes/{id}/network", true, s.updateNetwork)
	handle("GET /sandboxes/{id}/metrics", false, s.sandboxMetrics)
	handle("GET /sandboxes/{id}/logs", false, s.sandboxLogs)
	handle("GET /v2/sandboxes/{id}/logs", false, s.sandboxLogs)
	handle("GET /templates", false, s.listTemplates)
	handle("DELETE /templates/{id}", true, s.deleteTemplate)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.authenticate(r); err != nil {
			writeErr(w, err)
			return
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not supported by this server (sbx serve); see docs/api.md for the calls it serves", r.Method, r.URL.Path))
	})
	return mux
}

// serveAPI authenticates r, runs h and answers; a mutating call is
// written to the audit log.
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request, mutating bool, h apiHandler) {
	tenantName, err := s.authenticate(r)
	if err != nil {
		writeErr(w, err)
		if mutating {
			s.audit.record(auditEntry{Time: time.Now(), Call: r.Method + " " + r.URL.Path, Status: httpStatus(err), Result: err.Error(), Remote: r.RemoteAddr})
		}
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	status, body, err := h(r, tenantName)
	if err != nil {
		status = httpStatus(err)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			status = http.StatusRequestEntityTooLarge
		}
		writeError(w, status, message(err))
	} else if p, ok := body.(paged); ok {
		w.Header().Set("X-Next-Token", p.next)
		writeJSON(w, status, body)
	} else if body == nil {
		w.WriteHeader(status)
	} else {
		writeJSON(w, status, body)
	}
	if mutating {
		e := auditEntry{Time: time.Now(), Tenant: tenantName, Call: r.Method + " " + r.URL.Path, Status: status, Result: "ok", Remote: r.RemoteAddr}
		if strings.Contains(r.URL.Path, "/sandboxes/") {
			e.Sandbox = r.PathValue("id")
		}
		if err != nil {
			e.Result = message(err)
		}
		if sb, ok := body.(sandboxJSON); ok && e.Sandbox == "" {
			e.Sandbox = sb.SandboxID
		}
		s.audit.record(e)
	}
	if err != nil && status >= 500 && status != http.StatusNotImplemented {
		s.log.Error("request failed", "tenant", tenantName, "method", r.Method, "path", r.URL.Path, "err", err)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}

// decodeBody decodes r's JSON body into v; an empty body leaves v as it
// is. Unknown fields are refused by name, so that nothing a client asks
// for is silently ignored.
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("request body larger than %d bytes: %w", mbe.Limit, err)
		}
		return fmt.Errorf("read request body: %w", err)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %s: %w", strings.TrimPrefix(err.Error(), "json: "), errdefs.ErrInvalidArgument)
	}
	if dec.More() {
		return fmt.Errorf("request body: more than one JSON value: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// sandboxJSON is E2B's Sandbox: what create, connect and fork return.
type sandboxJSON struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// detailJSON is E2B's SandboxDetail and ListedSandbox.
type detailJSON struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	EnvdVersion string            `json:"envdVersion"`
	Domain      *string           `json:"domain"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	Network     *networkJSON      `json:"network,omitempty"`
	Lifecycle   *lifecycleJSON    `json:"lifecycle,omitempty"`
	// AllowInternetAccess is what the sandbox's network mode amounts to.
	AllowInternetAccess *bool `json:"allowInternetAccess,omitempty"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// networkJSON is E2B's SandboxNetworkConfig.
type networkJSON struct {
	AllowPublicTraffic *bool           `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string        `json:"allowOut,omitempty"`
	DenyOut            []string        `json:"denyOut,omitempty"`
	MaskRequestHost    string          `json:"maskRequestHost,omitempty"`
	Rules              json.RawMessage `json:"rules,omitempty"`
	EgressProxy        json.RawMessage `json:"egressProxy,omitempty"`
	HTTPSPorts         json.RawMessage `json:"httpsPorts,omitempty"`
}

// newSandboxJSON is E2B's NewSandbox.
type newSandboxJSON struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int64                  `json:"timeout"`
	AutoPause           *bool                   `json:"autoPause"`
	AutoPauseMemory     *bool                   `json:"autoPauseMemory"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	Secure              *bool                   `json:"secure"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *networkJSON            `json:"network"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	MCP                 json.RawMessage         `json:"mcp"`
	IAM                 json.RawMessage         `json:"iam"`
	VolumeMounts        json.RawMessage         `json:"volumeMounts"`
}

// E2B's limits on a timeout, in seconds.
const (
	defaultTimeout = 15
	maxTimeout     = 24 * 60 * 60
)

func checkTimeout(t *int64, def int64) (time.Duration, error) {
	v := def
	if t != nil {
		v = *t
	}
	if v < 0 || v > maxTimeout {
		return 0, fmt.Errorf("timeout %d: want seconds from 0 to %d: %w", v, maxTimeout, errdefs.ErrInvalidArgument)
	}
	return time.Duration(v) * time.Second, nil
}

func isNull(m json.RawMessage) bool {
	s := strings.TrimSpace(string(m))
	return s == "" || s == "null" || s == "[]" || s == "{}"
}

func (s *Server) createSandbox(r *http.Request, tenantName string) (int, any, error) {
	var req newSandboxJSON
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if req.TemplateID == "" {
		return 0, nil, fmt.Errorf("templateID: required: %w", errdefs.ErrInvalidArgument)
	}
	for name, m := range map[string]json.RawMessage{"mcp": req.MCP, "iam": req.IAM, "volumeMounts": req.VolumeMounts} {
		if !isNull(m) {
			return 0, nil, fmt.Errorf("%s is not supported by sbx serve: %w", name, errdefs.ErrNotImplemented)
		}
	}
	if req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
		return 0, nil, fmt.Errorf("autoPauseMemory false (a filesystem-only pause) is not supported by sbx serve: pauses keep memory: %w", errdefs.ErrNotImplemented)
	}
	timeout, err := checkTimeout(req.Timeout, defaultTimeout)
	if err != nil {
		return 0, nil, err
	}
	image, err := s.templateImage(r.Context(), tenantName, req.TemplateID)
	if err != nil {
		return 0, nil, err
	}
	mode, allow, err := s.networkPolicy(req.AllowInternetAccess, req.Network, s.cfg.DefaultNetwork)
	if err != nil {
		return 0, nil, err
	}
	onTimeout := engine.OnTimeoutRemove
	if req.AutoPause != nil && *req.AutoPause {
		onTimeout = engine.OnTimeoutPause
	}
	labels := map[string]string{labelTenant: tenantName, labelTemplate: req.TemplateID}
	for k, v := range req.Metadata {
		if k == "" || len(k) > 256 || len(v) > 4096 {
			return 0, nil, fmt.Errorf("metadata %q: keys of 1-256 and values of up to 4096 characters: %w", k, errdefs.ErrInvalidArgument)
		}
		labels[metaPrefix+k] = v
	}
	if len(req.Metadata) > 64 {
		return 0, nil, fmt.Errorf("metadata: at most 64 entries: %w", errdefs.ErrInvalidArgument)
	}
	if req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic {
		labels[labelPrivate] = "true"
	}
	if onTimeout == engine.OnTimeoutPause {
		labels[labelAutoPause] = "true"
	}
	var env []string
	keys := make([]string, 0, len(req.EnvVars))
	for k := range req.EnvVars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+req.EnvVars[k])
	}
	creq := engine.CreateRequest{
		Image: image, Network: mode, Allow: allow, Env: env, Labels: labels,
		Timeout: timeout, OnTimeout: onTimeout,
	}
	if timeout == 0 {
		creq.OnTimeout = ""
	}
	if err := s.eng.ValidateCreate(creq); err != nil {
		return 0, nil, err
	}
	release, err := s.admit(r.Context(), tenantName, usageOf(creq))
	if err != nil {
		return 0, nil, err
	}
	defer release()
	start := time.Now()
	sb, err := s.eng.Create(context.WithoutCancel(r.Context()), creq)
	if err != nil {
		return 0, nil, err
	}
	s.metrics.created(tenantName, time.Since(start))
	s.log.Info("created", "sandbox", sb.ID, "tenant", tenantName, "template", req.TemplateID, "duration", time.Since(start))
	return http.StatusCreated, s.sandboxJSON(sb), nil
}

// networkPolicy maps E2B's network fields onto sbx's modes: no internet
// access (or 0.0.0.0/0 denied) is none, or allow with allowOut as its
// rules; internet access is open. sbx's denied ranges (link-local, private,
// the host) hold in every mode.
func (s *Server) networkPolicy(internet *bool, n *networkJSON, def string) (string, []string, error) {
	if n != nil {
		for name, m := range map[string]json.RawMessage{"network.rules": n.Rules, "network.egressProxy": n.EgressProxy, "network.httpsPorts": n.HTTPSPorts} {
			if !isNull(m) {
				return "", nil, fmt.Errorf("%s is not supported by sbx serve: %w", name, errdefs.ErrNotImplemented)
			}
		}
		if n.MaskRequestHost != "" {
			return "", nil, fmt.Errorf("network.maskRequestHost is not supported by sbx serve: %w", errdefs.ErrNotImplemented)
		}
	}
	denyAll := internet != nil && !*internet
	var allowOut []string
	if n != nil {
		allowOut = n.AllowOut
		for _, d := range n.DenyOut {
			if d == "0.0.0.0/0" {
				denyAll = true
				continue
			}
			return "", nil, fmt.Errorf("network.denyOut %q: sbx serve denies only everything (0.0.0.0/0); it always denies link-local, private ranges and the host: %w", d, errdefs.ErrNotImplemented)
		}
	}
	switch {
	case denyAll:
		// allow with no rules denies as none does, but keeps a network
		// link, so that a later update can open it.
		return "allow", allowOut, nil
	case internet != nil && *internet:
		return "open", nil, nil
	case len(allowOut) > 0 && def == "none":
		return "allow", allowOut, nil
	}
	return def, nil, nil
}

// sandboxJSON is sb as E2B's Sandbox, with its tokens: only its tenant
// is ever given this.
func (s *Server) sandboxJSON(sb *engine.Sandbox) sandboxJSON {
	domain := s.cfg.Domain
	out := sandboxJSON{
		TemplateID: sb.Labels[labelTemplate], SandboxID: sb.ID, ClientID: "sbx",
		EnvdVersion: EnvdVersion, Domain: &domain, EnvdAccessToken: s.tokens.envd(sb.ID),
	}
	if sb.Labels[labelPrivate] == "true" {
		t := s.tokens.traffic(sb.ID)
		out.TrafficAccessToken = &t
	}
	return out
}

func (s *Server) detailJSON(sb *engine.Sandbox) detailJSON {
	domain := s.cfg.Domain
	meta := map[string]string{}
	for k, v := range sb.Labels {
		if m, ok := strings.CutPrefix(k, metaPrefix); ok {
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
		TemplateID: sb.Labels[labelTemplate], SandboxID: sb.ID, ClientID: "sbx",
		StartedAt: sb.Created, EndAt: end, EnvdVersion: EnvdVersion, Domain: &domain,
		CPUCount: max(1, int(sb.CPUs+0.5)), MemoryMB: sb.Memory >> 20, DiskSizeMB: sb.Disk >> 20,
		Metadata: meta, State: state, AllowInternetAccess: &internet,
		Lifecycle: &lifecycleJSON{OnTimeout: "kill", AutoResume: true},
	}
	if sb.Labels[labelAutoPause] == "true" {
		d.Lifecycle.OnTimeout = "pause"
	}
	if sb.Network == "allow" {
		d.Network = &networkJSON{AllowOut: sb.Allow, DenyOut: []string{"0.0.0.0/0"}}
	} else if sb.Network == "none" {
		d.Network = &networkJSON{DenyOut: []string{"0.0.0.0/0"}}
	}
	if sb.Labels[labelPrivate] == "true" {
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
	all, err := s.eng.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []*engine.Sandbox
	for _, sb := range all {
		if sb.Labels[labelTenant] == tenantName {
			out = append(out, sb)
		}
	}
	return out, nil
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
		if got, ok := sb.Labels[metaPrefix+k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (s *Server) listSandboxesV1(r *http.Request, tenantName string) (int, any, error) {
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

// listSandboxes is GET /v2/sandboxes: state and metadata filters,
// pagination by the x-next-token header.
func (s *Server) listSandboxes(r *http.Request, tenantName string) (int, any, error) {
	q := r.URL.Query()
	meta, err := metadataQuery(r)
	if err != nil {
		return 0, nil, err
	}
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
	if next != "" && !validID(next) {
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
		match = append(match, sb)
	}
	// Newest first, as E2B lists; ties by ID so pages are stable.
	sort.Slice(match, func(i, j int) bool {
		if !match[i].Created.Equal(match[j].Created) {
			return match[i].Created.After(match[j].Created)
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
	s.forget(sb.ID)
	if err := s.eng.Remove(context.WithoutCancel(r.Context()), sb.ID, true); err != nil {
		return 0, nil, err
	}
	s.log.Info("removed", "sandbox", sb.ID, "tenant", tenantName)
	return http.StatusNoContent, nil, nil
}

func (s *Server) pauseSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Memory != nil && !*body.Memory {
		return 0, nil, fmt.Errorf("memory false (a filesystem-only pause) is not supported by sbx serve: %w", errdefs.ErrNotImplemented)
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.State == engine.StatePaused {
		return 0, nil, fmt.Errorf("sandbox %s is already paused: %w", sb.ID, errdefs.ErrConflict)
	}
	s.forget(sb.ID)
	if _, err := s.eng.Pause(context.WithoutCancel(r.Context()), sb.ID); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// resumeSandbox is the deprecated POST /sandboxes/{id}/resume: 409 if the
// sandbox is not paused.
func (s *Server) resumeSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Timeout   *int64 `json:"timeout"`
		AutoPause *bool  `json:"autoPause"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	timeout, err := checkTimeout(body.Timeout, defaultTimeout)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.State != engine.StatePaused {
		return 0, nil, fmt.Errorf("sandbox %s is %s, not paused: %w", sb.ID, sb.State, errdefs.ErrConflict)
	}
	if sb, err = s.resume(r.Context(), sb, tenantName); err != nil {
		return 0, nil, err
	}
	if sb, err = s.eng.SetTimeout(context.WithoutCancel(r.Context()), sb.ID, timeout, ""); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, s.sandboxJSON(sb), nil
}

// connectSandbox returns a sandbox's connection details, resuming it if
// it is paused (201) and setting its timeout.
func (s *Server) connectSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Timeout *int64 `json:"timeout"`
		Memory  *bool  `json:"memory"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Memory != nil && !*body.Memory {
		return 0, nil, fmt.Errorf("memory false (resume by reboot) is not supported by sbx serve: %w", errdefs.ErrNotImplemented)
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	status := http.StatusOK
	if sb.State == engine.StatePaused {
		if sb, err = s.resume(r.Context(), sb, tenantName); err != nil {
			return 0, nil, err
		}
		status = http.StatusCreated
	}
	if sb.State != engine.StateRunning {
		return 0, nil, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, errdefs.ErrNotFound)
	}
	if body.Timeout != nil {
		timeout, err := checkTimeout(body.Timeout, 0)
		if err != nil {
			return 0, nil, err
		}
		// Connecting never shortens a sandbox's life.
		if sb.Deadline == nil || time.Until(*sb.Deadline) < timeout {
			if sb, err = s.eng.SetTimeout(context.WithoutCancel(r.Context()), sb.ID, timeout, ""); err != nil {
				return 0, nil, err
			}
		}
	}
	return status, s.sandboxJSON(sb), nil
}

func (s *Server) setTimeout(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Timeout == nil {
		return 0, nil, fmt.Errorf("timeout: required: %w", errdefs.ErrInvalidArgument)
	}
	timeout, err := checkTimeout(body.Timeout, 0)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.eng.SetTimeout(context.WithoutCancel(r.Context()), sb.ID, timeout, ""); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// refresh extends a sandbox's life by duration seconds (E2B's default
// when none is given: its timeout's default).
func (s *Server) refresh(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	d, err := checkTimeout(body.Duration, defaultTimeout)
	if err != nil {
		return 0, nil, err
	}
	if d > time.Hour {
		return 0, nil, fmt.Errorf("duration %s: at most 3600 seconds: %w", d, errdefs.ErrInvalidArgument)
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	left := time.Duration(0)
	if sb.Deadline != nil {
		left = max(0, time.Until(*sb.Deadline))
	}
	if _, err := s.eng.SetTimeout(context.WithoutCancel(r.Context()), sb.ID, max(left, d), ""); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// forkResult is one entry of a fork's answer.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

func (s *Server) forkSandbox(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > 20 {
		return 0, nil, fmt.Errorf("count %d: want 1 to 20: %w", count, errdefs.ErrInvalidArgument)
	}
	timeout, err := checkTimeout(body.Timeout, defaultTimeout)
	if err != nil {
		return 0, nil, err
	}
	parent, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if parent.State != engine.StateRunning {
		return 0, nil, fmt.Errorf("sandbox %s is %s: only a running sandbox forks: %w", parent.ID, parent.State, errdefs.ErrConflict)
	}
	u := usageOf(engine.CreateRequest{CPUs: parent.CPUs, Memory: parent.Memory, Disk: parent.Disk})
	u.Sandboxes, u.CPUs, u.Memory, u.Disk = count, u.CPUs*float64(count), u.Memory*int64(count), u.Disk*int64(count)
	release, err := s.admit(r.Context(), tenantName, u)
	if err != nil {
		return 0, nil, err
	}
	defer release()
	kids, err := s.eng.Fork(context.WithoutCancel(r.Context()), parent.ID, engine.ForkRequest{Count: count})
	if err != nil {
		return 0, nil, err
	}
	out := make([]forkResult, 0, len(kids))
	for _, kid := range kids {
		kid, err := s.adoptFork(r.Context(), kid, timeout)
		if err != nil {
			out = append(out, forkResult{Error: &apiError{Code: httpStatus(err), Message: message(err)}})
			continue
		}
		sj := s.sandboxJSON(kid)
		out = append(out, forkResult{Sandbox: &sj})
	}
	return http.StatusCreated, out, nil
}

// adoptFork gives a fork its lifetime. The fork inherits the parent's
// labels, tenant and metadata included; its tokens are its own (they
// derive from its ID).
func (s *Server) adoptFork(ctx context.Context, kid *engine.Sandbox, timeout time.Duration) (*engine.Sandbox, error) {
	onTimeout := engine.OnTimeoutRemove
	if kid.Labels[labelAutoPause] == "true" {
		onTimeout = engine.OnTimeoutPause
	}
	return s.eng.SetTimeout(context.WithoutCancel(ctx), kid.ID, timeout, onTimeout)
}

func (s *Server) sandboxMetrics(r *http.Request, tenantName string) (int, any, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.State != engine.StateRunning {
		return http.StatusOK, []any{}, nil
	}
	st, err := s.eng.Stats(r.Context(), sb.ID)
	if err != nil {
		return 0, nil, err
	}
	now := time.Now().UTC()
	type metric struct {
		Timestamp     time.Time `json:"timestamp"`
		TimestampUnix int64     `json:"timestampUnix"`
		CPUCount      int       `json:"cpuCount"`
		CPUUsedPct    float64   `json:"cpuUsedPct"`
		MemUsed       int64     `json:"memUsed"`
		MemTotal      int64     `json:"memTotal"`
		DiskUsed      int64     `json:"diskUsed"`
		DiskTotal     int64     `json:"diskTotal"`
	}
	return http.StatusOK, []metric{{
		Timestamp: now, TimestampUnix: now.Unix(), CPUCount: max(1, int(sb.CPUs+0.5)),
		CPUUsedPct: st.CPU.Percent, MemUsed: int64(st.Memory.Usage), MemTotal: sb.Memory,
		DiskUsed: int64(st.Disk.Used), DiskTotal: sb.Disk,
	}}, nil
}

func (s *Server) sandboxLogs(r *http.Request, tenantName string) (int, any, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	limit := 1000
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return 0, nil, fmt.Errorf("limit %q: want 1 to 10000: %w", v, errdefs.ErrInvalidArgument)
		}
		limit = n
	}
	var buf strings.Builder
	lw := &limitedWriter{w: &buf, n: 8 << 20}
	if err := s.eng.Logs(r.Context(), sb.ID, engine.LogsRequest{Out: lw}); err != nil {
		return 0, nil, err
	}
	type logLine struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if len(lines) > limit {
		lines = lines[len(lines)-limit:]
	}
	logs := []logLine{}
	for _, l := range lines {
		if l == "" {
			continue
		}
		ts, rest, _ := strings.Cut(l, " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			t, rest = time.Time{}, l
		}
		logs = append(logs, logLine{Timestamp: t, Line: rest})
	}
	return http.StatusOK, map[string]any{"logs": logs, "logEntries": []any{}}, nil
}

// limitedWriter keeps the first n bytes written to it and drops the rest.
type limitedWriter struct {
	w io.Writer
	n int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return len(p), nil
	}
	q := p
	if int64(len(q)) > l.n {
		q = q[:l.n]
	}
	n, err := l.w.Write(q)
	l.n -= int64(n)
	if err != nil {
		return n, err
	}
	return len(p), nil
}

func (s *Server) updateNetwork(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		AllowOut            []string        `json:"allowOut"`
		DenyOut             []string        `json:"denyOut"`
		AllowInternetAccess *bool           `json:"allow_internet_access"`
		Rules               json.RawMessage `json:"rules"`
		EgressProxy         json.RawMessage `json:"egressProxy"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	// Omitted fields are cleared, as E2B does: an update that denies
	// nothing opens the sandbox (sbx's denied ranges still hold).
	mode, allow, err := s.networkPolicy(body.AllowInternetAccess, &networkJSON{AllowOut: body.AllowOut, DenyOut: body.DenyOut, Rules: body.Rules, EgressProxy: body.EgressProxy}, "open")
	if err != nil {
		return 0, nil, err
	}
	if allow == nil {
		allow = []string{}
	}
	if _, err := s.eng.Update(context.WithoutCancel(r.Context()), sb.ID, engine.UpdateRequest{Network: &mode, Allow: &allow}); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}
