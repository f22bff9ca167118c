// Package serve is `hutch serve`: the E2B-compatible API server.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/cmd/hutch/commands/system"
	"hutch.dev/hutch/console"
	"hutch.dev/hutch/credential"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/kubenode"
	"hutch.dev/hutch/serve"
	"hutch.dev/hutch/serve/kube"
	"hutch.dev/hutch/serve/kubeplace"
	"hutch.dev/hutch/serve/tenant"
)

// Command is `hutch serve`.
var Command = &cli.Command{
	Name:  "serve",
	Usage: "serve E2B's API (REST control plane and envd data plane) over this host's sandboxes",
	Description: `Without --tenants the server has one tenant and listens on loopback only;
every call needs its API key, which the first start makes, prints once and
keeps in serve/api.key under the state root. With --tenants FILE (made with
'hutch tenant add') every call needs a tenant's key, and each tenant sees only
its own sandboxes and snapshots. Keys go in X-API-Key (E2B_API_KEY) or
Authorization: Bearer. GET /metrics needs the operator's key
(--operator-key-file), or is served without one on --metrics-listen.

With --tls-cert and --tls-key, or --tls-self-signed, the server speaks
HTTPS only (TLS 1.2 or later, HTTP/2 by ALPN) on --listen: listen on port
443 for the SDKs' default URLs, https://api.DOMAIN and
https://PORT-ID.DOMAIN. SIGHUP reloads the certificate files; connections
already open keep theirs. Without them it speaks plain HTTP.

The server answers only requests addressed to its own names: its listen
address, localhost at its port, --domain and *.DOMAIN, and each --host;
others get 421, and requests from web pages of other origins 403. See
docs/api.md and docs/credentials.md.

With --backend kubernetes --kubeconfig FILE the server runs no sandbox on
this host: each one is a pod with runtimeClassName hutch on the cluster, which
the cluster's scheduler places; --template NAME=IMAGE maps E2B templateIDs
to the images the pods run. --kubeconfig alone implies --backend kubernetes.
See "Placing sandboxes on Kubernetes" in docs/api.md.

Every flag is also a key of the config file (--config, default
` + DefaultConfigPath + `) and an environment variable HUTCH_SERVE_NAME; a
flag wins over the variable, which wins over the file. SIGHUP reads the
file again: tenants, log-level and default-network change at once, and
the log names the keys that changed and need a restart. See
docs/operations.md.`,
	Flags:  serveFlags,
	Action: run,
}

