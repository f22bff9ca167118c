package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/containerd/errdefs"
	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"sbx.dev/sbx/engine"
)

// Tool names.
const (
	toolCreate     = "create_sandbox"
	toolRun        = "run_command"
	toolRunCode    = "run_code"
	toolRead       = "read_file"
	toolWrite      = "write_file"
	toolList       = "list_files"
	toolRemoveFile = "remove_file"
	toolUpload     = "upload_file"
	toolDownload   = "download_file"
	toolStart      = "start_process"
	toolLogs       = "read_logs"
	toolExpose     = "expose_port"
	toolSnapshot   = "snapshot_sandbox"
	toolPause      = "pause_sandbox"
	toolResume     = "resume_sandbox"
	toolSandboxes  = "list_sandboxes"
	toolRemove     = "remove_sandbox"
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
		Description: "Run a program given as a string with an interpreter in a sandbox: python (python3), node or bash; the code is fed to the interpreter on its standard input. " +
			"Returns exit code, stdout and stderr as run_command does. Fails with an error if the sandbox's image has no such interpreter (the default image has all three).",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes, OpenWorldHint: &no},
	}, map[string][]any{"language": {"python", "node", "bash"}}, s.runCode)
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
			"Works with every network mode. The forward lasts until the sandbox is paused, stopped or removed, or this server exits; expose the port again after resume_sandbox.",
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
	Image          string            `json:"image,omitempty" jsonschema:"image to start from: \"base\" (the default: Debian with python3, node, bash, git), \"busybox\" (tiny, only sh and busybox tools), or an image a snapshot_sandbox returned"`
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

func (s *Server) info(sb *engine.Sandbox) sandboxInfo {
	in := sandboxInfo{SandboxID: sb.ID, Name: sb.Name, Image: sb.Image, State: sb.State, Network: sb.Network, Allow: sb.Allow, Created: sb.Created}
	if sb.Deadline != nil && sb.State == engine.StateRunning {
		in.ExpiresAt = sb.Deadline.UTC().Format(time.RFC3339)
	}
	s.mu.Lock()
	for _, f := range s.forwards[sb.ID] {
		in.Ports = append(in.Ports, f.url)
	}
	s.mu.Unlock()
	return in
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
	req, err := s.createRequest(a)
	if err != nil {
		return nil, sandboxInfo{}, err
	}
	if err := s.eng.ValidateCreate(req); err != nil {
		return nil, sandboxInfo{}, err
	}
	sb, err := s.eng.Create(ctx, req)
	if err != nil {
		return nil, sandboxInfo{}, err
	}
	s.log.Info("created sandbox", "id", sb.ID, "image", sb.Image, "network", sb.Network)
	return nil, s.info(sb), nil
}

// --- run_command and run_code ------------------------------------------------

type runArgs struct {
	sandboxArg
	Command        string            `json:"command" jsonschema:"shell command line, run with /bin/sh -c"`
	Workdir        string            `json:"workdir,omitempty" jsonschema:"absolute working directory (default: the image's)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables for this command"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text fed to the command's standard input (default: none)"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"seconds before the command is killed (default 120, at most 3600)"`
}

type codeArgs struct {
	sandboxArg
	Language       string `json:"language" jsonschema:"the interpreter: python (python3), node or bash"`
	Code           string `json:"code" jsonschema:"the program's source code"`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty" jsonschema:"seconds before the program is killed (default 120, at most 3600)"`
}

