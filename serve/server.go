package serve

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"

	"hutch.dev/hutch/credential"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/filesystempb/filesystempbconnect"
	"hutch.dev/hutch/serve/envdpb/processpb/processpbconnect"
	"hutch.dev/hutch/serve/kubeplace"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

// EnvdPort is the port E2B's SDKs address the in-sandbox daemon (envd)
// on: a request for it is served by the server's data plane.
const EnvdPort = 49983

// EnvdVersion is the envd version the server reports; the SDKs enable
// features by it.
const EnvdVersion = "0.5.7"

// DefaultTenant is the tenant of every request when the server runs
// without a tenants file (loopback only).
const DefaultTenant = "default"

// Config configures a Server.
type Config struct {
	// Engine runs the sandboxes on this host; nil with Kube.
	Engine *engine.Engine
	// Kube, if set, places every sandbox on a Kubernetes cluster as a
	// pod instead (package serve/kubeplace): no engine is used.
	Kube *kubeplace.Config
	// Tenants authenticates API keys; nil serves one tenant,
	// DefaultTenant, without keys (a server on loopback).
	Tenants *tenant.Store
	// Domain is the domain sandbox hosts are named under:
	// PORT-SANDBOXID.Domain.
	Domain string
	// StateDir holds the server's own state: the key its access tokens
	// are derived with. Empty: serve/ under the engine's root (required
	// with Kube).
	StateDir string
	// AuditLog is the file mutating calls are recorded in; empty: none.
	AuditLog string
	// Logger receives the server's structured logs; nil: slog.Default().
	Logger *slog.Logger
	// DefaultNetwork is the network mode of a sandbox whose create asks
	// for nothing: "none" (hutch's default) or "open" (E2B's).
	DefaultNetwork string
	// MaxBodyBytes bounds JSON request bodies (not file uploads); 0:
	// 1 MiB.
	MaxBodyBytes int64
}

// Server is an E2B-compatible API server over a placement of sandboxes:
// an engine on this host, or a Kubernetes cluster. Its state is the
// placement's: a new Server on the same state adopts every sandbox.
type Server struct {
	cfg     Config
	place   placement.Placement
	tokens  credential.Key
	log     *slog.Logger
	audit   *auditLog
	metrics *metrics
	procs   *processService
	envd    http.Handler
	api     http.Handler

	// createMu serializes quota admission per tenant; reserved holds
	// what creates in flight have been admitted for.
	createMu sync.Mutex
	reserved map[string]tenant.Usage

	// locks serializes the resumes of each sandbox (and what the
	// placement serializes with them).
	locks *placement.Locks

	stop    context.CancelFunc
	stopCtx context.Context
}

// New makes a server, placing its sandboxes as cfg says: on Kubernetes
// with cfg.Kube, else on this host with cfg.Engine. It is the one place
// that chooses; everything else asks the placement. Close releases it.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	locks := &placement.Locks{}
	var place placement.Placement
	switch {
	case cfg.Kube != nil:
		kp, err := kubeplace.New(cfg.Kube, cfg.Logger, locks)
		if err != nil {
			return nil, err
		}
		if cfg.StateDir == "" {
			return nil, fmt.Errorf("serve: a server on Kubernetes needs a state directory for its token key: %w", errdefs.ErrInvalidArgument)
		}
		place = kp
	case cfg.Engine == nil:
		return nil, fmt.Errorf("serve: no engine: %w", errdefs.ErrInvalidArgument)
	default:
		// Warm pools this server claims from refill in its own
		// goroutines, not in detached helpers.
		engine.FillPoolsInProcess()
		place = newHostPlacement(cfg.Engine, cfg.Logger)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	switch cfg.DefaultNetwork {
	case "":
		cfg.DefaultNetwork = "none"
	case "none", "open":
	default:
		return nil, fmt.Errorf("default network %q: want none or open: %w", cfg.DefaultNetwork, errdefs.ErrInvalidArgument)
	}
	if cfg.Domain == "" {
		cfg.Domain = "localhost"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(cfg.Engine.Root(), "serve")
	}
	tokens, err := loadTokenKey(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	audit, err := openAudit(cfg.AuditLog)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, place: place, log: cfg.Logger, audit: audit, tokens: tokens,
		metrics:  newMetrics(),
		reserved: map[string]tenant.Usage{},
		locks:    locks,
		stop:     cancel, stopCtx: ctx,
	}
	s.metrics.sandboxes = s.countSandboxes
	s.procs = newProcessService(s.place.Processes())
	envd := http.NewServeMux()
	if fsh := s.place.Filesystem(); fsh != nil {
		envd.Handle(filesystempbconnect.NewFilesystemHandler(fsh, connect.WithReadMaxBytes(1<<20)))
	} else {
		envd.HandleFunc("/"+filesystempbconnect.FilesystemName+"/", func(w http.ResponseWriter, r *http.Request) {
			writeSandboxError(w, r, s.place.Unsupported(placement.FeatureFilesystem, "the filesystem service ("+r.URL.Path+")"))
		})
	}
	envd.HandleFunc("/files", serveFiles(s.place))
	// Bounded messages: a command's input comes in chunks, a file call
	// names paths.
	envd.Handle(processpbconnect.NewProcessHandler(s.procs, connect.WithReadMaxBytes(16<<20)))
	envd.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	envd.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("envd path %s %s is not supported by hutch", r.Method, r.URL.Path))
	})
	s.envd = envd
	s.api = s.routes()
	go s.sweep()
	return s, nil
}

// Close stops the server's background work and releases what it holds.
// Sandboxes keep running: a new server adopts them.
func (s *Server) Close() error {
	s.stop()
	perr := s.place.Close()
	if err := s.audit.Close(); err != nil {
		return err
	}
	return perr
}

