package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpInspectorDir holds the pinned MCP Inspector (make mcp-inspector).
const mcpInspectorDir = "mcp"

// mcpServe starts `hutch mcp` over stdio on e's state root with the Go SDK's
// client, and returns the session; it is closed when the test ends.
func mcpServe(t *testing.T, e *env, flags ...string) *sdk.ClientSession {
	t.Helper()
	cmd := e.cmd(nil, append([]string{"mcp"}, flags...)...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "mcp.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := sdk.NewClient(&sdk.Implementation{Name: "hutch-integration", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to hutch mcp over stdio: %v\nlog: %s", err, readFile(logf.Name()))
	}
	t.Cleanup(func() {
		cs.Close()
		if t.Failed() {
			t.Logf("hutch mcp log:\n%s", readFile(logf.Name()))
		}
	})
	return cs
}

// mcpServeHTTP starts `hutch mcp --transport http` on a free loopback port
// and connects the Go SDK's streamable HTTP client to it with the
// server's bearer token. The server is stopped when the test ends.
func mcpServeHTTP(t *testing.T, e *env, flags ...string) (*sdk.ClientSession, string) {
	t.Helper()
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	startMCPHTTP(t, e, "tcp", listen, listen, flags...)
	url := "http://" + listen + "/mcp"
	return mcpConnect(t, url, bearerClient(mcpToken(t, e))), url
}

// startMCPHTTP starts `hutch mcp --transport http --listen listen` on e's
// state root and returns when addr accepts connections on network (tcp
// or unix). The server is stopped when the test ends.
func startMCPHTTP(t *testing.T, e *env, network, addr, listen string, flags ...string) {
	t.Helper()
	cmd := e.cmd(nil, append([]string{"mcp", "--transport", "http", "--listen", listen}, flags...)...)
	logPath := filepath.Join(t.TempDir(), "mcp.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("hutch mcp log:\n%s", readFile(logPath))
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.Dial(network, addr)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("hutch mcp --transport http exited:\n%s", readFile(logPath))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("hutch mcp did not listen on %s:\n%s", addr, readFile(logPath))
		}
	}
}