// runResult is a finished command.
type runResult struct {
	ExitCode int    `json:"exit_code" jsonschema:"the command's exit status; 124 if it timed out, 127 if the command was not found"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// CutBytes is how many bytes of output were left out.
	CutBytes int64 `json:"cut_bytes,omitempty" jsonschema:"bytes cut from the middle of stdout and stderr together"`
}

// interpreters are run_code's languages: the program that reads a
// script on stdin.
var interpreters = map[string][]string{
	"python": {"python3", "-"},
	"node":   {"node", "-"},
	"bash":   {"bash", "-s"},
}

// timeout checks a call's timeout_seconds.
func (s *Server) timeout(secs int64) (time.Duration, error) {
	switch {
	case secs == 0:
		return s.cfg.CommandTimeout, nil
	case secs < 0 || time.Duration(secs)*time.Second > maxCommandTimeout:
		return 0, fmt.Errorf("timeout_seconds %d: want 1 to %d: %w", secs, int64(maxCommandTimeout/time.Second), errdefs.ErrInvalidArgument)
	}
	return time.Duration(secs) * time.Second, nil
}

func (s *Server) runCommand(ctx context.Context, a runArgs) (*sdk.CallToolResult, runResult, error) {
	if strings.TrimSpace(a.Command) == "" {
		return nil, runResult{}, fmt.Errorf("command is empty: %w", errdefs.ErrInvalidArgument)
	}
	timeout, err := s.timeout(a.TimeoutSeconds)
	if err != nil {
		return nil, runResult{}, err
	}
	env, err := envList(a.Env)
	if err != nil {
		return nil, runResult{}, err
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, runResult{}, err
	}
	req := engine.ExecRequest{Args: []string{"/bin/sh", "-c", a.Command}, Env: env, Workdir: a.Workdir, Timeout: timeout}
	if a.Stdin != "" {
		req.Stdin = strings.NewReader(a.Stdin)
	}
	res, err := s.exec(ctx, sb, req)
	if err != nil {
		return nil, runResult{}, err
	}
	if res.ExitCode == engine.ExitNotFound && res.Stdout == "" && res.Stderr == "" {
		return nil, runResult{}, fmt.Errorf("sandbox %s (image %s) has no /bin/sh: run_command needs a shell in the image: %w", sb.ShortID(), sb.Image, errdefs.ErrFailedPrecondition)
	}
	return textResult(res), res, nil
}

func (s *Server) runCode(ctx context.Context, a codeArgs) (*sdk.CallToolResult, runResult, error) {
	args, ok := interpreters[a.Language]
	if !ok {
		return nil, runResult{}, fmt.Errorf("language %q: want python, node or bash: %w", a.Language, errdefs.ErrInvalidArgument)
	}
	timeout, err := s.timeout(a.TimeoutSeconds)
	if err != nil {
		return nil, runResult{}, err
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, runResult{}, err
	}
	res, err := s.exec(ctx, sb, engine.ExecRequest{Args: args, Stdin: strings.NewReader(a.Code), Timeout: timeout})
	if err != nil {
		return nil, runResult{}, err
	}
	if res.ExitCode == engine.ExitNotFound && res.Stdout == "" && res.Stderr == "" {
		return nil, runResult{}, fmt.Errorf("%s is not installed in sandbox %s (image %s): create a sandbox on the default image \"base\", which has python3, node and bash: %w",
			args[0], sb.ShortID(), sb.Image, errdefs.ErrNotFound)
	}
	return textResult(res), res, nil
}

// exec runs req in sb and captures its output. A command that ran, even
// one that failed or timed out, is a result; sbx's own failure is an
// error.
func (s *Server) exec(ctx context.Context, sb *engine.Sandbox, req engine.ExecRequest) (runResult, error) {
	out, errOut := newCapture(s.cfg.MaxOutput), newCapture(s.cfg.MaxOutput)
	req.Stdout, req.Stderr = out, errOut
	code, err := s.eng.Exec(ctx, sb.ID, req)
	res := runResult{ExitCode: code}
	switch {
	case errors.Is(err, engine.ErrTimeout):
		if ctx.Err() != nil {
			return res, toolError(ctx.Err())
		}
		res.TimedOut = true
	case err != nil && code < 0:
		return res, err
	case err != nil:
		// The command did not start, or its sandbox ended under it:
		// what the engine says goes to stderr with the status.
		fmt.Fprintf(errOut, "%v\n", err)
	}
	res.Stdout, res.Stderr = out.String(), errOut.String()
	res.CutBytes = out.Cut() + errOut.Cut()
	return res, nil
}

// textResult renders a command's result as text a model reads easily.
func textResult(r runResult) *sdk.CallToolResult {
	var b strings.Builder
	fmt.Fprintf(&b, "exit_code: %d", r.ExitCode)
	if r.TimedOut {
		b.WriteString(" (timed out and killed)")
	}
	b.WriteString("\n")
	if r.Stdout != "" {
		fmt.Fprintf(&b, "--- stdout ---\n%s", r.Stdout)
		if !strings.HasSuffix(r.Stdout, "\n") {
			b.WriteString("\n")
		}
	}
	if r.Stderr != "" {
		fmt.Fprintf(&b, "--- stderr ---\n%s", r.Stderr)
		if !strings.HasSuffix(r.Stderr, "\n") {
			b.WriteString("\n")
		}
	}
	if r.Stdout == "" && r.Stderr == "" {
		b.WriteString("(no output)\n")
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: b.String()}}}
}

// --- files -------------------------------------------------------------------

type pathArgs struct {
	sandboxArg
	Path string `json:"path" jsonschema:"absolute path in the sandbox, e.g. /workspace/main.py"`
}

type readArgs struct {
	pathArgs
	MaxBytes int64 `json:"max_bytes,omitempty" jsonschema:"most bytes to return (default 262144, at most 4194304)"`
}

type readResult struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	Encoding  string `json:"encoding" jsonschema:"utf8, or base64 for a file that is not UTF-8 text"`
	Size      int64  `json:"size" jsonschema:"the file's whole size in bytes"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"only the first max_bytes bytes are in content"`
}

// checkPath refuses a sandbox path that is not absolute, before any
// sandbox is touched.
func checkPath(name, p string) error {
	if p == "" {
		return fmt.Errorf("%s is empty: want an absolute path in the sandbox: %w", name, errdefs.ErrInvalidArgument)
	}
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("%s %q: want an absolute path in the sandbox (starting with /): %w", name, p, errdefs.ErrInvalidArgument)
	}
	return nil
}

// limitWriter keeps the first n bytes written and counts the rest.
type limitWriter struct {
	buf   bytes.Buffer
	n     int64
	total int64
}

func (w *limitWriter) Write(p []byte) (int, error) {
	w.total += int64(len(p))
	if room := w.n - int64(w.buf.Len()); room > 0 {
		w.buf.Write(p[:min(int64(len(p)), room)])
	}
	return len(p), nil
}

func (s *Server) readFile(ctx context.Context, a readArgs) (*sdk.CallToolResult, readResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, readResult{}, err
	}
	limit := a.MaxBytes
	switch {
	case limit == 0:
		limit = defaultReadBytes
	case limit < 0 || limit > maxReadBytes:
		return nil, readResult{}, fmt.Errorf("max_bytes %d: want 1 to %d: %w", limit, maxReadBytes, errdefs.ErrInvalidArgument)
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, readResult{}, err
	}
	fi, err := s.eng.Stat(ctx, sb.ID, a.Path)
	if err != nil {
		return nil, readResult{}, err
	}
	if fi.IsDir {
		return nil, readResult{}, fmt.Errorf("%s is a directory: list it with list_files: %w", a.Path, errdefs.ErrInvalidArgument)
	}
	w := &limitWriter{n: limit}
	if err := s.eng.ReadFile(ctx, sb.ID, a.Path, w); err != nil {
		return nil, readResult{}, err
	}
	data := w.buf.Bytes()
	res := readResult{Path: a.Path, Size: w.total, Truncated: w.total > int64(len(data)), Encoding: "utf8"}
	text := data
	if res.Truncated {
		// A cut may split the last character: that is no reason to
		// call the file binary.
		for i := 0; i < utf8.UTFMax && len(text) > 0 && !utf8.Valid(text); i++ {
			text = text[:len(text)-1]
		}
	}
	if utf8.Valid(text) {
		res.Content = string(text)
	} else {
		res.Encoding, res.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	body := res.Content
	if res.Truncated {
		body += fmt.Sprintf("\n[... truncated: showed %d of %d bytes; pass a larger max_bytes, or use run_command with tail or sed to read further ...]", len(data), res.Size)
	}
	if res.Encoding == "base64" {
		body = "(binary file, base64)\n" + body
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: body}}}, res, nil
}

type writeArgs struct {
	pathArgs
	Content  string `json:"content" jsonschema:"the file's new content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permissions, e.g. 0755 for a script (default 0644)"`
}

type writeResult struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

// parseMode parses an octal permission string.
func parseMode(m string) (fs.FileMode, error) {
	if m == "" {
		return 0o644, nil
	}
	v, err := strconv.ParseUint(m, 8, 32)
	if err != nil || v > 0o777 || v == 0 {
		return 0, fmt.Errorf("mode %q: want octal permissions such as 0644 or 0755: %w", m, errdefs.ErrInvalidArgument)
	}
	return fs.FileMode(v), nil
}

func (s *Server) writeFile(ctx context.Context, a writeArgs) (*sdk.CallToolResult, writeResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, writeResult{}, err
	}
	mode, err := parseMode(a.Mode)
	if err != nil {
		return nil, writeResult{}, err
	}
	data := []byte(a.Content)
	switch a.Encoding {
	case "", "utf8":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(a.Content); err != nil {
			return nil, writeResult{}, fmt.Errorf("content is not valid base64: %w: %w", err, errdefs.ErrInvalidArgument)
		}
	default:
		return nil, writeResult{}, fmt.Errorf("encoding %q: want utf8 or base64: %w", a.Encoding, errdefs.ErrInvalidArgument)
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, writeResult{}, err
	}
	owner, err := s.fileOwner(ctx, sb)
	if err != nil {
		return nil, writeResult{}, err
	}
	if err := s.eng.WriteFile(ctx, sb.ID, engine.WriteFileRequest{Path: a.Path, Data: bytes.NewReader(data), Mode: mode, Parents: true, Owner: owner}); err != nil {
		return nil, writeResult{}, err
	}
	return nil, writeResult{Path: a.Path, Bytes: len(data)}, nil
}

// fileOwner is the owner of the files write_file creates in sb: the user
// its commands run as (the image's USER), so that they can change them;
// nil for root.
func (s *Server) fileOwner(ctx context.Context, sb *engine.Sandbox) (*engine.Owner, error) {
	name := sb.ImageUser
	if name == "" || name == "root" || name == "0" || name == "0:0" {
		return nil, nil
	}
	uid, gid, numeric := strings.Cut(name, ":")
	if u, err := strconv.ParseUint(uid, 10, 32); err == nil {
		o := &engine.Owner{UID: uint32(u)}
		if numeric {
			g, err := strconv.ParseUint(gid, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("image user %q: bad group: %w", name, errdefs.ErrInvalidArgument)
			}
			o.GID = uint32(g)
		} else {
			o.GID = o.UID
		}
		return o, nil
	}
	u, err := s.eng.LookupUser(ctx, sb.ID, uid)
	if err != nil {
		return nil, err
	}
	return &engine.Owner{UID: u.UID, GID: u.GID}, nil
}

type fileEntry struct {
	Name    string    `json:"name"`
	Type    string    `json:"type" jsonschema:"file, dir, symlink or other"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode" jsonschema:"permissions in octal"`
	ModTime time.Time `json:"mod_time"`
	Link    string    `json:"link,omitempty" jsonschema:"a symlink's target"`
}