// Handler is the server's whole HTTP surface: the control plane, and the
// data plane of every sandbox by host name (PORT-ID.DOMAIN) or by E2B's
// sandbox headers.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		plane := "api"
		if id, port, ok := s.sandboxOf(r); ok {
			plane = "sandbox"
			s.serveSandbox(rw, r, id, port)
		} else {
			s.api.ServeHTTP(rw, r)
		}
		s.metrics.observe(plane, r.Method, rw.status, time.Since(start))
		s.log.Debug("request", "plane", plane, "method", r.Method, "host", r.Host, "path", r.URL.Path, "status", rw.status, "duration", time.Since(start))
	})
}

// sandboxOf tells whether r is for a sandbox's port: the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers (E2B_SANDBOX_URL), or a host PORT-ID.DOMAIN.
func (s *Server) sandboxOf(r *http.Request) (id string, port int, ok bool) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		p, err := strconv.Atoi(r.Header.Get("E2b-Sandbox-Port"))
		if err != nil {
			p = -1
		}
		return id, p, true
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, rest, found := strings.Cut(host, ".")
	if !found || !strings.EqualFold(rest, s.cfg.Domain) {
		return "", 0, false
	}
	ps, id, found := strings.Cut(label, "-")
	if !found {
		return "", 0, false
	}
	p, err := strconv.Atoi(ps)
	if err != nil {
		return "", 0, false
	}
	return id, p, true
}

// serveSandbox serves a request for port of sandbox id: envd's data
// plane for EnvdPort, else a proxy to the port inside the sandbox.
func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request, id string, port int) {
	if port <= 0 || port > 65535 {
		writeSandboxError(w, r, fmt.Errorf("E2b-Sandbox-Port: want a port number from 1 to 65535: %w", errdefs.ErrInvalidArgument))
		return
	}
	// The data plane knows no tenant, only the sandbox's token: a wrong
	// token answers exactly as an unknown sandbox does, so that nobody
	// learns which IDs exist.
	notFound := fmt.Errorf("sandbox %q not found, or its access token (X-Access-Token) is wrong: %w", id, errdefs.ErrNotFound)
	sb, err := s.sandbox(r.Context(), id)
	if err != nil {
		writeSandboxError(w, r, notFound)
		return
	}
	if port == EnvdPort {
		if !credential.Match(s.envdToken(sb.ID), r.Header.Get("X-Access-Token")) {
			writeSandboxError(w, r, notFound)
			return
		}
	} else if sb.Labels[placement.LabelPrivate] == "true" {
		if !credential.Match(s.trafficToken(sb.ID), r.Header.Get("E2b-Traffic-Access-Token")) {
			writeError(w, http.StatusForbidden, "sandbox "+id+" takes public traffic only with its traffic access token (E2b-Traffic-Access-Token)")
			return
		}
	}
	if sb.State == engine.StatePaused {
		if sb, err = s.resume(r.Context(), sb, sb.Labels[placement.LabelTenant]); err != nil {
			writeSandboxError(w, r, err)
			return
		}
	}
	if sb.State != engine.StateRunning {
		writeSandboxError(w, r, fmt.Errorf("sandbox %s is %s, not running: %w", id, sb.State, errdefs.ErrUnavailable))
		return
	}
	ctx := withTarget(r.Context(), target{Tenant: sb.Labels[placement.LabelTenant], SandboxID: sb.ID})
	if port == EnvdPort {
		s.envd.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	s.proxy(w, r.WithContext(ctx), sb.ID, uint16(port))
}

// sandbox looks up one of the server's sandboxes by its full ID. Anything
// else (a name, a prefix, a sandbox the server did not create) is not
// found.
func (s *Server) sandbox(ctx context.Context, id string) (*engine.Sandbox, error) {
	if !placement.ValidID(id) {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	sb, err := s.place.Get(ctx, id)
	if err != nil || sb.ID != id || sb.Labels[placement.LabelTenant] == "" {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// owned looks up sandbox id for tenant: another tenant's sandbox is not
// found, exactly like an unknown one.
func (s *Server) owned(ctx context.Context, tenantName, id string) (*engine.Sandbox, error) {
	sb, err := s.sandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.Labels[placement.LabelTenant] != tenantName {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// resume resumes a paused sandbox once, however many requests ask at the
// same time, and forgets what the server held of its old run.
func (s *Server) resume(ctx context.Context, sb *engine.Sandbox, tenantName string) (*engine.Sandbox, error) {
	unlock := s.locks.Lock(sb.ID)
	defer unlock()
	cur, err := s.sandbox(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	if cur.State != engine.StatePaused {
		return cur, nil
	}
	start := time.Now()
	if cur, err = s.place.Resume(context.WithoutCancel(ctx), sb.ID); err != nil {
		return nil, err
	}
	s.metrics.resumed(tenantName, time.Since(start))
	s.log.Info("resumed", "sandbox", sb.ID, "tenant", tenantName, "duration", time.Since(start))
	return cur, nil
}

// forget drops what the server holds for a sandbox that is removed or
// paused: its processes, and what its placement holds of its run.
func (s *Server) forget(id string) {
	s.procs.forget(id)
	s.place.Forget(id)
}

// authenticate is the tenant of a control-plane request.
func (s *Server) authenticate(r *http.Request) (string, error) {
	if s.cfg.Tenants == nil {
		return DefaultTenant, nil
	}
	key := r.Header.Get("X-API-Key")
	if key == "" {
		return "", fmt.Errorf("missing API key: set the X-API-Key header (E2B_API_KEY): %w", errdefs.ErrUnauthenticated)
	}
	t, ok := s.cfg.Tenants.Authenticate(key)
	if !ok {
		return "", fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	return t.Name, nil
}

// statusWriter records the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