// serveFlags are serve's flags; each but --config is a key of serve.toml
// and has a HUTCH_SERVE_* variable.
var serveFlags = withServeEnv([]cli.Flag{
	configFlag,
	&cli.StringFlag{Name: "listen", Value: "127.0.0.1:3000", Usage: "address to listen on"},
	&cli.StringFlag{Name: "tenants", Usage: "tenants file with hashed API keys and quotas (hutch tenant add)", EnvVars: []string{"HUTCH_TENANTS"}},
	&cli.StringFlag{Name: "domain", Value: "localhost", Usage: "domain of sandbox hosts: PORT-SANDBOXID.DOMAIN (E2B_DOMAIN)"},
	&cli.StringSliceFlag{Name: "host", Usage: "another name clients reach the server by, NAME or NAME:PORT (its DNS name or address; repeatable); requests for names not its own answer 421"},
	&cli.StringFlag{Name: "tls-cert", Usage: "serve HTTPS (TLS 1.2+, HTTP/2) with this PEM certificate (chain after the leaf); it must cover DOMAIN and *.DOMAIN; reloaded on SIGHUP"},
	&cli.StringFlag{Name: "tls-key", Usage: "the PEM private key of --tls-cert"},
	&cli.BoolFlag{Name: "tls-self-signed", Usage: "serve HTTPS with a certificate for DOMAIN and *.DOMAIN from a development CA kept in serve/tls under the state root (made on first use; prints how to trust it)"},
	&cli.StringFlag{Name: "operator-key-file", Usage: "FILE holding the operator's API key, which opens GET /metrics (made, mode 0600, with a new key if missing)"},
	&cli.StringFlag{Name: "metrics-listen", Usage: "also serve GET /metrics, without a key, on this address (e.g. 127.0.0.1:9090)"},
	&cli.StringFlag{Name: "audit-log", Usage: "JSON lines of every mutating call (default: serve/audit.log under the state root; - for none)"},
	&cli.StringFlag{Name: "audit-log-max-size", Value: "100m", Usage: "size past which the audit log is rotated to FILE.1, FILE.2, ..."},
	&cli.IntFlag{Name: "audit-log-keep", Value: 5, Usage: "how many rotated audit logs to keep"},
	&cli.StringFlag{Name: "otlp-endpoint", Usage: "send OpenTelemetry traces of requests, creates and commands to this OTLP/HTTP URL, e.g. http://127.0.0.1:4318/v1/traces (default off; OTEL_EXPORTER_OTLP_ENDPOINT also turns it on)"},
	&cli.StringSliceFlag{Name: "webhook-allow", Usage: "a destination tenants' webhooks may deliver to: CIDR, address or host name (repeatable; default none, so no webhook can be registered)"},
	&cli.StringSliceFlag{Name: "build-allow", Usage: "what the RUN steps of template builds may reach, HOST|CIDR[:PORT] as create's --allow (repeatable; default none: steps have no network); steps with one trust the host's CA certificates"},
	&cli.StringSliceFlag{Name: "build-dns", Usage: "with --build-allow: an upstream DNS server of the build steps' resolver (repeatable; default the host's)"},
	&cli.StringFlag{Name: "default-network", Value: "none", Usage: "network of a sandbox whose create asks for none: none or open"},
	&cli.StringFlag{Name: "net-rate", Usage: "limit what each sandbox with network sends, e.g. 10mbit (default unlimited; local backend as root)"},
	&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second, Usage: "how long a graceful shutdown waits for open requests"},
	&cli.IntFlag{Name: "tenant-watchers", Value: serve.DefaultTenantWatchers, Usage: "filesystem watches (WatchDir streams and watchers) one tenant may hold open at once"},
	&cli.IntFlag{Name: "sandbox-watchers", Value: serve.DefaultSandboxWatchers, Usage: "filesystem watches one sandbox may hold open at once"},
	&cli.BoolFlag{Name: "no-docker", Usage: "refuse Docker sandboxes (the docker template, any image labelled dev.hutch.docker=true): none is given what they need (docs/security.md)"},
	&cli.IntFlag{Name: "max-creates", Value: serve.DefaultMaxCreates, Usage: "sandboxes the server makes at once; more creates wait in a queue"},
	&cli.DurationFlag{Name: "create-queue-timeout", Value: serve.DefaultCreateQueueTimeout, Usage: "how long a create waits in the queue before it is answered 429 with Retry-After: 1 (which E2B's SDKs retry)"},
	&cli.StringFlag{Name: "backend", Value: backendLocal, Usage: "where sandboxes run: local (this host) or kubernetes (pods on the cluster of --kubeconfig)"},
	&cli.StringFlag{Name: "kubeconfig", Usage: "with --backend kubernetes (which it implies): the cluster to place sandboxes on as pods (its current context)"},
	&cli.StringFlag{Name: "namespace", Usage: "with --backend kubernetes: namespace of the sandboxes' pods (default: the context's, else default)"},
	&cli.StringFlag{Name: "runtime-class", Value: "hutch", Usage: "with --backend kubernetes: the pods' runtimeClassName"},
	&cli.StringSliceFlag{Name: "template", Usage: "with --backend kubernetes: NAME=IMAGE, the image a templateID's pods run (repeatable)"},
	&cli.StringSliceFlag{Name: "template-start", Usage: "with --backend kubernetes: NAME=CMD, the start command a --template's pods run at create, which answers once it is ready (repeatable; docs/templates.md)"},
	&cli.StringSliceFlag{Name: "template-ready", Usage: "with --backend kubernetes: NAME=CHECK, when a --template-start command is ready: port:PORT, url:..., file:PATH, time:D or a command (default time:1s)"},
	&cli.DurationFlag{Name: "template-ready-timeout", Value: engine.DefaultReadyTimeout, Usage: "with --backend kubernetes: how long a create waits for a --template-ready check"},
	&cli.StringFlag{Name: "image-pull-policy", Value: "IfNotPresent", Usage: "with --backend kubernetes: the pods' imagePullPolicy"},
	&cli.Float64Flag{Name: "pod-cpus", Usage: "with --backend kubernetes: CPU cores each pod requests and is limited to (default 2)"},
	&cli.StringFlag{Name: "pod-memory", Usage: "with --backend kubernetes: memory each pod requests and is limited to, e.g. 512m (default 2g)"},
	&cli.StringFlag{Name: "node-key", Usage: "with --backend kubernetes: FILE holding the key (64 hex digits) of hutch's node service on the nodes, which pause and resume need (without it they answer 501)"},
	&cli.IntFlag{Name: "node-port", Value: kubenode.Port, Usage: "with --backend kubernetes: the port of hutch's node service on each node"},
})

