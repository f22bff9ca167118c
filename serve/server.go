package serve

import (
	"context"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"

	"hutch.dev/hutch/browser"
	"hutch.dev/hutch/credential"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/screen"
	"hutch.dev/hutch/serve/envdpb/filesystempb/filesystempbconnect"
	"hutch.dev/hutch/serve/envdpb/processpb/processpbconnect"
	"hutch.dev/hutch/serve/kubeplace"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

// EnvdPort is the port E2B's SDKs address the in-sandbox daemon (envd)
// on: a request for it is served by the server's data plane.
const EnvdPort = 49983

// CodeInterpreterPort is the port of the code interpreter's server in a
// sandbox of the code-interpreter-v1 template (E2B's JUPYTER_PORT).
// Its POST /execute, which runs code, takes the sandbox's envd access
// token as envd's calls do (E2B's SDK sends it there as X-Access-Token);
// its other calls are the sandbox's public traffic, as in E2B.
const CodeInterpreterPort = 49999

// EnvdVersion is the envd version the server reports; the SDKs enable
// features by it.
const EnvdVersion = "0.6.4"

// DefaultTenant is the tenant of every request when the server runs
// without a tenants file (loopback only, with Config.APIKey).
const DefaultTenant = "default"

// Config configures a Server.
type Config struct {
	// Engine runs the sandboxes on this host; nil with Kube.
	Engine *engine.Engine
	// Kube, if set, places every sandbox on a Kubernetes cluster as a
	// pod instead (package serve/kubeplace): no engine is used.
	Kube *kubeplace.Config
	// Tenants authenticates API keys; nil serves one tenant,
	// DefaultTenant, whose key is APIKey.
	Tenants *tenant.Store
	// APIKey is the one key of a server without Tenants (required then):
	// it acts as DefaultTenant and opens the operator's view too.
	APIKey string
	// OperatorKey, if set, opens the operator's view (GET /metrics); it
	// acts as no tenant.
	OperatorKey string
	// Domain is the domain sandbox hosts are named under:
	// PORT-SANDBOXID.Domain.
	Domain string
	// Listen is the address the server listens on (HOST:PORT): requests
	// for it, and for localhost, 127.0.0.1 and [::1] at its port, are
	// its own. Empty: loopback names at any port.
	Listen string
	// Hosts are further names requests may address the server by
	// (NAME, or NAME:PORT for that port only). A request for any other
	// name than these, Listen's, Domain and *.Domain answers 421, and
	// one from a web page of another origin 403.
	Hosts []string
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
	// NetRate limits what each sandbox with network sends, in bits per
	// second (engine.ParseRate); 0 is no limit. Host placement only.
	NetRate int64
	// MaxBodyBytes bounds JSON request bodies (not file uploads); 0:
	// 1 MiB.
	MaxBodyBytes int64
	// Watches bounds the filesystem watches one tenant and one sandbox
	// may hold open; zero: DefaultTenantWatchers, DefaultSandboxWatchers.
	Watches WatchLimits
	// AuditMaxBytes is the size past which the audit log is rotated;
	// 0: 100 MiB. AuditKeep is how many rotated files are kept; 0: 5.
	AuditMaxBytes int64
	AuditKeep     int
	// BodyTimeout bounds the reading of a request's body before its
	// handler runs (data-plane streams and uploads are not bounded);
	// 0: 30 s.
	BodyTimeout time.Duration
	// WebhookAllow are the destinations webhook deliveries may go to:
	// CIDRs, addresses and host names. Empty: no webhook can be
	// registered.
	WebhookAllow []string
	// BuildAllow is the build allow list (engine.BuildRequest.Allow):
	// what the RUN steps of template builds reach (aptInstall,
	// pipInstall and npmInstall need their index on it). Empty: steps
	// have no network. BuildDNS are the steps' upstream DNS servers;
	// none: the host's.
	BuildAllow, BuildDNS []string
	// Version is what GET /version answers: the server's build.
	Version Version
	// Tracer, if set, traces every request, create and command (see
	// trace.go); nil traces nothing.
	Tracer trace.TracerProvider
	// MaxUntrustedConns bounds the connections of one client address
	// that have not presented a valid key or token: past it the oldest
	// is closed (Listener). 0: 128.
	MaxUntrustedConns int
	// MaxCreates bounds the sandboxes the server makes at once; a create
	// past it waits, at most CreateQueueTimeout, then is answered 429
	// with Retry-After: 1 (E2B's SDKs retry it). 0: DefaultMaxCreates,
	// DefaultCreateQueueTimeout.
	MaxCreates         int
	CreateQueueTimeout time.Duration
}

// Version is the build of a server and of the runsc it drives, as
// GET /version answers it (hutch's own call; the SDKs do not make it).
type Version struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	BuildDate string `json:"buildDate"`
	Go        string `json:"goVersion"`
	Platform  string `json:"platform"`
	// Runsc is `runsc --version`'s first line; "" on Kubernetes, where
	// each node has its own.
	Runsc string `json:"runscVersion,omitempty"`
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
	// history is each sandbox's recent metrics (history.go).
	history *history
	procs   *processService
	// ports are the transports of the port routing (proxy.go).
	ports portTransports
	envd  http.Handler
	// tracer makes the spans of requests, creates and commands.
	tracer trace.Tracer
	api    http.Handler
	front  front
	conns  *connLimiter
	// creates bounds the creates in flight (creategate.go).
	creates *createGate
	// console, if set, serves ConsolePrefix (SetConsole).
	console http.Handler

	// createMu serializes quota admission per tenant; reserved holds
	// what creates in flight have been admitted for.
	createMu sync.Mutex
	reserved map[string]tenant.Usage

	// defaultNet is the network mode of a create that asks for none:
	// Config.DefaultNetwork, then what SetDefaultNetwork last set.
	defaultNet atomic.Pointer[string]

	// locks serializes the resumes of each sandbox (and what the
	// placement serializes with them) and the replacing of its tokens.
	locks *placement.Locks
	// cuts ends the requests of a sandbox's tokens when they are
	// replaced, and all of its requests when it is killed.
	cuts tokenCuts

	// killMu guards killing: the sandboxes being removed, each with the
	// kills under way. The data plane answers them as gone from the
	// moment a kill begins, so that a client whose request the kill
	// dropped finds the sandbox gone when it asks.
	killMu  sync.Mutex
	killing map[string]int

	// logReads bounds each tenant's log reads in flight.
	logReads inFlight

	// builds are the template builds (POST /v3/templates).
	builds builds
	// events are the sandboxes' lifecycle events and their webhooks.
	events *eventHub

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
		if cfg.NetRate != 0 {
			return nil, fmt.Errorf("serve: a sandbox's network rate is not applied on Kubernetes: %w", errdefs.ErrInvalidArgument)
		}
		place = kp
	case cfg.Engine == nil:
		return nil, fmt.Errorf("serve: no engine: %w", errdefs.ErrInvalidArgument)
	default:
		// Warm pools this server claims from refill in its own
		// goroutines, not in detached helpers.
		engine.FillPoolsInProcess()
		hp := newHostPlacement(cfg.Engine, cfg.Logger, cfg.Watches, cfg.NetRate)
		hp.buildAllow, hp.buildDNS = cfg.BuildAllow, cfg.BuildDNS
		place = hp
	}
	if cfg.Tenants == nil && cfg.APIKey == "" {
		return nil, fmt.Errorf("serve: a server without tenants needs an API key (Config.APIKey): %w", errdefs.ErrInvalidArgument)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 30 * time.Second
	}
	if cfg.MaxUntrustedConns <= 0 {
		cfg.MaxUntrustedConns = 128
	}
	if cfg.DefaultNetwork == "" {
		cfg.DefaultNetwork = "none"
	}
	if err := checkDefaultNetwork(cfg.DefaultNetwork); err != nil {
		return nil, err
	}
	if cfg.Domain == "" {
		cfg.Domain = "localhost"
	}
	fr, err := newFront(cfg.Listen, cfg.Domain, cfg.Hosts)
	if err != nil {
		return nil, err
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(cfg.Engine.Root(), "serve")
	}
	tokens, err := loadTokenKey(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	audit, err := openAudit(cfg.AuditLog, cfg.AuditMaxBytes, cfg.AuditKeep)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, place: place, log: cfg.Logger, audit: audit, tokens: tokens,
		tracer:   tracerOf(cfg.Tracer),
		metrics:  newMetrics(),
		history:  newHistory(historySamples),
		front:    fr,
		conns:    newConnLimiter(cfg.MaxUntrustedConns, cfg.Logger),
		creates:  newCreateGate(cfg.MaxCreates, cfg.CreateQueueTimeout),
		reserved: map[string]tenant.Usage{},
		killing:  map[string]int{},
		locks:    locks,
		logReads: inFlight{what: "log reads", max: maxLogReads},
		stop:     cancel, stopCtx: ctx,
	}
	s.defaultNet.Store(&cfg.DefaultNetwork)
	s.metrics.sandboxes = s.countSandboxes
	if s.events, err = newEvents(s, cfg.StateDir, cfg.WebhookAllow); err != nil {
		cancel()
		return nil, err
	}
	go s.events.reconcile(ctx)
	s.procs = newProcessService(s.place.Processes())
	s.procs.tracer = s.tracer
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
	go s.sampleHistory()
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
		var sandbox string
		var port int
		if ctx, span := s.startRequestSpan(r); span.IsRecording() {
			r = r.WithContext(ctx)
			defer func() { endRequestSpan(span, r, plane, sandbox, port, rw.status) }()
		}
		s.conns.serving(r.Context(), true)
		defer s.conns.serving(r.Context(), false)
		// What follows the headers is read within the body timeout,
		// until a handler that streams lifts it (noDeadline).
		_ = http.NewResponseController(w).SetReadDeadline(start.Add(s.cfg.BodyTimeout)) // not every writer can (tests' recorders)
		if status, msg := s.front.check(r); status != 0 {
			writeError(rw, status, msg)
		} else if id, p, ok := s.sandboxOf(r); ok {
			plane, sandbox, port = "sandbox", id, p
			s.serveSandbox(rw, r, id, p)
		} else if s.console != nil && isConsolePath(r.URL.Path) {
			plane = "console"
			s.console.ServeHTTP(rw, r)
		} else {
			s.api.ServeHTTP(rw, r)
		}
		s.metrics.observe(plane, r.Method, rw.status, time.Since(start))
		s.log.Debug("request", "plane", plane, "method", r.Method, "host", r.Host, "path", r.URL.Path, "status", rw.status, "duration", time.Since(start))
	})
}

