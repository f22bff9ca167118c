// Package mcp is `sbx mcp`: the sandbox tools of sbx.dev/sbx/mcp served to
// an agent over stdio or streamable HTTP.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v2"

	"sbx.dev/sbx/cmd/sbx/commands/clix"
	"sbx.dev/sbx/cmd/sbx/commands/system"
	sbxmcp "sbx.dev/sbx/mcp"
)

// Command is `sbx mcp`.
var Command = &cli.Command{
	Name:  "mcp",
	Usage: "serve sandbox tools to an agent over the Model Context Protocol",
	Description: `An MCP client (Claude Code, Claude Desktop, Cursor, VS Code...) starts
'sbx mcp' and talks to it on stdin/stdout; with --transport http it serves
streamable HTTP at http://ADDR/mcp on a loopback address. The server manages
only the sandboxes it created, gives each a lifetime (--default-timeout),
and copies files to and from the host only inside --allow-host-dir.
See docs/mcp.md.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "transport", Value: "stdio", Usage: "stdio or http"},
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8931", Usage: "with --transport http: loopback address to listen on"},
		&cli.StringFlag{Name: "allow-host-dir", Usage: "host directory that upload_file and download_file may use (default: none, the tools are off)"},
		&cli.DurationFlag{Name: "default-timeout", Value: sbxmcp.DefaultLifetime, Usage: "lifetime of a sandbox whose create names none; then it is removed"},
		&cli.DurationFlag{Name: "command-timeout", Value: sbxmcp.DefaultCommandTimeout, Usage: "timeout of a command whose call names none"},
		&cli.StringFlag{Name: "owner", Usage: "owner label of this server's sandboxes (default: new for each server); a stable name lets a restarted server manage the sandboxes of the one before"},
		&cli.BoolFlag{Name: "all-sandboxes", Usage: "manage every sandbox of the state root, not only this server's"},
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
	listen := c.String("listen")
	if transport == "http" {
		if err := checkLoopback(listen); err != nil {
			return clix.UsageError(err)
		}
	}
	level := slog.LevelInfo
	if c.String("log-level") == "debug" {
		level = slog.LevelDebug
	}
	// stdout carries the protocol on stdio: the log goes to stderr.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	eng, err := clix.Engine(c)
	if err != nil {
		return err
	}
	srv, err := sbxmcp.New(sbxmcp.Config{
		Engine:          eng,
		Owner:           c.String("owner"),
		AllSandboxes:    c.Bool("all-sandboxes"),
		HostDir:         c.String("allow-host-dir"),
		DefaultLifetime: c.Duration("default-timeout"),
		CommandTimeout:  c.Duration("command-timeout"),
		Version:         system.Version(),
		Logger:          log,
	})
	if err != nil {
		return clix.UsageError(err)
	}
	defer srv.Close()
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("serving MCP", "transport", transport, "owner", srv.Owner(), "root", eng.Root(), "host_dir", c.String("allow-host-dir"))
	if transport == "stdio" {
		err := srv.MCP().Run(ctx, &sdk.StdioTransport{})
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	return serveHTTP(ctx, srv, listen, log)
}

// checkLoopback refuses a listen address off loopback: the HTTP endpoint
// takes no credentials, and its tools run code.
func checkLoopback(listen string) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--listen %q: the MCP endpoint takes no credentials, so it listens on loopback only", listen)
	}
	return nil
}

func serveHTTP(ctx context.Context, srv *sbxmcp.Server, listen string, log *slog.Logger) error {
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv.MCP() }, &sdk.StreamableHTTPOptions{
		Logger:         log,
		SessionTimeout: time.Hour,
	})
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	log.Info("listening", "url", "http://"+l.Addr().String()+"/mcp")
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
