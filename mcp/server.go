// Package mcp is `hutch mcp`: sandbox tools for agents over the Model
// Context Protocol. A Server turns tool calls (create a sandbox, run a
// command or code, read and write files, copy to and from one host
// directory, background processes and their logs, published ports,
// snapshots, pause and resume) into calls of engine's public Go API, and
// their results and errors into tool results a model can read. With a
// client of a remote `hutch serve` instead of an engine, the same tools act
// on that server's sandboxes of one tenant.
//
// It owns the policy of a server that an agent drives: it manages only the
// sandboxes it labelled as its own (unless told to manage all), touches no
// host path outside the one directory the user allowed, and gives every
// sandbox a lifetime so that abandoned ones are removed. It parses no
// flags and serves no transport itself: cmd/hutch/commands/mcp does.
package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/containerd/errdefs"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/engine"
)

// OwnerLabel is the label that marks a sandbox as one a server manages;
// its value is the server's Config.Owner.
const OwnerLabel = "hutch.mcp/owner"

// Defaults of Config.
const (
	DefaultLifetime       = 30 * time.Minute
	DefaultCommandTimeout = 2 * time.Minute
	DefaultMaxOutput      = 32 << 10
)

// Limits on what a tool call may ask for.
const (
	maxLifetime       = 24 * time.Hour
	maxCommandTimeout = time.Hour
	maxReadBytes      = 4 << 20
	defaultReadBytes  = 256 << 10
	defaultLogLines   = 200
)

// Config is what a Server serves.
type Config struct {
	// Engine runs the sandboxes on this host. It needs a
	// WatchdogCommand: every sandbox gets a lifetime. Exactly one of
	// Engine and Remote is set.
	Engine *engine.Engine
	// Remote is a client of a remote `hutch serve` (or any server of E2B's
	// API) whose tenant's sandboxes the tools manage instead: templates
	// are the server's images, the owner is the sandboxes' OwnerLabel
	// metadata, and lifetimes are the server's timeouts.
	Remote *client.Client
	// Owner is the value of OwnerLabel on the sandboxes the server
	// creates. Empty: "mcp-" and a random ID, new for each server. A
	// stable name lets a restarted server manage the sandboxes of the
	// one before.
	Owner string
	// AllSandboxes lets the server see and manage every sandbox of the
	// engine (or of the remote tenant), not only its own.
	AllSandboxes bool
	// HostDir is the one host directory that upload_file and
	// download_file may touch; empty turns them off.
	HostDir string
	// DefaultLifetime is the lifetime of a sandbox whose create names
	// none (0: DefaultLifetime). When it ends the sandbox is removed.
	DefaultLifetime time.Duration
	// CommandTimeout is the timeout of a command whose call names none
	// (0: DefaultCommandTimeout).
	CommandTimeout time.Duration
	// MaxOutput is how many bytes of each of a command's stdout and
	// stderr a result keeps (0: DefaultMaxOutput); the middle of longer
	// output is cut, with a note.
	MaxOutput int
	// Version is the server's version, as told to clients.
	Version string
	// Logger receives the server's own log; nil discards it.
	Logger *slog.Logger
}

// Server serves hutch's sandbox tools.
type Server struct {
	cfg     Config
	be      backend
	hostDir *hostDir
	log     *slog.Logger
	mcp     *sdk.Server
}

// New checks cfg and makes a server with every tool.
func New(cfg Config) (*Server, error) {
	if (cfg.Engine == nil) == (cfg.Remote == nil) {
		return nil, fmt.Errorf("mcp: want an engine or a remote server, exactly one: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Remote != nil && cfg.Remote.APIURL == "" {
		return nil, fmt.Errorf("mcp: the remote server has no URL: %w", errdefs.ErrInvalidArgument)
	}
	hd, err := newHostDir(cfg.HostDir)
	if err != nil {
		return nil, err
	}
	if cfg.DefaultLifetime == 0 {
		cfg.DefaultLifetime = DefaultLifetime
	}
	if cfg.DefaultLifetime < 0 || cfg.DefaultLifetime > maxLifetime {
		return nil, fmt.Errorf("default lifetime %s: want more than 0 and at most %s: %w", cfg.DefaultLifetime, maxLifetime, errdefs.ErrInvalidArgument)
	}
	if cfg.CommandTimeout == 0 {
		cfg.CommandTimeout = DefaultCommandTimeout
	}
	if cfg.CommandTimeout < 0 {
		return nil, fmt.Errorf("command timeout %s: must be positive: %w", cfg.CommandTimeout, errdefs.ErrInvalidArgument)
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	if cfg.Owner == "" {
		b := make([]byte, 6)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		cfg.Owner = "mcp-" + hex.EncodeToString(b)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, hostDir: hd, log: log}
	if cfg.Engine != nil {
		s.be = newEngineBackend(s, cfg.Engine)
	} else {
		s.be = newRemoteBackend(s, cfg.Remote)
	}
	s.mcp = sdk.NewServer(&sdk.Implementation{Name: "hutch", Title: "hutch sandboxes", Version: cfg.Version}, &sdk.ServerOptions{
		Instructions: instructions,
		Logger:       log,
	})
	s.addTools()
	return s, nil
}

// instructions tell a model what the server is for.
const instructions = `hutch runs code in disposable Linux sandboxes isolated by gVisor.
Start with create_sandbox and keep its sandbox_id; then run_command, run_code,
write_file, read_file and the other tools act inside that sandbox. Sandboxes
have no network unless created with one, and are removed when their lifetime
ends. Remove a sandbox with remove_sandbox when you are done with it.`

// MCP is the protocol server, for a transport to serve.
func (s *Server) MCP() *sdk.Server { return s.mcp }

// Owner is the value of OwnerLabel on this server's sandboxes.
func (s *Server) Owner() string { return s.cfg.Owner }

// Close ends the server's port forwards and output streams. Sandboxes
// keep running until their lifetime ends.
func (s *Server) Close() {
	s.be.close()
	s.hostDir.close()
}

// checkRef refuses an empty sandbox_id.
func checkRef(ref string) error {
	if ref == "" {
		return fmt.Errorf("sandbox_id is empty: pass the sandbox_id that create_sandbox returned: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// unknownSandbox is the error for a sandbox_id the server does not
// manage: another's sandbox is missing too, from this server's view.
func unknownSandbox(ref string) error {
	return fmt.Errorf("no sandbox %q among this server's sandboxes (list_sandboxes lists them): %w", ref, errdefs.ErrNotFound)
}

// isDirError is read_file's error for a directory.
func isDirError(path string) error {
	return fmt.Errorf("%s is a directory: list it with list_files: %w", path, errdefs.ErrInvalidArgument)
}

// manages says whether the server may act on a sandbox with these labels
// (or metadata).
func (s *Server) manages(labels map[string]string) bool {
	return s.cfg.AllSandboxes || labels[OwnerLabel] == s.cfg.Owner
}

// toolError makes err a message for the model: engine errors already say
// what went wrong; context ends are said plainly.
func toolError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("the call was cancelled: %w", err)
	}
	return err
}