type listResult struct {
	Path    string      `json:"path"`
	Entries []fileEntry `json:"entries"`
}

func entryOf(fi engine.FileInfo) fileEntry {
	e := fileEntry{Name: fi.Name, Size: fi.Size, Mode: fmt.Sprintf("%04o", fi.Mode.Perm()), ModTime: fi.ModTime.UTC(), Link: fi.Link}
	switch {
	case fi.IsDir:
		e.Type = "dir"
	case fi.Mode&fs.ModeSymlink != 0:
		e.Type = "symlink"
	case fi.Mode.IsRegular():
		e.Type = "file"
	default:
		e.Type = "other"
	}
	return e
}

func (s *Server) listFiles(ctx context.Context, a pathArgs) (*sdk.CallToolResult, listResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, listResult{}, err
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, listResult{}, err
	}
	fis, err := s.eng.ReadDir(ctx, sb.ID, a.Path)
	if err != nil {
		return nil, listResult{}, err
	}
	res := listResult{Path: a.Path, Entries: []fileEntry{}}
	for _, fi := range fis {
		res.Entries = append(res.Entries, entryOf(fi))
	}
	return nil, res, nil
}

type removeFileArgs struct {
	pathArgs
	Recursive bool `json:"recursive,omitempty" jsonschema:"also remove a directory's contents"`
}

