package mcp

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hutch.dev/hutch/engine"
)

// Tool names.
const (
	toolCreate  = "create_sandbox"
	toolRun     = "run_command"
	toolRunCode = "run_code"
	// toolCreateContext and toolRestartContext act on the code
	// interpreter's contexts (tools_code.go).
	toolCreateContext  = "create_code_context"
	toolRestartContext = "restart_code_context"
	toolRead           = "read_file"
	toolWrite          = "write_file"
	toolList           = "list_files"
	toolRemoveFile     = "remove_file"
	toolUpload         = "upload_file"
	toolDownload       = "download_file"
	toolStart          = "start_process"
	toolLogs           = "read_logs"
	toolExpose         = "expose_port"
	toolSnapshot       = "snapshot_sandbox"
	toolPause          = "pause_sandbox"
	toolResume         = "resume_sandbox"
	toolSandboxes      = "list_sandboxes"
	toolRemove         = "remove_sandbox"
)

// sandboxArg is the argument every tool on one sandbox takes.
type sandboxArg struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox_id that create_sandbox returned"`
}

var (
	yes = true
	no  = false
)

// addTools registers every tool.
func (s *Server) addTools() {
	add(s, &sdk.Tool{Name: toolCreate, Title: "Create a sandbox",
		Description: "Create and start a new isolated Linux sandbox (a gVisor container) and return its sandbox_id, which the other tools take. " +
			"The default image is Debian with Python 3, Node.js, bash and git (the first create on a host builds it, which takes about a minute). " +
			"The sandbox has no network unless network is \"open\" (any destination) or \"allow\" (only the destinations in allow). " +
			"It is removed automatically when its lifetime ends.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, map[string][]any{"network": {"none", "open", "allow"}}, s.create)
	add(s, &sdk.Tool{Name: toolRun, Title: "Run a shell command",
		Description: "Run a shell command (with /bin/sh -c) in a sandbox and wait for it. Returns its exit code, stdout and stderr. " +
			"A non-zero exit code is a normal result, not an error. The command is killed when its timeout passes (exit code 124, timed_out true). " +
			"Long output keeps its beginning and end with a note saying how many bytes were cut from the middle; redirect to a file and use read_file for all of it. " +
			"For servers and other long-running commands use start_process.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
	}, nil, s.runCommand)
	add(s, &sdk.Tool{Name: toolRunCode, Title: "Run code",
		Description: "Run code in a sandbox. In a sandbox of image code-interpreter-v1 the code runs in a context of its code interpreter (a Jupyter kernel for python, Node for javascript and typescript, a shell for bash) " +
			"whose variables, imports and functions last between calls: one context per sandbox and language, or the context_id of create_code_context. " +
			"It returns stdout, stderr, the values the code displayed or ended with (text; matplotlib figures come back as images, pandas DataFrames as text tables) and the exception it raised, if any (exit_code 1). " +
			"In a sandbox of another image the code is fed to a fresh python3, node or bash, nothing is kept (stateful false), and the exit code is the interpreter's.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
	}, map[string][]any{"language": {"python", "javascript", "node", "typescript", "bash"}}, s.runCode)
	add(s, &sdk.Tool{Name: toolCreateContext, Title: "Create a code context",
		Description: "Start a new context of a sandbox's code interpreter (image code-interpreter-v1): its own interpreter of language, working in cwd, with its own variables. Returns its context_id for run_code.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, map[string][]any{"language": {"python", "javascript", "node", "typescript", "bash"}}, s.createCodeContext)
	add(s, &sdk.Tool{Name: toolRestartContext, Title: "Restart a code context",
		Description: "Restart a context of a sandbox's code interpreter: its interpreter starts again, in the same directory, with none of its variables.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
	}, nil, s.restartCodeContext)
	add(s, &sdk.Tool{Name: toolRead, Title: "Read a file",
		Description: "Read a file in a sandbox. Text comes back as it is; a file that is not UTF-8 text comes back base64-encoded (encoding \"base64\"). " +
			"At most max_bytes are returned (default 262144), with truncated true if the file is longer.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, nil, s.readFile)
	add(s, &sdk.Tool{Name: toolWrite, Title: "Write a file",
		Description: "Create or replace a file in a sandbox with the given content; missing parent directories are created. " +
			"Content is UTF-8 text, or base64 with encoding \"base64\" for binary data.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &no},
	}, map[string][]any{"encoding": {"utf8", "base64"}}, s.writeFile)
	add(s, &sdk.Tool{Name: toolList, Title: "List a directory",
		Description: "List the entries of a directory in a sandbox: name, type (file, dir, symlink or other), size, permissions and modification time.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, nil, s.listFiles)
	add(s, &sdk.Tool{Name: toolRemoveFile, Title: "Remove a file",
		Description: "Remove a file or an empty directory in a sandbox; with recursive true, a directory and everything in it.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
	}, nil, s.removeFile)
	add(s, &sdk.Tool{Name: toolUpload, Title: "Upload from the host",
		Description: "Copy a file or directory from the host into a sandbox. The host path must be inside the one host directory the user allowed (relative paths are taken from it); " +
			"without such a directory the tool is off. If path is an existing directory in the sandbox the copy goes inside it under its own name.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
	}, nil, s.upload)
	add(s, &sdk.Tool{Name: toolDownload, Title: "Download to the host",
		Description: "Copy a file or directory from a sandbox to the host. The host path must be inside the one host directory the user allowed (relative paths are taken from it); " +
			"without such a directory the tool is off. If host_path is an existing directory the copy goes inside it under its own name.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
	}, nil, s.download)
	add(s, &sdk.Tool{Name: toolStart, Title: "Start a background process",
		Description: "Start a shell command (with /bin/sh -c) in the background in a sandbox, for servers and other long-running work, and return its pid at once. " +
			"Its stdout and stderr go to the sandbox's log: read them with read_logs. Background processes survive pause and resume.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
	}, nil, s.startProcess)
	add(s, &sdk.Tool{Name: toolLogs, Title: "Read the sandbox log",
		Description: "Read the last lines of a sandbox's log: the output of its background processes (start_process), one line each as \"TIMESTAMP PID TEXT\". " +
			"Give pid to see one process only.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, nil, s.readLogs)
	add(s, &sdk.Tool{Name: toolExpose, Title: "Expose a port",
		Description: "Make a TCP port that a program listens on inside a sandbox reachable from the host, and return its URL on 127.0.0.1. " +
			"Works with every network mode. The forward lasts until the sandbox is paused, stopped or removed, or this server exits; expose the port again after resume_sandbox. " +
			"When this server uses a remote hutch server, the URL is that server's for the port, with the headers that route a request to it.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, nil, s.exposePort)
	add(s, &sdk.Tool{Name: toolSnapshot, Title: "Snapshot a sandbox",
		Description: "Save a running sandbox's filesystem as an image, and return the image's name: pass it as image to create_sandbox to start new sandboxes from that state. " +
			"The sandbox keeps running.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, nil, s.snapshot)
	add(s, &sdk.Tool{Name: toolPause, Title: "Pause a sandbox",
		Description: "Pause a sandbox: its memory, processes and files are saved to disk and it stops using CPU and memory until resume_sandbox. A paused sandbox has no lifetime running.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, nil, s.pause)
	add(s, &sdk.Tool{Name: toolResume, Title: "Resume a sandbox",
		Description: "Resume a paused sandbox where it left off, with its processes; its lifetime starts again.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
	}, nil, s.resume)
	add(s, &sdk.Tool{Name: toolSandboxes, Title: "List sandboxes",
		Description: "List the sandboxes this server manages, with their state (running, paused or stopped), image, network and when their lifetime ends.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: &no},
	}, nil, s.listSandboxes)
	add(s, &sdk.Tool{Name: toolRemove, Title: "Remove a sandbox",
		Description: "Stop and delete a sandbox and everything in it. Snapshots made from it stay.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, IdempotentHint: true, OpenWorldHint: &no},
	}, nil, s.remove)
	s.addCheckpointTools()
	s.addScreenTools()
}

// add registers a tool whose input schema is In's, with enums for the
// named properties. A handler's error becomes a tool error (IsError) with
// its message; the server keeps serving.
func add[In, Out any](s *Server, t *sdk.Tool, enums map[string][]any, h func(context.Context, In) (*sdk.CallToolResult, Out, error)) {
	schema, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: %v", t.Name, err))
	}
	for name, values := range enums {
		p, ok := schema.Properties[name]
		if !ok {
			panic(fmt.Sprintf("tool %s: no property %q for its enum", t.Name, name))
		}
		p.Enum = values
	}
	t.InputSchema = schema
	sdk.AddTool(s.mcp, t, func(ctx context.Context, _ *sdk.CallToolRequest, in In) (*sdk.CallToolResult, Out, error) {
		start := time.Now()
		res, out, err := h(ctx, in)
		if err != nil {
			s.log.Info("tool failed", "tool", t.Name, "err", err, "duration", time.Since(start))
			var zero Out
			return nil, zero, toolError(err)
		}
		s.log.Debug("tool", "tool", t.Name, "duration", time.Since(start))
		return res, out, nil
	})
}

// --- create_sandbox ----------------------------------------------------------

type createArgs struct {
	Image          string            `json:"image,omitempty" jsonschema:"image to start from: \"base\" (the default: Debian with python3, node, bash, git), \"code-interpreter-v1\" (base with a stateful code interpreter for run_code, numpy, pandas, matplotlib, scikit-learn), \"busybox\" (tiny, only sh and busybox tools), \"docker\" (base with a Docker daemon running: docker build, docker run, docker-compose inside the sandbox), \"desktop\" (base with an XFCE desktop on a screen, Chromium, for screenshot, click, type, key, scroll and open_url), or an image a snapshot_sandbox returned"`
	Name           string            `json:"name,omitempty" jsonschema:"optional unique name, usable in place of the sandbox_id"`
	CPUs           float64           `json:"cpus,omitempty" jsonschema:"CPU limit in cores, e.g. 1 or 0.5 (default: the host's default)"`
	MemoryMB       int64             `json:"memory_mb,omitempty" jsonschema:"memory limit in MiB (default: the host's default)"`
	Network        string            `json:"network,omitempty" jsonschema:"network access: none (default), open (any destination), allow (only the destinations listed in allow)"`
	Allow          []string          `json:"allow,omitempty" jsonschema:"with network allow: destinations the sandbox may reach, each DOMAIN[:PORT] or CIDR[:PORT], e.g. pypi.org:443"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables for every process in the sandbox"`
	LifetimeSecond int64             `json:"lifetime_seconds,omitempty" jsonschema:"seconds until the sandbox is removed automatically (default: the server's default, 30 minutes unless configured; at most 86400)"`
}

// sandboxInfo describes a sandbox to the model.
type sandboxInfo struct {
	SandboxID string    `json:"sandbox_id"`
	Name      string    `json:"name,omitempty"`
	Image     string    `json:"image"`
	State     string    `json:"state"`
	Network   string    `json:"network"`
	Allow     []string  `json:"allow,omitempty"`
	Created   time.Time `json:"created"`
	ExpiresAt string    `json:"expires_at,omitempty" jsonschema:"when the sandbox is removed, RFC 3339; empty when no lifetime runs (paused)"`
	Ports     []string  `json:"exposed_urls,omitempty"`
}

// imageAliases are the short names a model is told about.
var imageAliases = map[string]string{"base": engine.DefaultImage, "busybox": engine.TestImage}

// createRequest validates a and renders it for the engine.
func (s *Server) createRequest(a createArgs) (engine.CreateRequest, error) {
	req := engine.CreateRequest{
		Name: a.Name, Image: a.Image, CPUs: a.CPUs, Network: a.Network, Allow: a.Allow,
		Labels: map[string]string{OwnerLabel: s.cfg.Owner}, OnTimeout: engine.OnTimeoutRemove,
	}
	if alias, ok := imageAliases[a.Image]; ok {
		req.Image = alias
	}
	if a.CPUs < 0 {
		return req, fmt.Errorf("cpus %v: must be positive: %w", a.CPUs, errdefs.ErrInvalidArgument)
	}
	if a.CPUs > 0 {
		req.Explicit = append(req.Explicit, "cpus")
	}
	if a.MemoryMB < 0 || a.MemoryMB > 1<<30 {
		return req, fmt.Errorf("memory_mb %d: must be positive: %w", a.MemoryMB, errdefs.ErrInvalidArgument)
	}
	if a.MemoryMB > 0 {
		req.Memory = a.MemoryMB << 20
		req.Explicit = append(req.Explicit, "memory")
	}
	switch a.Network {
	case "", "none", "open":
		if len(a.Allow) > 0 {
			return req, fmt.Errorf("allow is only for network \"allow\" (network is %q): %w", a.Network, errdefs.ErrInvalidArgument)
		}
	case "allow":
		if len(a.Allow) == 0 {
			return req, fmt.Errorf("network \"allow\" needs at least one destination in allow, e.g. [\"pypi.org:443\"]: %w", errdefs.ErrInvalidArgument)
		}
	default:
		return req, fmt.Errorf("network %q: want none, open or allow: %w", a.Network, errdefs.ErrInvalidArgument)
	}
	env, err := envList(a.Env)
	if err != nil {
		return req, err
	}
	req.Env = env
	switch {
	case a.LifetimeSecond < 0 || time.Duration(a.LifetimeSecond)*time.Second > maxLifetime:
		return req, fmt.Errorf("lifetime_seconds %d: want 1 to %d: %w", a.LifetimeSecond, int64(maxLifetime/time.Second), errdefs.ErrInvalidArgument)
	case a.LifetimeSecond == 0:
		req.Timeout = s.cfg.DefaultLifetime
	default:
		req.Timeout = time.Duration(a.LifetimeSecond) * time.Second
	}
	return req, nil
}

// envList renders an env map as sorted KEY=VALUE strings.
func envList(m map[string]string) ([]string, error) {
	var out []string
	for k, v := range m {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("env name %q: want a name without \"=\": %w", k, errdefs.ErrInvalidArgument)
		}
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}

func (s *Server) create(ctx context.Context, a createArgs) (*sdk.CallToolResult, sandboxInfo, error) {
	// Arguments are checked for every backend alike.
	if _, err := s.createRequest(a); err != nil {
		return nil, sandboxInfo{}, err
	}
	in, err := s.be.create(ctx, a)
	return nil, in, err
}

// --- lifecycle ---------------------------------------------------------------

type snapshotArgs struct {
	sandboxArg
	Name string `json:"name,omitempty" jsonschema:"image name for the snapshot, e.g. myproject:step1 (default: snapshot/ID:TIME)"`
}

type snapshotResult struct {
	Image  string `json:"image" jsonschema:"pass this as image to create_sandbox"`
	Digest string `json:"digest"`
}

func (s *Server) snapshot(ctx context.Context, a snapshotArgs) (*sdk.CallToolResult, snapshotResult, error) {
	if _, ok := imageAliases[a.Name]; ok {
		return nil, snapshotResult{}, fmt.Errorf("name %q is a built-in image: choose another name: %w", a.Name, errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, snapshotResult{}, err
	}
	res, err := s.be.snapshot(ctx, a.SandboxID, a.Name)
	return nil, res, err
}

func (s *Server) pause(ctx context.Context, a sandboxArg) (*sdk.CallToolResult, sandboxInfo, error) {
	in, err := s.be.pause(ctx, a.SandboxID)
	return nil, in, err
}

func (s *Server) resume(ctx context.Context, a sandboxArg) (*sdk.CallToolResult, sandboxInfo, error) {
	in, err := s.be.resume(ctx, a.SandboxID)
	return nil, in, err
}

type noArgs struct{}

type sandboxList struct {
	Sandboxes []sandboxInfo `json:"sandboxes"`
}

func (s *Server) listSandboxes(ctx context.Context, _ noArgs) (*sdk.CallToolResult, sandboxList, error) {
	all, err := s.be.list(ctx)
	if err != nil {
		return nil, sandboxList{}, err
	}
	return nil, sandboxList{Sandboxes: all}, nil
}

func (s *Server) remove(ctx context.Context, a sandboxArg) (*sdk.CallToolResult, done, error) {
	if err := s.be.remove(ctx, a.SandboxID); err != nil {
		return nil, done{}, err
	}
	return nil, done{OK: true}, nil
}