// The backends of --backend.
const (
	backendLocal      = "local"
	backendKubernetes = "kubernetes"
)

// kubeFlags are the flags that only the kubernetes backend takes.
var kubeFlags = []string{"kubeconfig", "namespace", "runtime-class", "template", "template-start", "template-ready", "template-ready-timeout", "image-pull-policy", "pod-cpus", "pod-memory", "node-key", "node-port"}

// backend is the backend the flags ask for: --backend, else kubernetes
// when --kubeconfig is given, else local. A flag of the kubernetes backend
// given with the local one, or the kubernetes backend without
// --kubeconfig, is a usage error naming the flag.
func backend(c *cli.Context) (string, error) {
	b := c.String("backend")
	if !c.IsSet("backend") && c.IsSet("kubeconfig") {
		b = backendKubernetes
	}
	switch b {
	case backendLocal:
		for _, f := range kubeFlags {
			if c.IsSet(f) {
				return "", fmt.Errorf("--%s places sandboxes on Kubernetes: it needs --backend kubernetes, not local", f)
			}
		}
	case backendKubernetes:
		if c.String("kubeconfig") == "" {
			return "", errors.New("--backend kubernetes needs --kubeconfig FILE, the cluster to place sandboxes on")
		}
	default:
		return "", fmt.Errorf("--backend %q: want %s or %s", b, backendLocal, backendKubernetes)
	}
	return b, nil
}

