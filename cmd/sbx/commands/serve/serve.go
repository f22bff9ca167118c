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
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"sbx.dev/sbx/cmd/sbx/commands/clix"
	"sbx.dev/sbx/serve"
	"sbx.dev/sbx/serve/tenant"
)

// Command is `sbx serve`.
var Command = &cli.Command{
	Name:  "serve",
	Usage: "serve E2B's API (REST control plane and envd data plane) over this host's sandboxes",
	Description: `Without --tenants the server has one tenant, takes no API keys and listens
on loopback only. With --tenants FILE (made with 'sbx tenant add') every call
needs a tenant's key in X-API-Key, and each tenant sees only its own
sandboxes and snapshots. See docs/api.md.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:3000", Usage: "address to listen on"},
		&cli.StringFlag{Name: "tenants", Usage: "tenants file with hashed API keys and quotas (sbx tenant add)", EnvVars: []string{"SBX_TENANTS"}},
		&cli.StringFlag{Name: "domain", Value: "localhost", Usage: "domain of sandbox hosts: PORT-SANDBOXID.DOMAIN (E2B_DOMAIN)"},
		&cli.StringFlag{Name: "audit-log", Usage: "JSON lines of every mutating call (default: serve/audit.log under the state root; - for none)"},
		&cli.StringFlag{Name: "default-network", Value: "none", Usage: "network of a sandbox whose create asks for none: none or open"},
		&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second, Usage: "how long a graceful shutdown waits for open requests"},
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
	eng, err := clix.Engine(c)
	if err != nil {
		return err
	}
	audit := c.String("audit-log")
	switch audit {
	case "":
		dir := filepath.Join(eng.Root(), "serve")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		audit = filepath.Join(dir, "audit.log")
	case "-":
		audit = ""
	}
	srv, err := serve.New(serve.Config{
		Engine: eng, Tenants: tenants, Domain: c.String("domain"), AuditLog: audit,
		Logger: log, DefaultNetwork: c.String("default-network"),
	})
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
	log.Info("serving", "listen", l.Addr().String(), "domain", c.String("domain"), "root", eng.Root(), "tenants", c.String("tenants"))
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