type done struct {
	OK bool `json:"ok"`
}

func (s *Server) removeFile(ctx context.Context, a removeFileArgs) (*sdk.CallToolResult, done, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, done{}, err
	}
	if a.Path == "/" {
		return nil, done{}, fmt.Errorf("refusing to remove /: remove the sandbox instead: %w", errdefs.ErrInvalidArgument)
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, done{}, err
	}
	if err := s.eng.RemoveFile(ctx, sb.ID, a.Path, a.Recursive); err != nil {
		return nil, done{}, err
	}
	return nil, done{OK: true}, nil
}

// --- host transfers ----------------------------------------------------------

type transferArgs struct {
	sandboxArg
	HostPath string `json:"host_path" jsonschema:"path on the host, inside the allowed host directory (relative paths are taken from it)"`
	Path     string `json:"path" jsonschema:"absolute path in the sandbox"`
}

type transferResult struct {
	HostPath string `json:"host_path" jsonschema:"the host path, resolved"`
	Path     string `json:"path"`
}

func (s *Server) upload(ctx context.Context, a transferArgs) (*sdk.CallToolResult, transferResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, transferResult{}, err
	}
	src, err := s.hostDir.source(a.HostPath)
	if err != nil {
		return nil, transferResult{}, err
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, transferResult{}, err
	}
	if err := s.eng.CopyToSandbox(ctx, sb.ID, src, a.Path); err != nil {
		return nil, transferResult{}, err
	}
	return nil, transferResult{HostPath: src, Path: a.Path}, nil
}