func run(c *cli.Context) error {
	if c.NArg() > 0 {
		return clix.UsageError(fmt.Errorf("serve takes no arguments, got %q", c.Args().Slice()))
	}
	src, err := applyConfig(c)
	if err != nil {
		return err
	}
	o := src.opt
	be, err := backend(c)
	if err != nil {
		return clix.UsageError(err)
	}
	level := new(slog.LevelVar)
	if err := setLogLevel(level, c.String("log-level"), c.IsSet("log-level")); err != nil {
		return clix.UsageError(fmt.Errorf("%s: %w", o("log-level"), err))
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	listen := c.String("listen")
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return clix.UsageError(fmt.Errorf("%s %q: %w", o("listen"), listen, err))
	}
	var tenants *tenant.Store
	if f := c.String("tenants"); f != "" {
		if tenants, err = tenant.Open(f); err != nil {
			return clix.UsageError(fmt.Errorf("%s: %w", o("tenants"), err))
		}
	} else {
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return clix.UsageError(fmt.Errorf("%s %q: without tenants the server takes no API keys, so it listens on loopback only", o("listen"), listen))
		}
	}
	cfg := serve.Config{
		Tenants: tenants, Domain: c.String("domain"), Listen: listen, Hosts: c.StringSlice("host"),
		Logger: log, DefaultNetwork: c.String("default-network"), AuditKeep: c.Int("audit-log-keep"),
		Watches:      serve.WatchLimits{Tenant: c.Int("tenant-watchers"), Sandbox: c.Int("sandbox-watchers")},
		WebhookAllow: c.StringSlice("webhook-allow"),
		BuildAllow:   c.StringSlice("build-allow"), BuildDNS: c.StringSlice("build-dns"),
	}
	if err := engine.ParseBuildAllow(cfg.BuildAllow, cfg.BuildDNS); err != nil {
		return clix.UsageError(fmt.Errorf("%s, %s: %w", o("build-allow"), o("build-dns"), err))
	}
	if err := checkDefaultNetwork(c.String("default-network")); err != nil {
		return clix.UsageError(fmt.Errorf("%s: %w", o("default-network"), err))
	}
	if r := c.String("net-rate"); r != "" {
		if cfg.NetRate, err = engine.ParseRate(r); err != nil {
			return clix.UsageError(fmt.Errorf("%s: %w", o("net-rate"), err))
		}
	}
	cfg.MaxCreates, cfg.CreateQueueTimeout = c.Int("max-creates"), c.Duration("create-queue-timeout")
	if cfg.CreateQueueTimeout <= 0 {
		return clix.UsageError(fmt.Errorf("%s %s: want a positive duration, e.g. 10s", o("create-queue-timeout"), cfg.CreateQueueTimeout))
	}
	for _, f := range []string{"tenant-watchers", "sandbox-watchers", "max-creates"} {
		if c.Int(f) < 1 {
			return clix.UsageError(fmt.Errorf("%s %d: want at least 1", o(f), c.Int(f)))
		}
	}
	if cfg.AuditMaxBytes, err = engine.ParseSize(c.String("audit-log-max-size")); err != nil || cfg.AuditMaxBytes < 4096 {
		return clix.UsageError(fmt.Errorf("%s %q: want a size of at least 4k, e.g. 100m", o("audit-log-max-size"), c.String("audit-log-max-size")))
	}
	if cfg.AuditKeep < 1 {
		return clix.UsageError(fmt.Errorf("%s %d: want at least 1", o("audit-log-keep"), cfg.AuditKeep))
	}
	if f := c.String("operator-key-file"); f != "" {
		key, created, err := credential.LoadAPIKey(f)
		if err != nil {
			return clix.UsageError(fmt.Errorf("%s: %w", o("operator-key-file"), err))
		}
		if created {
			log.Info("made the operator key", "file", f)
		}
		cfg.OperatorKey = key
	}
	tlsFlags, err := tlsFlags(c)
	if err != nil {
		return clix.UsageError(err)
	}
	metricsListen := c.String("metrics-listen")
	if metricsListen != "" {
		if _, _, err := net.SplitHostPort(metricsListen); err != nil {
			return clix.UsageError(fmt.Errorf("%s %q: %w", o("metrics-listen"), metricsListen, err))
		}
	}
	var root string
	if be == backendKubernetes {
		if cfg.Kube, err = kubeConfig(c, c.String("kubeconfig")); err != nil {
			return clix.UsageError(err)
		}
		if root = c.String("root"); root == "" {
			root = engine.DefaultRoot()
		}
		cfg.StateDir = filepath.Join(root, "serve")
		root = "kubernetes " + cfg.Kube.Client.Server() + " namespace " + cfg.Kube.Namespace
	} else {
		if cfg.Engine, err = clix.EngineWith(c, engine.Options{NoDocker: c.Bool("no-docker")}); err != nil {
			return err
		}
		root = cfg.Engine.Root()
		cfg.StateDir = filepath.Join(root, "serve")
	}
	if tenants == nil {
		if cfg.APIKey, err = defaultKey(c, cfg.StateDir); err != nil {
			return err
		}
		log.Warn("no --tenants: one tenant, loopback only", "api_key_file", filepath.Join(cfg.StateDir, serve.APIKeyFile))
	}
	certs, err := tlsFlags.load(c, filepath.Join(cfg.StateDir, "tls"), cfg.Domain, log)
	if err != nil {
		return clix.UsageError(err)
	}
	audit := c.String("audit-log")
	switch audit {
	case "":
		dir := cfg.StateDir
		if dir == "" {
			dir = filepath.Join(root, "serve")
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		audit = filepath.Join(dir, "audit.log")
	case "-":
		audit = ""
	}
	cfg.AuditLog = audit
	cfg.Version = system.BuildInfo().Version
	if cfg.Engine != nil {
		if cfg.Version.Runsc, err = cfg.Engine.Version(c.Context); err != nil {
			return err
		}
	}
	tp, endTracing, err := tracing(c.Context, c.String("otlp-endpoint"), o("otlp-endpoint"), cfg.Version.Version, log)
	if err != nil {
		return clix.UsageError(err)
	}
	defer endTracing()
	if tp != nil {
		cfg.Tracer = tp
	}
	srv, err := serve.New(cfg)
	if err != nil {
		return clix.UsageError(err)
	}
	defer srv.Close()
	srv.SetConsole(console.New(console.Config{API: srv.Routes(), Secure: certs != nil, Domain: cfg.Domain, Logger: log}))
	if n, err := srv.Recover(c.Context, 3*time.Second); err != nil {
		return err
	} else if n > 0 {
		log.Info("removed sandboxes a previous server left dead or half-created", "count", n)
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := srv.HTTPServer()
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	live := newLiveConfig(c, src, level, tenants, srv, log)
	go reloadOnHangup(ctx, certs, live, log)
	errc := make(chan error, 2)
	scheme := "http"
	if certs != nil {
		scheme = "https"
		hs.TLSConfig = certs.Config()
		go func() { errc <- hs.ServeTLS(srv.Listener(l), "", "") }()
	} else {
		go func() { errc <- hs.Serve(srv.Listener(l)) }()
	}
	if metricsListen != "" {
		ml, err := net.Listen("tcp", metricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", srv.MetricsHandler())
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 90 * time.Second}
		defer ms.Close()
		go func() { errc <- ms.Serve(ml) }()
		log.Info("serving /metrics without a key", "listen", ml.Addr().String())
	}
	// Under systemd (Type=notify), the unit is started once the
	// listener accepts: a client that waited for systemctl start is
	// answered.
	notify(log, daemon.SdNotifyReady, "STATUS=serving on "+l.Addr().String())
	log.Info("serving", "version", cfg.Version.Version, "commit", cfg.Version.Commit, "runsc", cfg.Version.Runsc, "listen", l.Addr().String(), "scheme", scheme, "domain", c.String("domain"), "root", root, "tenants", c.String("tenants"))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	notify(log, daemon.SdNotifyStopping, "STATUS=shutting down")
	log.Info("shutting down: open requests may finish; sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), c.Duration("shutdown-timeout"))
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// defaultKey is the API key of a server without tenants, in dir: made on
// the first start, and then printed once, with where to read it again.
func defaultKey(c *cli.Context, dir string) (string, error) {
	path := filepath.Join(dir, serve.APIKeyFile)
	key, created, err := credential.LoadAPIKey(path)
	if err != nil {
		return "", fmt.Errorf("the API key of a server without --tenants: %w", err)
	}
	if created {
		fmt.Fprintf(c.App.ErrWriter, "hutch serve: every call needs this API key (X-API-Key, E2B_API_KEY; or Authorization: Bearer):\n\n    %s\n\nIt is shown only now; read it again with: cat %s\n\n", key, path)
	}
	return key, nil
}

// kubeConfig is the Kubernetes placement the flags ask for.
func kubeConfig(c *cli.Context, path string) (*kubeplace.Config, error) {
	client, ns, err := kube.Load(path)
	if err != nil {
		return nil, err
	}
	if c.IsSet("namespace") {
		ns = c.String("namespace")
	}
	kc := &kubeplace.Config{
		Client: client, Namespace: ns, RuntimeClass: c.String("runtime-class"),
		PullPolicy: c.String("image-pull-policy"), Templates: map[string]string{},
		CPUs: c.Float64("pod-cpus"),
	}
	if m := c.String("pod-memory"); m != "" {
		if kc.Memory, err = engine.ParseSize(m); err != nil {
			return nil, fmt.Errorf("--pod-memory %q: %w", m, err)
		}
	}
	for _, t := range c.StringSlice("template") {
		name, image, ok := strings.Cut(t, "=")
		if !ok || name == "" || image == "" {
			return nil, fmt.Errorf("--template %q: want NAME=IMAGE", t)
		}
		kc.Templates[name] = image
	}
	if len(kc.Templates) == 0 {
		return nil, errors.New("--backend kubernetes: give at least one --template NAME=IMAGE (the image a templateID's pods run)")
	}
	if kc.Starts, err = templateStarts(kc.Templates, c.StringSlice("template-start"), c.StringSlice("template-ready")); err != nil {
		return nil, err
	}
	d := c.Duration("template-ready-timeout")
	if d <= 0 {
		return nil, fmt.Errorf("--template-ready-timeout %s: want a positive duration", d)
	}
	for _, t := range kc.Starts {
		t.Timeout = d
	}
	if f := c.String("node-key"); f != "" {
		key, err := kubenode.ReadKeyFile(f)
		if err != nil {
			return nil, fmt.Errorf("--node-key: %w", err)
		}
		if p := c.Int("node-port"); p <= 0 || p > 65535 {
			return nil, fmt.Errorf("--node-port %d: want a port of 1-65535", p)
		}
		kc.Nodes = &kubenode.Client{Key: key, Port: c.Int("node-port")}
	}
	return kc, nil
}

// templateStarts are the start commands and ready checks of the flags,
// by template; each names a --template.
func templateStarts(templates map[string]string, starts, readies []string) (map[string]*engine.Template, error) {
	out := map[string]*engine.Template{}
	for _, f := range starts {
		name, cmd, ok := strings.Cut(f, "=")
		if !ok || name == "" || strings.TrimSpace(cmd) == "" {
			return nil, fmt.Errorf("--template-start %q: want NAME=CMD", f)
		}
		if _, ok := templates[name]; !ok {
			return nil, fmt.Errorf("--template-start %q: no --template %s=IMAGE", f, name)
		}
		out[name] = &engine.Template{Start: cmd, Ready: engine.ReadyCheck{Kind: "time", Wait: time.Second}, Timeout: engine.DefaultReadyTimeout}
	}
	for _, f := range readies {
		name, check, ok := strings.Cut(f, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--template-ready %q: want NAME=CHECK", f)
		}
		t := out[name]
		if t == nil {
			return nil, fmt.Errorf("--template-ready %q: no --template-start %s=CMD to wait for", f, name)
		}
		rc, err := engine.ParseReadyCheck(check)
		if err != nil {
			return nil, fmt.Errorf("--template-ready %q: %w", f, err)
		}
		t.Ready = rc
	}
	return out, nil
}

// notify tells the service manager the server's state (sd_notify(3)),
// when $NOTIFY_SOCKET names one; without it, it does nothing.
func notify(log *slog.Logger, states ...string) {
	if _, err := daemon.SdNotify(false, strings.Join(states, "\n")); err != nil {
		log.Warn("could not notify the service manager", "socket", os.Getenv("NOTIFY_SOCKET"), "error", err)
	}
}
