package mcp

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// --- run_command ------------------------------------------------

type runArgs struct {
	sandboxArg
	Command        string            `json:"command" jsonschema:"shell command line, run with /bin/sh -c"`
	Workdir        string            `json:"workdir,omitempty" jsonschema:"absolute working directory (default: the image's)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables for this command"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text fed to the command's standard input (default: none)"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"seconds before the command is killed (default 120, at most 3600)"`
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
	"python":     {"python3", "-"},
	"javascript": {"node", "-"},
	"bash":       {"bash", "-s"},
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
	if _, err := envList(a.Env); err != nil {
		return nil, runResult{}, err
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, runResult{}, err
	}
	res, err := s.be.exec(ctx, a.SandboxID, execSpec{Args: []string{"/bin/sh", "-c", a.Command}, Env: a.Env, Workdir: a.Workdir, Stdin: a.Stdin, Timeout: timeout})
	if err != nil {
		return nil, runResult{}, err
	}
	if res.missing {
		return nil, runResult{}, fmt.Errorf("%s has no /bin/sh: run_command needs a shell in the image: %w", res.where, errdefs.ErrFailedPrecondition)
	}
	return textResult(res.runResult), res.runResult, nil
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
	if _, err := envList(a.Env); err != nil {
		return nil, startResult{}, err
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, startResult{}, err
	}
	pid, err := s.be.start(ctx, a.SandboxID, execSpec{Args: []string{"/bin/sh", "-c", a.Command}, Env: a.Env, Workdir: a.Workdir})
	if err != nil {
		return nil, startResult{}, err
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
	if err := checkRef(a.SandboxID); err != nil {
		return nil, logsResult{}, err
	}
	log, err := s.be.logs(ctx, a.SandboxID)
	if err != nil {
		return nil, logsResult{}, err
	}
	lines := filterLog(log, a.Pid)
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
	URL      string `json:"url" jsonschema:"where the port is reached: http://127.0.0.1:HOST_PORT, or the remote server's URL of the port"`
	HostPort int    `json:"host_port,omitempty"`
	Port     int    `json:"port"`
	// Headers route a request to the port when the URL alone does not.
	Headers map[string]string `json:"headers,omitempty" jsonschema:"HTTP headers a request to url must carry to reach the port"`
	Note    string            `json:"note,omitempty"`
}

func (s *Server) exposePort(ctx context.Context, a exposeArgs) (*sdk.CallToolResult, exposeResult, error) {
	if a.Port < 1 || a.Port > 65535 {
		return nil, exposeResult{}, fmt.Errorf("port %d: want 1 to 65535: %w", a.Port, errdefs.ErrInvalidArgument)
	}
	if a.HostPort < 0 || a.HostPort > 65535 {
		return nil, exposeResult{}, fmt.Errorf("host_port %d: want 1 to 65535, or none for a free one: %w", a.HostPort, errdefs.ErrInvalidArgument)
	}
	if err := checkRef(a.SandboxID); err != nil {
		return nil, exposeResult{}, err
	}
	res, err := s.be.expose(ctx, a.SandboxID, a.Port, a.HostPort)
	if err != nil {
		return nil, exposeResult{}, err
	}
	if res.Note != "" {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: res.URL + "\n" + res.Note}}}, res, nil
	}
	return nil, res, nil
}