// Routes is the server's routing without the work Handler does once per
// request it is given (the front's check, metrics, tracing, the body's
// deadline): the control plane, or a sandbox's port by E2B's sandbox
// headers or host name. A handler of the server's own that Handler has
// let in, such as the console, passes its calls on through it, so that
// each is checked, counted and traced once.
func (s *Server) Routes() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, p, ok := s.sandboxOf(r); ok {
			s.serveSandbox(w, r, id, p)
			return
		}
		s.api.ServeHTTP(w, r)
	})
}

// ConsolePrefix is the path the web console is served under.
const ConsolePrefix = "/console"

// SetConsole mounts h at ConsolePrefix (package console), before the
// server serves: a request for that path or under it that is not for a
// sandbox's port is h's, once the server's front (its names, the
// origin of a web page) has let it in.
func (s *Server) SetConsole(h http.Handler) { s.console = h }

// isConsolePath tells whether p is the console's.
func isConsolePath(p string) bool {
	return p == ConsolePrefix || strings.HasPrefix(p, ConsolePrefix+"/")
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
	// token answers exactly as a sandbox that is not there (writeGone),
	// and so does a paused one that may not be woken, so that nobody
	// learns which IDs exist.
	//
	// A request a token opened ends when the token is replaced
	// (rotateTokens), and every request when the sandbox is killed:
	// held before the sandbox's generation is read.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	release := func() {}
	if placement.ValidID(id) {
		release = s.cuts.hold(id, cancel)
	}
	defer func() { release() }()
	signed := port == EnvdPort && signedFiles(r)
	sb, err := s.sandbox(ctx, id)
	if err == nil && s.isKilling(id) {
		err = fmt.Errorf("sandbox %s is being killed: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		if signed {
			// As a wrong signature of a sandbox that is there.
			writeSignatureError(w, checkSignature(r, "", time.Now()))
			return
		}
		writeGone(w, id)
		return
	}
	if runsCode(r, port) {
		if !s.tokenMatches(sb, r.Header.Get("X-Access-Token")) {
			writeGone(w, id)
			return
		}
		s.conns.trust(ctx)
	}
	var browserToken string
	if port == EnvdPort {
		toks, err := s.tokensOf(sb)
		switch {
		case err != nil:
			writeGone(w, id)
			return
		case signed:
			if err := checkSignature(r, toks.Envd, time.Now()); err != nil {
				writeSignatureError(w, err)
				return
			}
		case !credential.Match(toks.Envd, r.Header.Get("X-Access-Token")):
			writeGone(w, id)
			return
		}
		s.conns.trust(ctx)
	} else if port == browser.Port || port == screen.VNCPort {
		// The browser's DevTools drive everything the browser can do,
		// and the screen's VNC stream the desktop: never a public
		// preview, whatever the sandbox's traffic is.
		tok, err := s.streamToken(sb)
		if err != nil || !browser.Check(r, tok) {
			writeGone(w, id)
			return
		}
		browserToken = tok
		s.conns.trust(ctx)
	} else if sb.Labels[placement.LabelPrivate] == "true" {
		toks, err := s.tokensOf(sb)
		if err != nil || !credential.Match(toks.Traffic, r.Header.Get("E2b-Traffic-Access-Token")) {
			writeError(w, http.StatusForbidden, "sandbox "+id+" takes public traffic only with its traffic access token (E2b-Traffic-Access-Token)")
			return
		}
		s.conns.trust(ctx)
	} else {
		// A public sandbox's preview is no token's to end, but it ends
		// when the sandbox is killed.
		release()
		release = s.cuts.holdKill(id, cancel)
	}
	// Commands' streams, uploads and a preview's WebSockets last as
	// long as they do.
	noDeadline(w)
	switch sb.State {
	case engine.StatePaused:
		// Only a sandbox created with auto-resume wakes for its data
		// plane, and never for the health check: isRunning() of a paused
		// sandbox is false, and asking it leaves the sandbox paused.
		if sb.Labels[placement.LabelAutoResume] != "true" || (port == EnvdPort && r.URL.Path == "/health") {
			writeGone(w, id)
			return
		}
		if sb, err = s.resume(ctx, sb, sb.Labels[placement.LabelTenant]); err != nil {
			writeSandboxError(w, r, err)
			return
		}
	case engine.StateStopped:
		writeGone(w, id)
		return
	}
	if sb.State != engine.StateRunning {
		writeSandboxError(w, r, fmt.Errorf("sandbox %s is %s, not running: %w", id, sb.State, errdefs.ErrUnavailable))
		return
	}
	ctx = withTarget(ctx, target{Tenant: sb.Labels[placement.LabelTenant], SandboxID: sb.ID})
	w = abortWriter{ResponseWriter: w, ctx: ctx}
	if port == EnvdPort {
		s.envd.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	if port == browser.Port {
		s.serveBrowser(w, r.WithContext(ctx), sb, browserToken)
		return
	}
	if port == screen.VNCPort {
		s.serveScreen(ctx, w, r.WithContext(ctx), sb)
		return
	}
	s.proxy(w, r.WithContext(ctx), sb.ID, uint16(port))
}

// runsCode tells whether r runs code in the code interpreter of a
// sandbox: it needs the sandbox's envd access token.
func runsCode(r *http.Request, port int) bool {
	return port == CodeInterpreterPort && r.URL.Path == "/execute"
}

// tokenMatches tells whether token is the envd access token of sb.
func (s *Server) tokenMatches(sb *engine.Sandbox, token string) bool {
	toks, err := s.tokensOf(sb)
	return err == nil && credential.Match(toks.Envd, token)
}

// beginKill marks sandbox id as being killed until end is called.
func (s *Server) beginKill(id string) (end func()) {
	s.killMu.Lock()
	s.killing[id]++
	s.killMu.Unlock()
	return func() {
		s.killMu.Lock()
		defer s.killMu.Unlock()
		if s.killing[id]--; s.killing[id] <= 0 {
			delete(s.killing, id)
		}
	}
}

// isKilling tells whether a kill of sandbox id is under way.
func (s *Server) isKilling(id string) bool {
	s.killMu.Lock()
	defer s.killMu.Unlock()
	return s.killing[id] > 0
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
// same time, and forgets what the server held of its old run. It is
// admitted to the tenant's quota first: a refusal (ErrResourceExhausted)
// leaves it paused.
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
	release, err := s.admit(ctx, tenantName, resumeUsage(cur))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s stays paused: %w", sb.ID, err)
	}
	defer release()
	start := time.Now()
	if cur, err = s.place.Resume(context.WithoutCancel(ctx), sb.ID); err != nil {
		return nil, err
	}
	s.metrics.resumed(tenantName, time.Since(start))
	s.log.Info("resumed", "sandbox", sb.ID, "tenant", tenantName, "duration", time.Since(start))
	s.events.emit(eventResumed, cur.ID, cur)
	return cur, nil
}

