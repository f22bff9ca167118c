package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/serve/placement"
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
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		p, err := s.authenticate(r)
		if err == nil && !p.Operator {
			err = fmt.Errorf("GET /metrics names every tenant: it needs the operator's key (hutch serve --operator-key-file), not a tenant's: %w", errdefs.ErrPermissionDenied)
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		s.metrics.handler().ServeHTTP(w, r)
	})

	mux.HandleFunc("GET "+OperatorTenantsPath, s.serveOperatorTenants)

	handle := func(pattern string, mutating bool, h apiHandler) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			s.serveAPI(w, r, mutating, h)
		})
	}
	// needs is h, a call that needs feature f of the placement (what
	// names it): a placement without it answers 501 before anything
	// of the request is looked at.
	needs := func(f placement.Feature, what string, h apiHandler) apiHandler {
		return func(r *http.Request, tenantName string) (int, any, error) {
			if err := s.place.Unsupported(f, what); err != nil {
				return 0, nil, err
			}
			return h(r, tenantName)
		}
	}
	handle("GET /version", false, func(*http.Request, string) (int, any, error) {
		return http.StatusOK, s.cfg.Version, nil
	})
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
	// hutch's own: replace a sandbox's tokens.
	handle("POST /sandboxes/{id}/tokens", true, s.rotateTokens)
	handle("POST /sandboxes/{id}/browser", true, s.startBrowser)
	handle("POST /sandboxes/{id}/screen", true, s.startScreen)
	handle("POST /sandboxes/{id}/recordings", true, s.startRecording)
	handle("POST /sandboxes/{id}/recordings/{recordingID}/stop", true, s.stopRecording)
	handle("GET /snapshots", false, s.listSnapshots)
	// hutch's own: checkpoints (checkpoints.go).
	handle("POST /sandboxes/{id}/checkpoints", true, s.createCheckpoint)
	handle("GET /sandboxes/{id}/checkpoints", false, s.listCheckpoints)
	handle("DELETE /sandboxes/{id}/checkpoints/{checkpointID}", true, s.deleteCheckpoint)
	handle("POST /sandboxes/{id}/checkpoints/{checkpointID}/restore", true, s.restoreCheckpoint)
	handle("GET /sandboxes/{id}/checkpoints/{checkpointID}/diff", false, s.diffCheckpoint)
	handle("PUT /sandboxes/{id}/network", true, needs(placement.FeatureNetworkUpdate, "changing a sandbox's network", s.updateNetwork))
	handle("GET /sandboxes/{id}/metrics", false, needs(placement.FeatureMetrics, "sandbox metrics", s.sandboxMetrics))
	handle("GET /sandboxes/{id}/logs", false, needs(placement.FeatureLogs, "sandbox logs", s.sandboxLogs))
	handle("GET /v2/sandboxes/{id}/logs", false, needs(placement.FeatureLogs, "sandbox logs", s.sandboxLogs))
	handle("GET /templates", false, needs(placement.FeatureTemplates, "listing templates", s.listTemplates))
	handle("DELETE /templates/{id}", true, s.deleteTemplate)
	handle("POST /events/webhooks", true, s.createWebhook)
	handle("GET /events/webhooks", false, s.listWebhooks)
	handle("GET /events/webhooks/{webhookID}", false, s.getWebhook)
	handle("PATCH /events/webhooks/{webhookID}", true, s.updateWebhook)
	handle("DELETE /events/webhooks/{webhookID}", true, s.deleteWebhook)
	handle("GET /sandboxes/metrics", false, needs(placement.FeatureMetrics, "sandbox metrics", s.sandboxesMetrics))
	handle("GET /teams/{teamID}/metrics", false, s.teamMetrics)
	handle("GET /teams/{teamID}/metrics/max", false, s.teamMetricsMax)
	handle("GET /api-keys", false, s.listAPIKeys)
	handle("POST /api-keys", true, s.createAPIKey)
	handle("PATCH /api-keys/{apiKeyID}", true, s.renameAPIKey)
	handle("DELETE /api-keys/{apiKeyID}", true, s.revokeAPIKey)
	handle("POST /access-tokens", true, s.accessTokens)
	handle("DELETE /access-tokens/{accessTokenID}", true, s.accessTokens)
	// Template builds from code (the SDKs' Template builder).
	handle("POST /v3/templates", true, s.requestBuild)
	handle("GET /templates/{templateID}/files/{hash}", false, s.fileUploadLink)
	handle("POST /v2/templates/{templateID}/builds/{buildID}", true, s.startBuild)
	handle("GET /templates/{templateID}/builds/{buildID}/status", false, s.buildStatus)
	// GET /templates/aliases/{alias} and /templates/{templateID}/tags.
	handle("GET /templates/{templateID}/{sub}", false, s.templateSub)
	handle("POST /templates/tags", true, s.assignTags)
	handle("DELETE /templates/tags", true, s.deleteTags)
	// The upload URL fileUploadLink signs: its token is the credential.
	mux.HandleFunc("PUT /template-files/{tenant}/{hash}", s.uploadFile)
	handle("POST /volumes", true, needs(placement.FeatureVolumes, "volumes", s.createVolume))
	handle("GET /volumes", false, needs(placement.FeatureVolumes, "volumes", s.listVolumes))
	handle("GET /volumes/{volumeID}", false, needs(placement.FeatureVolumes, "volumes", s.getVolume))
	handle("DELETE /volumes/{volumeID}", true, needs(placement.FeatureVolumes, "volumes", s.deleteVolume))
	mux.HandleFunc("/volumecontent/{volumeID}/{op}", s.serveVolumeContent)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.authenticate(r); err != nil {
			writeErr(w, err)
			return
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not supported by this server (hutch serve); see docs/api.md for the calls it serves", r.Method, clip(r.URL.Path, 200)))
	})
	return mux
}

// serveAPI authenticates r, runs h and answers; a mutating call is
// written to the audit log.
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request, mutating bool, h apiHandler) {
	tenantName, err := s.authenticateTenant(r)
	if err != nil {
		writeErr(w, err)
		if mutating {
			s.audit.refused(r, httpStatus(err), err)
		}
		return
	}
	status, body, err := s.runAPI(w, r, tenantName, h)
	if err == nil && mutating && status < 300 {
		s.afterCall(r, body)
	}
	if err != nil {
		status = httpStatus(err)
		if v := retryAfter(err); v != "" {
			w.Header().Set("Retry-After", v)
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

// runAPI reads r's body (JSON, at most MaxBodyBytes, within the body
// timeout the server set) and runs h on it. The handler itself runs
// without a read deadline: a create that builds an image takes minutes.
func (s *Server) runAPI(w http.ResponseWriter, r *http.Request, tenantName string, h apiHandler) (int, any, error) {
	if err := checkJSONBody(r); err != nil {
		return 0, nil, err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return 0, nil, fmt.Errorf("request body larger than %d bytes: %w", mbe.Limit, err)
		}
		return 0, nil, fmt.Errorf("read request body: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	noDeadline(w)
	r.Body = io.NopCloser(bytes.NewReader(body))
	return h(r, tenantName)
}

// noDeadline lifts the read deadline of w's connection, for a handler
// that outlasts the body timeout (a stream, an upload, a long create).
func noDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{}) // not every writer can (tests' recorders)
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
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	VolumeMounts        []volumeMountJSON `json:"volumeMounts,omitempty"`
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
