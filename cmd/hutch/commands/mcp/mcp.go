// Package mcp is `hutch mcp`: the sandbox tools of hutch.dev/hutch/mcp served to
// an agent over stdio or streamable HTTP.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/cmd/hutch/commands/system"
	"hutch.dev/hutch/engine"
	hutchmcp "hutch.dev/hutch/mcp"
)

// Command is `hutch mcp`.
var Command = &cli.Command{
	Name:  "mcp",
	Usage: "serve sandbox tools to an agent over the Model Context Protocol",
	Description: `An MCP client (Claude Code, Claude Desktop, Cursor, VS Code...) starts
'hutch mcp' and talks to it on stdin/stdout; with --transport http it serves
streamable HTTP at http://ADDR/mcp on a loopback address, where each request
must carry the bearer token it prints (kept in ROOT/mcp/token), or on a UNIX
socket (--listen unix) that only this user and root may use. The server manages
only the sandboxes it created, gives each a lifetime (--default-timeout),
and copies files to and from the host only inside --allow-host-dir.
With --server URL the sandboxes are those of a remote 'hutch serve' (or
another server of E2B's API), as the tenant of --api-key; no engine runs
on this host. See docs/mcp.md.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "transport", Value: "stdio", Usage: "stdio or http"},
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8931", Usage: "with --transport http: loopback HOST:PORT (requests need the bearer token), or unix[:PATH] for a UNIX socket of this user's (default PATH: ROOT/mcp/mcp.sock)"},
		&cli.StringFlag{Name: "allow-host-dir", Usage: "host directory that upload_file and download_file may use (default: none, the tools are off)"},
		&cli.DurationFlag{Name: "default-timeout", Value: hutchmcp.DefaultLifetime, Usage: "lifetime of a sandbox whose create names none; then it is removed"},
		&cli.DurationFlag{Name: "command-timeout", Value: hutchmcp.DefaultCommandTimeout, Usage: "timeout of a command whose call names none"},
		&cli.StringFlag{Name: "owner", Usage: "owner label of this server's sandboxes (default: new for each server); a stable name lets a restarted server manage the sandboxes of the one before"},
		&cli.BoolFlag{Name: "all-sandboxes", Usage: "manage every sandbox of the state root (or of the --server tenant), not only this server's"},
		&cli.StringFlag{Name: "server", Usage: "URL of a remote `hutch serve` whose sandboxes the tools use instead of this host's, e.g. http://hutch.example.test:3000"},
		&cli.StringFlag{Name: "api-key", EnvVars: []string{"E2B_API_KEY"}, Usage: "with --server: the tenant's API key (from `hutch tenant add`; for a server without tenants, its serve/api.key)"},
	},
	Action: run,
}

func run(c *cli.Context) error {
	if c.NArg() > 0 {
		return clix.UsageError(fmt.Errorf("mcp takes no arguments, got %q", c.Args().Slice()))
	}
	transport := c.String("transport")
	if transport != "stdio" && transport != "http" {
		return clix.UsageError(fmt.Errorf("--transport %q: want stdio or http", transport))
	}
	var listen listenAddr
	if transport == "http" {
		var err error
		if listen, err = parseListen(c.String("listen")); err != nil {
			return clix.UsageError(err)
		}
	}
	level := slog.LevelInfo
	if c.String("log-level") == "debug" {
		level = slog.LevelDebug
	}
	// stdout carries the protocol on stdio: the log goes to stderr.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg := hutchmcp.Config{
		Owner:           c.String("owner"),
		AllSandboxes:    c.Bool("all-sandboxes"),
		HostDir:         c.String("allow-host-dir"),
		DefaultLifetime: c.Duration("default-timeout"),
		CommandTimeout:  c.Duration("command-timeout"),
		Version:         system.Version(),
		Logger:          log,
	}
	var err error
	var where []any
	if server := c.String("server"); server != "" {
		if cfg.Remote, err = remoteClient(server, c.String("api-key")); err != nil {
			return clix.UsageError(err)
		}
		where = append(where, "server", cfg.Remote.APIURL)
		hctx, cancel := context.WithTimeout(c.Context, 5*time.Second)
		if err := cfg.Remote.Health(hctx); err != nil {
			log.Warn("the server does not answer GET /health: tool calls will fail until it does", "server", cfg.Remote.APIURL, "err", err)
		}
		cancel()
	} else {
		if cfg.Engine, err = clix.Engine(c); err != nil {
			return err
		}
		where = append(where, "root", cfg.Engine.Root())
	}
	var stateDir string
	if transport == "http" {
		root := c.String("root")
		if cfg.Engine != nil {
			root = cfg.Engine.Root()
		}
		if stateDir, err = engine.StateDir(root, "mcp"); err != nil {
			return err
		}
	}
	srv, err := hutchmcp.New(cfg)
	if err != nil {
		return clix.UsageError(err)
	}
	defer srv.Close()
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("serving MCP", append([]any{"transport", transport, "owner", srv.Owner(), "host_dir", c.String("allow-host-dir")}, where...)...)
	if transport == "stdio" {
		err := srv.MCP().Run(ctx, &sdk.StdioTransport{})
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	return serveHTTP(ctx, srv, listen, stateDir, log)
}

// remoteClient is the client of --server with --api-key. The URL must be
// http or https with a host and nothing after it but a path prefix.
func remoteClient(server, key string) (*client.Client, error) {
	u, err := url.Parse(server)
	if err != nil {
		return nil, fmt.Errorf("--server %q: %w", server, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("--server %q: want the server's base URL, http://HOST:PORT or https://HOST", server)
	}
	// Every hutch serve needs a key (one without tenants, the one in
	// serve/api.key under its state root); without one the server
	// answers each call with a message naming the missing key.
	return &client.Client{APIURL: strings.TrimRight(u.String(), "/"), APIKey: key}, nil
}