func (s *Server) download(ctx context.Context, a transferArgs) (*sdk.CallToolResult, transferResult, error) {
	if err := checkPath("path", a.Path); err != nil {
		return nil, transferResult{}, err
	}
	dst, err := s.hostDir.target(a.HostPath)
	if err != nil {
		return nil, transferResult{}, err
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, transferResult{}, err
	}
	if err := s.eng.CopyFromSandbox(ctx, sb.ID, a.Path, dst); err != nil {
		return nil, transferResult{}, err
	}
	return nil, transferResult{HostPath: dst, Path: a.Path}, nil
}

// --- background processes and logs --------------------------------------------

type startArgs struct {
	sandboxArg
	Command string            `json:"command" jsonschema:"shell command line, run with /bin/sh -c in the background"`
	Workdir string            `json:"workdir,omitempty" jsonschema:"absolute working directory (default: the image's)"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"extra environment variables for this process"`
}

type startResult struct {
	Pid int `json:"pid" jsonschema:"the process's PID inside the sandbox; its log lines carry it"`
}

func (s *Server) startProcess(ctx context.Context, a startArgs) (*sdk.CallToolResult, startResult, error) {
	if strings.TrimSpace(a.Command) == "" {
		return nil, startResult{}, fmt.Errorf("command is empty: %w", errdefs.ErrInvalidArgument)
	}
	env, err := envList(a.Env)
	if err != nil {
		return nil, startResult{}, err
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, startResult{}, err
	}
	var out bytes.Buffer
	code, err := s.eng.Exec(ctx, sb.ID, engine.ExecRequest{Args: []string{"/bin/sh", "-c", a.Command}, Env: env, Workdir: a.Workdir, Detach: true, Stdout: &out})
	if err != nil {
		return nil, startResult{}, err
	}
	if code != 0 {
		return nil, startResult{}, fmt.Errorf("could not start the command (status %d): %w", code, errdefs.ErrUnknown)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		return nil, startResult{}, fmt.Errorf("started, but its PID %q is unreadable: %w", out.String(), errdefs.ErrUnknown)
	}
	return nil, startResult{Pid: pid}, nil
}