// forget drops what the server holds for a sandbox that is removed or
// paused: its processes, and what its placement holds of its run.
func (s *Server) forget(id string) {
	s.procs.forget(id)
	s.ports.forget(id)
	s.place.Forget(id)
}

// authenticate is who a control-plane request's API key is (X-API-Key,
// else Authorization: Bearer). A request that presents a valid key makes
// its connection trusted.
func (s *Server) authenticate(r *http.Request) (credential.Principal, error) {
	key := credential.Presented(r.Header)
	if key == "" {
		return credential.Principal{}, fmt.Errorf("missing API key: set the X-API-Key header (E2B_API_KEY) or Authorization: Bearer: %w", errdefs.ErrUnauthenticated)
	}
	var p credential.Principal
	switch {
	case credential.Match(s.cfg.OperatorKey, key):
		p = credential.Principal{Operator: true}
	case s.cfg.Tenants == nil:
		if !credential.Match(s.cfg.APIKey, key) {
			return p, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
		}
		p = credential.Principal{Tenant: DefaultTenant, Operator: true}
	default:
		t, ok := s.cfg.Tenants.Authenticate(key)
		if !ok {
			return p, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
		}
		p = credential.Principal{Tenant: t.Name}
	}
	s.conns.trust(r.Context())
	return p, nil
}

// authenticateTenant is the tenant of a control-plane request: the
// operator's own key acts as no tenant.
func (s *Server) authenticateTenant(r *http.Request) (string, error) {
	p, err := s.authenticate(r)
	if err != nil {
		return "", err
	}
	if p.Tenant == "" {
		return "", fmt.Errorf("the operator key acts as no tenant: %s %s needs a tenant's API key: %w", r.Method, r.URL.Path, errdefs.ErrPermissionDenied)
	}
	return p.Tenant, nil
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

func checkDefaultNetwork(mode string) error {
	switch mode {
	case "none", "open":
		return nil
	}
	return fmt.Errorf("default network %q: want none or open: %w", mode, errdefs.ErrInvalidArgument)
}

// SetDefaultNetwork changes the network mode of sandboxes whose create
// asks for none (Config.DefaultNetwork) for the creates that follow.
func (s *Server) SetDefaultNetwork(mode string) error {
	if err := checkDefaultNetwork(mode); err != nil {
		return err
	}
	s.defaultNet.Store(&mode)
	return nil
}

// defaultNetwork is the network mode of a create that asks for none.
func (s *Server) defaultNetwork() string { return *s.defaultNet.Load() }
