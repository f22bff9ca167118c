// Package serve is `sbx serve`: the E2B-compatible API server.
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

	"github.com/urfave/cli/v2"

	"sbx.dev/sbx/cmd/sbx/commands/clix"
	"sbx.dev/sbx/engine"
	"sbx.dev/sbx/policy"
	"sbx.dev/sbx/serve"
	"sbx.dev/sbx/serve/kube"
	"sbx.dev/sbx/serve/tenant"
)

// Command is `sbx serve`.
var Command = &cli.Command{
	Name:  "serve",
	Usage: "serve E2B's API (REST control plane and envd data plane) over this host's sandboxes",
	Description: `Without --tenants the server has one tenant, takes no API keys and listens
on loopback only. With --tenants FILE (made with 'sbx tenant add') every call
needs a tenant's key in X-API-Key, and each tenant sees only its own
sandboxes and snapshots. See docs/api.md.

With --kubeconfig FILE the server runs no sandbox on this host: each one is
a pod with runtimeClassName sbx on the cluster, which the cluster's
scheduler places; --template NAME=IMAGE maps E2B templateIDs to the images
the pods run. See "Placing sandboxes on Kubernetes" in docs/api.md.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:3000", Usage: "address to listen on"},
		&cli.StringFlag{Name: "tenants", Usage: "tenants file with hashed API keys and quotas (sbx tenant add)", EnvVars: []string{"SBX_TENANTS"}},
		&cli.StringFlag{Name: "domain", Value: "localhost", Usage: "domain of sandbox hosts: PORT-SANDBOXID.DOMAIN (E2B_DOMAIN)"},
		&cli.StringFlag{Name: "audit-log", Usage: "JSON lines of every mutating call (default: serve/audit.log under the state root; - for none)"},
		&cli.StringFlag{Name: "default-network", Value: "none", Usage: "network of a sandbox whose create asks for none: none or open"},
		&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second, Usage: "how long a graceful shutdown waits for open requests"},
		&cli.StringFlag{Name: "kubeconfig", Usage: "place sandboxes on this Kubernetes cluster as pods (its current context) instead of on this host"},
		&cli.StringFlag{Name: "namespace", Usage: "with --kubeconfig: namespace of the sandboxes' pods (default: the context's, else default)"},
		&cli.StringFlag{Name: "runtime-class", Value: "sbx", Usage: "with --kubeconfig: the pods' runtimeClassName"},
		&cli.StringSliceFlag{Name: "template", Usage: "with --kubeconfig: NAME=IMAGE, the image a templateID's pods run (repeatable)"},
		&cli.StringFlag{Name: "image-pull-policy", Value: "IfNotPresent", Usage: "with --kubeconfig: the pods' imagePullPolicy"},
		&cli.Float64Flag{Name: "pod-cpus", Usage: "with --kubeconfig: CPU cores each pod requests and is limited to (default 2)"},
		&cli.StringFlag{Name: "pod-memory", Usage: "with --kubeconfig: memory each pod requests and is limited to, e.g. 512m (default 2g)"},
	},
	Action: run,
}

func run(c *cli.Context) error {
	if c.NArg() > 0 {
		return clix.UsageError(fmt.Errorf("serve takes no arguments, got %q", c.Args().Slice()))
	}
	level := slog.LevelInfo
	if c.String("log-level") == "debug" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	listen := c.String("listen")
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return clix.UsageError(fmt.Errorf("--listen %q: %w", listen, err))
	}
	var tenants *tenant.Store
	if f := c.String("tenants"); f != "" {
		if tenants, err = tenant.Open(f); err != nil {
			return clix.UsageError(err)
		}
	} else {
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return clix.UsageError(fmt.Errorf("--listen %q: without --tenants the server takes no API keys, so it listens on loopback only", listen))
		}
		log.Warn("no --tenants: one tenant, no API keys, loopback only")
	}
	cfg := serve.Config{
		Tenants: tenants, Domain: c.String("domain"),
		Logger: log, DefaultNetwork: c.String("default-network"),
	}
	var root string
	if kc := c.String("kubeconfig"); kc != "" {
		if cfg.Kube, err = kubeConfig(c, kc); err != nil {
			return clix.UsageError(err)
		}
		if root = c.String("root"); root == "" {
			root = engine.DefaultRoot()
		}
		cfg.StateDir = filepath.Join(root, "serve")
		root = "kubernetes " + cfg.Kube.Client.Server() + " namespace " + cfg.Kube.Namespace
	} else {
		for _, f := range []string{"namespace", "template"} {
			if c.IsSet(f) {
				return clix.UsageError(fmt.Errorf("--%s places sandboxes on Kubernetes: give --kubeconfig too", f))
			}
		}
		if cfg.Engine, err = clix.Engine(c); err != nil {
			return err
		}
		root = cfg.Engine.Root()
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
	srv, err := serve.New(cfg)
	if err != nil {
		return clix.UsageError(err)
	}
	defer srv.Close()
	if n, err := srv.Recover(c.Context, 3*time.Second); err != nil {
		return err
	} else if n > 0 {
		log.Info("removed sandboxes a previous server left dead or half-created", "count", n)
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	log.Info("serving", "listen", l.Addr().String(), "domain", c.String("domain"), "root", root, "tenants", c.String("tenants"))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: open requests may finish; sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), c.Duration("shutdown-timeout"))
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// kubeConfig is the Kubernetes placement the flags ask for.
func kubeConfig(c *cli.Context, path string) (*serve.KubeConfig, error) {
	client, ns, err := kube.Load(path)
	if err != nil {
		return nil, err
	}
	if c.IsSet("namespace") {
		ns = c.String("namespace")
	}
	kc := &serve.KubeConfig{
		Client: client, Namespace: ns, RuntimeClass: c.String("runtime-class"),
		PullPolicy: c.String("image-pull-policy"), Templates: map[string]string{},
		CPUs: c.Float64("pod-cpus"),
	}
	if m := c.String("pod-memory"); m != "" {
		if kc.Memory, err = policy.ParseSize(m); err != nil {
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
		return nil, fmt.Errorf("--kubeconfig: give at least one --template NAME=IMAGE (the image a templateID's pods run)")
	}
	return kc, nil
}