// mcpToken is the bearer token `hutch mcp --transport http` keeps in e's
// state root.
func mcpToken(t *testing.T, e *env) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.root, "mcp", "token"))
	if err != nil {
		t.Fatalf("the server's token: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// bearerClient sends every request with the bearer token tok.
func bearerClient(tok string) *http.Client {
	return &http.Client{Transport: bearer{tok, http.DefaultTransport}}
}

type bearer struct {
	tok  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return b.next.RoundTrip(r)
}

// mcpConnect connects the Go SDK's streamable HTTP client to url through
// hc; the session is closed when the test ends.
func mcpConnect(t *testing.T, url string, hc *http.Client) *sdk.ClientSession {
	t.Helper()
	client := sdk.NewClient(&sdk.Implementation{Name: "hutch-integration", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// callTool calls a tool and returns its result, failing the test on a
// protocol error (a tool error is a result).
func callTool(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: protocol error: %v", name, args, err)
	}
	return res
}

// toolText is the text of a result's content.
func toolText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mustCall calls a tool that must succeed and decodes its structured
// result into out (if not nil).
func mustCall(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) *sdk.CallToolResult {
	t.Helper()
	res := callTool(t, cs, name, args)
	if res.IsError {
		t.Fatalf("%s %v: tool error: %s", name, args, toolText(res))
	}
	if out != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured result %s: %v", name, b, err)
		}
	}
	return res
}

// wantToolError calls a tool that must fail as a tool error whose message
// contains want.
func wantToolError(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, want string) {
	t.Helper()
	res := callTool(t, cs, name, args)
	if !res.IsError {
		t.Fatalf("%s %v: want a tool error, got %s", name, args, toolText(res))
	}
	if msg := toolText(res); !strings.Contains(msg, want) {
		t.Fatalf("%s %v: tool error %q does not say %q", name, args, msg, want)
	}
}

type mcpSandbox struct {
	SandboxID string   `json:"sandbox_id"`
	Image     string   `json:"image"`
	State     string   `json:"state"`
	ExpiresAt string   `json:"expires_at"`
	URLs      []string `json:"exposed_urls"`
}

type mcpRun struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timed_out"`
	CutBytes int64  `json:"cut_bytes"`
}

func mcpList(t *testing.T, cs *sdk.ClientSession) []mcpSandbox {
	t.Helper()
	var l struct {
		Sandboxes []mcpSandbox `json:"sandboxes"`
	}
	mustCall(t, cs, "list_sandboxes", nil, &l)
	return l.Sandboxes
}

// TestMCPAgentFlow drives `hutch mcp` over stdio with the Go SDK's client as
// an agent would: create a sandbox, write a script, run it, read what it
// wrote, run a background server and reach it through an exposed port,
// snapshot, start from the snapshot, pause and resume, remove.
func TestMCPAgentFlow(t *testing.T) {
	e := newEnv(t)
	cs := mcpServe(t, e)

	ctx := context.Background()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil {
			t.Errorf("tool %s has no description or input schema", tool.Name)
		}
	}
	for _, want := range []string{"create_sandbox", "run_command", "run_code", "read_file", "write_file", "list_files", "remove_file",
		"upload_file", "download_file", "start_process", "read_logs", "expose_port", "snapshot_sandbox", "pause_sandbox",
		"resume_sandbox", "list_sandboxes", "remove_sandbox"} {
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+want+" ") {
			t.Errorf("tools/list lacks %s: %v", want, names)
		}
	}

	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	if sb.SandboxID == "" || sb.State != "running" || sb.ExpiresAt == "" {
		t.Fatalf("create_sandbox: %+v: want a running sandbox with a lifetime", sb)
	}
	if exp, err := time.Parse(time.RFC3339, sb.ExpiresAt); err != nil || time.Until(exp) < 25*time.Minute || time.Until(exp) > 31*time.Minute {
		t.Errorf("expires_at %s: want the default lifetime of 30 minutes from now", sb.ExpiresAt)
	}
	id := sb.SandboxID

	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/work/job.sh",
		"content": "echo \"sum=$((6*7))\" > /work/out.txt\necho ran; echo oops >&2; exit 3\n"}, nil)
	var run mcpRun
	res := mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "sh /work/job.sh"}, &run)
	if run.ExitCode != 3 || run.Stdout != "ran\n" || run.Stderr != "oops\n" {
		t.Fatalf("run_command: %+v: want exit 3, stdout ran, stderr oops", run)
	}
	if txt := toolText(res); !strings.Contains(txt, "exit_code: 3") || !strings.Contains(txt, "ran") {
		t.Errorf("run_command text %q: want the exit code and output", txt)
	}
	var rf struct {
		Content  string `json:"content"`
		Encoding string `json:"encoding"`
		Size     int64  `json:"size"`
	}
	mustCall(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/work/out.txt"}, &rf)
	if rf.Content != "sum=42\n" || rf.Encoding != "utf8" || rf.Size != 7 {
		t.Fatalf("read_file: %+v: want sum=42", rf)
	}
	var ls struct {
		Entries []struct {
			Name, Type string
			Size       int64
		} `json:"entries"`
	}
	mustCall(t, cs, "list_files", map[string]any{"sandbox_id": id, "path": "/work"}, &ls)
	if len(ls.Entries) != 2 || ls.Entries[0].Name != "job.sh" || ls.Entries[1].Name != "out.txt" || ls.Entries[1].Type != "file" {
		t.Fatalf("list_files /work: %+v", ls.Entries)
	}

	// Long output keeps its ends and says what was cut.
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo first; yes line | head -c 200000; echo; echo last"}, &run)
	if run.CutBytes == 0 || !strings.HasPrefix(run.Stdout, "first\n") || !strings.HasSuffix(run.Stdout, "last\n") || !strings.Contains(run.Stdout, "bytes cut") {
		t.Fatalf("long output: cut %d, stdout %d bytes starting %q: want its ends and a note", run.CutBytes, len(run.Stdout), run.Stdout[:min(len(run.Stdout), 40)])
	}
	// A timeout kills the command and is a result, not an error.
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo started; sleep 30", "timeout_seconds": 1}, &run)
	if !run.TimedOut || run.ExitCode != 124 || run.Stdout != "started\n" {
		t.Fatalf("timeout: %+v: want timed_out, exit 124 and the output so far", run)
	}
	// run_code with an interpreter the image lacks is a clear tool error;
	// the busybox image has no bash.
	wantToolError(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "bash", "code": "echo hi"}, "bash is not installed")

	// A background server, its log, and its port on the host.
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/www/index.html", "content": "hello from the sandbox\n"}, nil)
	var proc struct {
		Pid int `json:"pid"`
	}
	mustCall(t, cs, "start_process", map[string]any{"sandbox_id": id, "command": "echo serving; exec httpd -f -p 8080 -h /www"}, &proc)
	if proc.Pid <= 0 {
		t.Fatalf("start_process: pid %d", proc.Pid)
	}
	var logs struct {
		Log string `json:"log"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mustCall(t, cs, "read_logs", map[string]any{"sandbox_id": id, "pid": proc.Pid}, &logs)
		if strings.Contains(logs.Log, " "+strconv.Itoa(proc.Pid)+" serving") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("read_logs: %q: want the process's line", logs.Log)
		}
	}
	var exp struct {
		URL string `json:"url"`
	}
	mustCall(t, cs, "expose_port", map[string]any{"sandbox_id": id, "port": 8080}, &exp)
	if !strings.HasPrefix(exp.URL, "http://127.0.0.1:") {
		t.Fatalf("expose_port: url %q", exp.URL)
	}
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if body, err = get(exp.URL + "/index.html"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", exp.URL, err)
		}
	}
	if body != "hello from the sandbox\n" {
		t.Fatalf("GET %s: %q", exp.URL, body)
	}

	// Snapshot, and a new sandbox from it has the files.
	var snap struct {
		Image string `json:"image"`
	}
	mustCall(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": id, "name": "mcp-test:step1"}, &snap)
	if snap.Image == "" {
		t.Fatal("snapshot_sandbox: no image")
	}
	var sb2 mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": snap.Image, "lifetime_seconds": 600}, &sb2)
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb2.SandboxID, "command": "cat /work/out.txt"}, &run)
	if run.Stdout != "sum=42\n" {
		t.Fatalf("sandbox from snapshot %s: /work/out.txt %q", snap.Image, run.Stdout)
	}

	// Pause and resume keep the sandbox's files.
	var st mcpSandbox
	mustCall(t, cs, "pause_sandbox", map[string]any{"sandbox_id": sb2.SandboxID}, &st)
	if st.State != "paused" {
		t.Fatalf("pause_sandbox: state %q", st.State)
	}
	wantToolError(t, cs, "run_command", map[string]any{"sandbox_id": sb2.SandboxID, "command": "true"}, "paused")
	mustCall(t, cs, "resume_sandbox", map[string]any{"sandbox_id": sb2.SandboxID}, &st)
	if st.State != "running" {
		t.Fatalf("resume_sandbox: state %q", st.State)
	}
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb2.SandboxID, "command": "cat /work/out.txt"}, &run)
	if run.Stdout != "sum=42\n" {
		t.Fatalf("after resume: /work/out.txt %q", run.Stdout)
	}

	// The server sees only its own sandboxes.
	other := e.run(nil, "create", "--image", "busybox")
	if other.code != 0 {
		t.Fatalf("hutch create: %s", other)
	}
	otherID := strings.TrimSpace(other.stdout)
	if l := mcpList(t, cs); len(l) != 2 {
		t.Fatalf("list_sandboxes: %+v: want the server's two sandboxes only", l)
	}
	wantToolError(t, cs, "remove_sandbox", map[string]any{"sandbox_id": otherID}, "no sandbox")
	wantToolError(t, cs, "run_command", map[string]any{"sandbox_id": otherID, "command": "true"}, "no sandbox")

	mustCall(t, cs, "remove_sandbox", map[string]any{"sandbox_id": id}, nil)
	mustCall(t, cs, "remove_sandbox", map[string]any{"sandbox_id": sb2.SandboxID}, nil)
	if l := mcpList(t, cs); len(l) != 0 {
		t.Fatalf("list_sandboxes after remove: %+v", l)
	}
	if r := e.run(nil, "inspect", otherID); r.code != 0 {
		t.Fatalf("the sandbox the server does not own is gone: %s", r)
	}
	if _, err := get(exp.URL); err == nil {
		t.Errorf("%s still answers after its sandbox was removed", exp.URL)
	}
}

// TestMCPBadArgumentsHTTP drives `hutch mcp --transport http` with the Go
// SDK's streamable client: bad arguments come back as tool errors and the
// server keeps serving; host transfers stay inside the allowed directory.
func TestMCPBadArgumentsHTTP(t *testing.T) {
	e := newEnv(t)
	hostDir := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(hostDir, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostDir, "input.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cs, _ := mcpServeHTTP(t, e, "--allow-host-dir", hostDir, "--default-timeout", "10m")

	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	id := sb.SandboxID

	for _, c := range []struct {
		name string
		tool string
		args map[string]any
		want string
	}{
		{"missing field", "run_command", map[string]any{"sandbox_id": id}, "command"},
		{"wrong type", "run_command", map[string]any{"sandbox_id": id, "command": "true", "timeout_seconds": "ten"}, "timeout_seconds"},
		{"unknown field", "read_file", map[string]any{"sandbox_id": id, "path": "/etc/hostname", "bogus": 1}, "bogus"},
		{"unknown sandbox", "read_file", map[string]any{"sandbox_id": "no-such-sandbox", "path": "/etc/hostname"}, "no sandbox \"no-such-sandbox\""},
		{"bad network", "create_sandbox", map[string]any{"image": "busybox", "network": "wide"}, "network"},
		{"relative sandbox path", "read_file", map[string]any{"sandbox_id": id, "path": "etc/passwd"}, "absolute path"},
		{"missing file", "read_file", map[string]any{"sandbox_id": id, "path": "/no/such/file"}, "/no/such/file"},
		{"host path with ..", "upload_file", map[string]any{"sandbox_id": id, "host_path": "../" + filepath.Base(outside) + "/secret", "path": "/tmp/x"}, "outside the allowed directory"},
		{"absolute host path outside", "upload_file", map[string]any{"sandbox_id": id, "host_path": filepath.Join(outside, "secret"), "path": "/tmp/x"}, "outside the allowed directory"},
		{"host symlink out", "upload_file", map[string]any{"sandbox_id": id, "host_path": "escape/secret", "path": "/tmp/x"}, "outside the allowed directory"},
		{"download through a symlink", "download_file", map[string]any{"sandbox_id": id, "host_path": "escape/stolen", "path": "/etc/hostname"}, "outside the allowed directory"},
		{"bad timeout", "run_command", map[string]any{"sandbox_id": id, "command": "true", "timeout_seconds": -1}, "timeout_seconds"},
		{"bad port", "expose_port", map[string]any{"sandbox_id": id, "port": 70000}, "port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantToolError(t, cs, c.tool, c.args, c.want)
			// The server keeps serving.
			if l := mcpList(t, cs); len(l) != 1 {
				t.Fatalf("list_sandboxes after the error: %+v", l)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(outside, "stolen")); err == nil {
		t.Fatal("download_file wrote outside the allowed directory")
	}

	// Inside the allowed directory, transfers work both ways.
	mustCall(t, cs, "upload_file", map[string]any{"sandbox_id": id, "host_path": "input.txt", "path": "/data.txt"}, nil)
	var run mcpRun
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "cat /data.txt; echo result > /result.txt"}, &run)
	if run.Stdout != "from the host\n" {
		t.Fatalf("uploaded file reads %q", run.Stdout)
	}
	mustCall(t, cs, "download_file", map[string]any{"sandbox_id": id, "host_path": "result.txt", "path": "/result.txt"}, nil)
	if got := readFile(filepath.Join(hostDir, "result.txt")); got != "result\n" {
		t.Fatalf("downloaded file reads %q", got)
	}
	// A download into a directory that does not exist says so.
	wantToolError(t, cs, "download_file", map[string]any{"sandbox_id": id, "host_path": "no-dir/result.txt", "path": "/result.txt"}, "does not exist")
}

// inspector runs the pinned MCP Inspector in CLI mode with args and
// returns its stdout, the JSON answer.
func inspector(t *testing.T, e *env, args ...string) string {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join(mcpInspectorDir, "node_modules", ".bin", "mcp-inspector"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("MCP Inspector not installed (make mcp-inspector): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--cli"}, args...)...)
	cmd.Env = append(os.Environ(), "HUTCH_ROOT="+e.root)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("mcp-inspector %v: %v\nstdout: %s\nstderr: %s", args, err, out.String(), errb.String())
	}
	return out.String()
}

// TestMCPInspector drives `hutch mcp` with the MCP Inspector's CLI, over
// stdio and over streamable HTTP: it lists the tools and calls them.
func TestMCPInspector(t *testing.T) {
	e := newEnv(t)
	hutch := filepath.Join(e.bin, "hutch")
	stdio := []string{"-e", "HUTCH_ROOT=" + e.root, hutch, "mcp", "--owner", "inspector-test"}

	var list struct {
		Tools []struct {
			Name        string         `json:"name"`
			InputSchema map[string]any `json:"inputSchema"`
		} `json:"tools"`
	}
	if err := json.Unmarshal([]byte(inspector(t, e, append(stdio, "--method", "tools/list")...)), &list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tool := range list.Tools {
		if tool.Name == "create_sandbox" {
			found = true
			if fmt.Sprint(tool.InputSchema["type"]) != "object" {
				t.Errorf("create_sandbox input schema %v", tool.InputSchema)
			}
		}
	}
	if len(list.Tools) < 17 || !found {
		t.Fatalf("tools/list over stdio: %d tools, create_sandbox %v", len(list.Tools), found)
	}

	type result struct {
		IsError           bool            `json:"isError"`
		StructuredContent json.RawMessage `json:"structuredContent"`
		Content           []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	call := func(args ...string) result {
		t.Helper()
		var r result
		out := inspector(t, e, args...)
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return r
	}
	// Each stdio call is a new server process; --owner makes them one
	// owner, so the second sees the first's sandbox.
	r := call(append(stdio, "--method", "tools/call", "--tool-name", "create_sandbox", "--tool-arg", "image=busybox")...)
	var sb mcpSandbox
	if err := json.Unmarshal(r.StructuredContent, &sb); r.IsError || err != nil || sb.SandboxID == "" {
		t.Fatalf("create_sandbox through the inspector: %+v %v", r, err)
	}
	r = call(append(stdio, "--method", "tools/call", "--tool-name", "run_command", "--tool-arg", "sandbox_id="+sb.SandboxID, "command=echo hi from inspector")...)
	var run mcpRun
	if err := json.Unmarshal(r.StructuredContent, &run); r.IsError || err != nil || run.Stdout != "hi from inspector\n" {
		t.Fatalf("run_command through the inspector: %+v %v", r, err)
	}
	r = call(append(stdio, "--method", "tools/call", "--tool-name", "run_command", "--tool-arg", "sandbox_id=nope", "command=ls")...)
	if !r.IsError || len(r.Content) == 0 || !strings.Contains(r.Content[0].Text, "no sandbox") {
		t.Fatalf("unknown sandbox through the inspector: %+v", r)
	}

	// Over streamable HTTP, against a running server.
	cs, url := mcpServeHTTP(t, e, "--owner", "inspector-test")
	auth := "Authorization: Bearer " + mcpToken(t, e)
	r = call(url, "--transport", "http", "--header", auth, "--method", "tools/call", "--tool-name", "list_sandboxes")
	var l struct {
		Sandboxes []mcpSandbox `json:"sandboxes"`
	}
	if err := json.Unmarshal(r.StructuredContent, &l); r.IsError || err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].SandboxID != sb.SandboxID {
		t.Fatalf("list_sandboxes over HTTP through the inspector: %+v %v", r, err)
	}
	if err := json.Unmarshal([]byte(inspector(t, e, url, "--transport", "http", "--header", auth, "--method", "tools/list")), &list); err != nil || len(list.Tools) < 17 {
		t.Fatalf("tools/list over HTTP: %d tools, %v", len(list.Tools), err)
	}
	r = call(url, "--transport", "http", "--header", auth, "--method", "tools/call", "--tool-name", "remove_sandbox", "--tool-arg", "sandbox_id="+sb.SandboxID)
	if r.IsError {
		t.Fatalf("remove_sandbox over HTTP: %+v", r)
	}
	if got := mcpList(t, cs); len(got) != 0 {
		t.Fatalf("list_sandboxes after remove: %+v", got)
	}
}

// TestMCPPython is the flow on the default image: write a Python
// file, run it, read the file it wrote; run_code in python and node. It
// shares the state root in which base is built once per test process.
func TestMCPPython(t *testing.T) {
	e := newEnv(t)
	e.root = baseArchive(t)
	cs := mcpServe(t, e)

	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", nil, &sb)
	if sb.Image != "base:latest" {
		t.Fatalf("default image %q: want base:latest", sb.Image)
	}
	id := sb.SandboxID
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/work/main.py",
		"content": "import json\nprimes = [n for n in range(2, 30) if all(n % d for d in range(2, n))]\njson.dump(primes, open('/work/out.json', 'w'))\nprint(len(primes), 'primes')\n"}, nil)
	var run mcpRun
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "cd /work && python3 main.py"}, &run)
	if run.ExitCode != 0 || run.Stdout != "10 primes\n" {
		t.Fatalf("python3 main.py: %+v", run)
	}
	var rf struct {
		Content string `json:"content"`
	}
	mustCall(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/work/out.json"}, &rf)
	if rf.Content != "[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]" {
		t.Fatalf("out.json: %q", rf.Content)
	}
	mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "python", "code": "import sys\nprint(sum(range(10)))\nsys.exit(2)\n"}, &run)
	if run.ExitCode != 2 || run.Stdout != "45\n" {
		t.Fatalf("run_code python: %+v", run)
	}
	mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "node", "code": "console.log([1,2,3].map(x => x * 2).join(','))"}, &run)
	if run.ExitCode != 0 || run.Stdout != "2,4,6\n" {
		t.Fatalf("run_code node: %+v", run)
	}
	mustCall(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "bash", "code": "echo ${BASH_VERSION%%.*}"}, &run)
	if run.ExitCode != 0 || strings.TrimSpace(run.Stdout) == "" {
		t.Fatalf("run_code bash: %+v", run)
	}
	mustCall(t, cs, "remove_sandbox", map[string]any{"sandbox_id": id}, nil)
}

// mcpServeRemote starts `hutch mcp --server URL --api-key KEY` over stdio
// with the Go SDK's client. It runs on a state root of its own: its
// sandboxes are the server's, not that root's.
func mcpServeRemote(t *testing.T, srv *server, key string, flags ...string) *sdk.ClientSession {
	t.Helper()
	e := newEnv(t)
	return mcpServe(t, e, append([]string{"--server", srv.url(""), "--api-key", key}, flags...)...)
}

// TestMCPRemote drives `hutch mcp --server` backed by a real `hutch serve`
// with a tenant: the agent flow on busybox through the server's API, a
// port URL routed by the server, tool errors for an unknown sandbox and a
// wrong API key.
func TestMCPRemote(t *testing.T) {
	srv := newServer(t, "")
	key := srv.tenantAdd("agents")
	other := srv.tenantAdd("others")
	srv.serve()
	hostDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(hostDir, "input.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cs := mcpServeRemote(t, srv, key, "--owner", "remote-test", "--default-timeout", "10m", "--allow-host-dir", hostDir)

	var sb mcpSandbox
	start := time.Now()
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	t.Logf("create_sandbox through hutch serve: %s", time.Since(start).Round(time.Millisecond))
	if sb.SandboxID == "" || sb.State != "running" || sb.ExpiresAt == "" {
		t.Fatalf("create_sandbox: %+v: want a running sandbox with a lifetime", sb)
	}
	if exp, err := time.Parse(time.RFC3339, sb.ExpiresAt); err != nil || time.Until(exp) < 8*time.Minute || time.Until(exp) > 11*time.Minute {
		t.Errorf("expires_at %s: want --default-timeout 10m from now", sb.ExpiresAt)
	}
	id := sb.SandboxID
	// The sandbox is the tenant's on the server, labelled as the MCP
	// server's.
	r := srv.do("GET", "/sandboxes/"+id, nil, map[string]string{"X-API-Key": key})
	if r.status != 200 || !strings.Contains(r.body, `"hutch.mcp/owner":"remote-test"`) {
		t.Fatalf("GET /sandboxes/%s as the tenant: %s: want its owner metadata", id, r)
	}

	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/work/job.sh",
		"content": "echo \"sum=$((6*7))\" > /work/out.txt\necho ran; echo oops >&2; exit 3\n"}, nil)
	var run mcpRun
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "sh /work/job.sh"}, &run)
	if run.ExitCode != 3 || run.Stdout != "ran\n" || run.Stderr != "oops\n" {
		t.Fatalf("run_command: %+v: want exit 3, stdout ran, stderr oops", run)
	}
	var rf struct {
		Content string `json:"content"`
		Size    int64  `json:"size"`
	}
	mustCall(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/work/out.txt"}, &rf)
	if rf.Content != "sum=42\n" || rf.Size != 7 {
		t.Fatalf("read_file: %+v: want sum=42", rf)
	}
	var ls struct {
		Entries []struct{ Name, Type string } `json:"entries"`
	}
	mustCall(t, cs, "list_files", map[string]any{"sandbox_id": id, "path": "/work"}, &ls)
	if len(ls.Entries) != 2 || ls.Entries[0].Name != "job.sh" || ls.Entries[1].Name != "out.txt" || ls.Entries[1].Type != "file" {
		t.Fatalf("list_files /work: %+v", ls.Entries)
	}
	// stdin, and a timeout that kills the command and is a result.
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "tr a-z A-Z", "stdin": "quiet\n"}, &run)
	if run.ExitCode != 0 || run.Stdout != "QUIET\n" {
		t.Fatalf("run_command with stdin: %+v", run)
	}
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo started; sleep 30", "timeout_seconds": 1}, &run)
	if !run.TimedOut || run.ExitCode != 124 || run.Stdout != "started\n" {
		t.Fatalf("timeout: %+v: want timed_out, exit 124 and the output so far", run)
	}
	wantToolError(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "bash", "code": "echo hi"}, "bash is not installed")
	mustCall(t, cs, "remove_file", map[string]any{"sandbox_id": id, "path": "/work/job.sh"}, nil)

	// A background server, its output, and its port through the server.
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/www/index.html", "content": "hello from the sandbox\n"}, nil)
	var proc struct {
		Pid int `json:"pid"`
	}
	mustCall(t, cs, "start_process", map[string]any{"sandbox_id": id, "command": "echo serving; exec httpd -f -p 8080 -h /www"}, &proc)
	var logs struct {
		Log string `json:"log"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mustCall(t, cs, "read_logs", map[string]any{"sandbox_id": id, "pid": proc.Pid}, &logs)
		if strings.Contains(logs.Log, " "+strconv.Itoa(proc.Pid)+" serving") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("read_logs: %q: want the process's line", logs.Log)
		}
	}
	var exp struct {
		URL     string            `json:"url"`
		Headers map[string]string `json:"headers"`
	}
	mustCall(t, cs, "expose_port", map[string]any{"sandbox_id": id, "port": 8080}, &exp)
	wantURL := fmt.Sprintf("http://8080-%s.%s:%d", id, serveDomain, srv.port)
	if exp.URL != wantURL || exp.Headers["E2b-Sandbox-Id"] != id {
		t.Fatalf("expose_port: %+v: want %s and the routing headers", exp, wantURL)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := srv.do("GET", "/index.html", nil, map[string]string{"Host": strings.TrimPrefix(exp.URL, "http://")})
		if r.status == 200 && r.body == "hello from the sandbox\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s/index.html through the server: %s", exp.URL, r)
		}
	}

	var snap struct {
		Image string `json:"image"`
	}
	mustCall(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": id, "name": "mcp-remote"}, &snap)
	if snap.Image == "" {
		t.Fatal("snapshot_sandbox: no image")
	}
	var sb2 mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": snap.Image, "lifetime_seconds": 300}, &sb2)
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb2.SandboxID, "command": "cat /work/out.txt"}, &run)
	if run.Stdout != "sum=42\n" {
		t.Fatalf("sandbox from snapshot %s: /work/out.txt %q", snap.Image, run.Stdout)
	}
	if l := mcpList(t, cs); len(l) != 2 {
		t.Fatalf("list_sandboxes: %+v: want the two sandboxes", l)
	}

	// Host transfers through the server's /files, inside the allowed
	// directory only.
	mustCall(t, cs, "upload_file", map[string]any{"sandbox_id": sb2.SandboxID, "host_path": "input.txt", "path": "/work"}, nil)
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb2.SandboxID, "command": "cat /work/input.txt; echo result > /result.txt"}, &run)
	if run.Stdout != "from the host\n" {
		t.Fatalf("uploaded file reads %q", run.Stdout)
	}
	mustCall(t, cs, "download_file", map[string]any{"sandbox_id": sb2.SandboxID, "host_path": "result.txt", "path": "/result.txt"}, nil)
	if got := readFile(filepath.Join(hostDir, "result.txt")); got != "result\n" {
		t.Fatalf("downloaded file reads %q", got)
	}
	wantToolError(t, cs, "upload_file", map[string]any{"sandbox_id": sb2.SandboxID, "host_path": "../x", "path": "/x"}, "outside the allowed directory")

	// Another tenant's sandbox, and an unknown one, are not there.
	theirs := srv.createSandbox(other, "busybox")
	wantToolError(t, cs, "run_command", map[string]any{"sandbox_id": theirs.SandboxID, "command": "true"}, "no sandbox")
	wantToolError(t, cs, "read_file", map[string]any{"sandbox_id": "no-such-sandbox", "path": "/etc/hostname"}, `no sandbox "no-such-sandbox"`)
	wantToolError(t, cs, "create_sandbox", map[string]any{"image": "busybox", "cpus": 2}, "cpus is not supported")

	// A wrong key is a tool error that says so; the server goes on.
	bad := mcpServeRemote(t, srv, "e2b_wrong")
	wantToolError(t, bad, "create_sandbox", map[string]any{"image": "busybox"}, "refused the API key")
	wantToolError(t, bad, "list_sandboxes", nil, "refused the API key")

	mustCall(t, cs, "remove_sandbox", map[string]any{"sandbox_id": id}, nil)
	mustCall(t, cs, "remove_sandbox", map[string]any{"sandbox_id": sb2.SandboxID}, nil)
	if l := mcpList(t, cs); len(l) != 0 {
		t.Fatalf("list_sandboxes after remove: %+v", l)
	}
	wantToolError(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "true"}, "no sandbox")
	if r := srv.do("DELETE", "/sandboxes/"+theirs.SandboxID, nil, map[string]string{"X-API-Key": other}); r.status != 204 && r.status != 200 {
		t.Errorf("removing the other tenant's sandbox: %s", r)
	}
	if r := srv.do("DELETE", "/templates/"+snap.Image, nil, map[string]string{"X-API-Key": key}); r.status >= 300 {
		t.Logf("removing the snapshot: %s", r)
	}
	srv.stopAndCheckClean()
}