type logsArgs struct {
	sandboxArg
	Pid   int `json:"pid,omitempty" jsonschema:"only the lines of this process (start_process's pid)"`
	Lines int `json:"lines,omitempty" jsonschema:"how many of the last lines to return (default 200, at most 5000)"`
}

type logsResult struct {
	Log       string `json:"log"`
	Lines     int    `json:"lines"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"older lines were left out"`
}

func (s *Server) readLogs(ctx context.Context, a logsArgs) (*sdk.CallToolResult, logsResult, error) {
	n := a.Lines
	switch {
	case n == 0:
		n = defaultLogLines
	case n < 0 || n > 5000:
		return nil, logsResult{}, fmt.Errorf("lines %d: want 1 to 5000: %w", n, errdefs.ErrInvalidArgument)
	}
	if a.Pid < 0 {
		return nil, logsResult{}, fmt.Errorf("pid %d: must be positive: %w", a.Pid, errdefs.ErrInvalidArgument)
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, logsResult{}, err
	}
	var buf bytes.Buffer
	if err := s.eng.Logs(ctx, sb.ID, engine.LogsRequest{Out: &buf}); err != nil {
		return nil, logsResult{}, err
	}
	lines := filterLog(buf.String(), a.Pid)
	res := logsResult{}
	if len(lines) > n {
		lines, res.Truncated = lines[len(lines)-n:], true
	}
	res.Lines = len(lines)
	res.Log = strings.Join(lines, "\n")
	if len(lines) > 0 {
		res.Log += "\n"
	}
	return nil, res, nil
}

// filterLog splits a sandbox log into lines, keeping those of pid (all
// for 0). A line is "TIMESTAMP SOURCE TEXT".
func filterLog(log string, pid int) []string {
	var out []string
	want := strconv.Itoa(pid)
	for _, l := range strings.Split(strings.TrimRight(log, "\n"), "\n") {
		if l == "" {
			continue
		}
		if pid != 0 {
			f := strings.SplitN(l, " ", 3)
			if len(f) < 2 || f[1] != want {
				continue
			}
		}
		out = append(out, l)
	}
	return out
}

// --- ports -------------------------------------------------------------------

type exposeArgs struct {
	sandboxArg
	Port     int `json:"port" jsonschema:"TCP port a program listens on inside the sandbox (on any address, 127.0.0.1 included)"`
	HostPort int `json:"host_port,omitempty" jsonschema:"port on the host's 127.0.0.1 (default: a free one)"`
}

type exposeResult struct {
	URL      string `json:"url" jsonschema:"http://127.0.0.1:HOST_PORT"`
	HostPort int    `json:"host_port"`
	Port     int    `json:"port"`
}