// TestMCPRemotePauseResume pauses and resumes a sandbox through
// `hutch mcp --server`: a paused sandbox is a tool error until it is
// resumed, with its files.
func TestMCPRemotePauseResume(t *testing.T) {
	srv := newServer(t, "")
	key := srv.tenantAdd("agents")
	srv.serve()
	cs := mcpServeRemote(t, srv, key)

	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	id := sb.SandboxID
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/work/kept.txt", "content": "kept\n"}, nil)
	var st mcpSandbox
	mustCall(t, cs, "pause_sandbox", map[string]any{"sandbox_id": id}, &st)
	if st.State != "paused" || st.ExpiresAt != "" {
		t.Fatalf("pause_sandbox: %+v: want paused with no lifetime running", st)
	}
	wantToolError(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "true"}, "paused")
	start := time.Now()
	mustCall(t, cs, "resume_sandbox", map[string]any{"sandbox_id": id}, &st)
	t.Logf("resume_sandbox through hutch serve: %s", time.Since(start).Round(time.Millisecond))
	if st.State != "running" || st.ExpiresAt == "" {
		t.Fatalf("resume_sandbox: %+v", st)
	}
	var run mcpRun
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "cat /work/kept.txt"}, &run)
	if run.Stdout != "kept\n" {
		t.Fatalf("after resume: /work/kept.txt %q", run.Stdout)
	}
	mustCall(t, cs, "remove_sandbox", map[string]any{"sandbox_id": id}, nil)
	srv.stopAndCheckClean()
}