func (s *Server) exposePort(ctx context.Context, a exposeArgs) (*sdk.CallToolResult, exposeResult, error) {
	if a.Port < 1 || a.Port > 65535 {
		return nil, exposeResult{}, fmt.Errorf("port %d: want 1 to 65535: %w", a.Port, errdefs.ErrInvalidArgument)
	}
	if a.HostPort < 0 || a.HostPort > 65535 {
		return nil, exposeResult{}, fmt.Errorf("host_port %d: want 1 to 65535, or none for a free one: %w", a.HostPort, errdefs.ErrInvalidArgument)
	}
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, exposeResult{}, err
	}
	if sb.State != engine.StateRunning {
		return nil, exposeResult{}, fmt.Errorf("sandbox %s is %s: only a running sandbox's port can be exposed: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	ls, err := engine.ListenPorts([]engine.PortMapping{{HostIP: "127.0.0.1", HostPort: uint16(a.HostPort), Port: uint16(a.Port)}})
	if err != nil {
		return nil, exposeResult{}, err
	}
	hostPort := ls[0].Listener.Addr().(*net.TCPAddr).Port
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(hostPort))
	fctx, cancel := context.WithCancel(s.ctx)
	s.mu.Lock()
	s.forwards[sb.ID] = append(s.forwards[sb.ID], forward{port: uint16(a.Port), url: url, cancel: cancel})
	s.mu.Unlock()
	go func() {
		defer cancel()
		err := s.eng.Forward(fctx, sb.ID, ls)
		s.log.Info("port forward ended", "sandbox", sb.ID, "port", a.Port, "url", url, "err", err)
		s.mu.Lock()
		defer s.mu.Unlock()
		fs := s.forwards[sb.ID]
		for i := range fs {
			if fs[i].url == url {
				s.forwards[sb.ID] = slices.Delete(fs, i, i+1)
				break
			}
		}
		if len(s.forwards[sb.ID]) == 0 {
			delete(s.forwards, sb.ID)
		}
	}()
	return nil, exposeResult{URL: url, HostPort: hostPort, Port: a.Port}, nil
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
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, snapshotResult{}, err
	}
	img, err := s.eng.Snapshot(ctx, sb.ID, engine.SnapshotRequest{Name: a.Name})
	if err != nil {
		return nil, snapshotResult{}, err
	}
	return nil, snapshotResult{Image: img.Name, Digest: img.Digest.String()}, nil
}

func (s *Server) pause(ctx context.Context, a sandboxArg) (*sdk.CallToolResult, sandboxInfo, error) {
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, sandboxInfo{}, err
	}
	s.stopForwards(sb.ID)
	if sb, err = s.eng.Pause(ctx, sb.ID); err != nil {
		return nil, sandboxInfo{}, err
	}
	return nil, s.info(sb), nil
}

func (s *Server) resume(ctx context.Context, a sandboxArg) (*sdk.CallToolResult, sandboxInfo, error) {
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, sandboxInfo{}, err
	}
	if sb, err = s.eng.Resume(ctx, sb.ID); err != nil {
		return nil, sandboxInfo{}, err
	}
	return nil, s.info(sb), nil
}

type noArgs struct{}

type sandboxList struct {
	Sandboxes []sandboxInfo `json:"sandboxes"`
}

func (s *Server) listSandboxes(ctx context.Context, _ noArgs) (*sdk.CallToolResult, sandboxList, error) {
	all, err := s.eng.List(ctx)
	if err != nil {
		return nil, sandboxList{}, err
	}
	res := sandboxList{Sandboxes: []sandboxInfo{}}
	for _, sb := range all {
		if s.manages(sb) {
			res.Sandboxes = append(res.Sandboxes, s.info(sb))
		}
	}
	return nil, res, nil
}

func (s *Server) remove(ctx context.Context, a sandboxArg) (*sdk.CallToolResult, done, error) {
	sb, err := s.sandbox(ctx, a.SandboxID)
	if err != nil {
		return nil, done{}, err
	}
	s.stopForwards(sb.ID)
	if err := s.eng.Remove(ctx, sb.ID, true); err != nil {
		return nil, done{}, err
	}
	s.log.Info("removed sandbox", "id", sb.ID)
	return nil, done{OK: true}, nil
}
