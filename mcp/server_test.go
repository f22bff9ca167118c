package mcp

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hutch.dev/hutch/engine"
)

func errorIs(err, target error) bool { return err != nil && errors.Is(err, target) }

// newTestServer serves a Server on an engine with an empty state root,
// which runs nothing: the calls below fail before they would start a
// sandbox.
func newTestServer(t *testing.T, cfg Config) (*Server, *sdk.ClientSession) {
	t.Helper()
	eng, err := engine.Open(engine.Options{Root: t.TempDir(), RunscPath: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Engine = eng
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	st, ct := sdk.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return s, cs
}

func TestToolsList(t *testing.T) {
	_, cs := newTestServer(t, Config{})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*sdk.Tool{}
	for _, tool := range res.Tools {
		byName[tool.Name] = tool
	}
	for _, name := range []string{toolCreate, toolRun, toolRunCode, toolRead, toolWrite, toolList, toolRemoveFile, toolUpload,
		toolDownload, toolStart, toolLogs, toolExpose, toolSnapshot, toolPause, toolResume, toolSandboxes, toolRemove} {
		tool := byName[name]
		if tool == nil {
			t.Errorf("no tool %s", name)
			continue
		}
		if len(tool.Description) < 40 {
			t.Errorf("%s: description %q is too short to tell a model what it does", name, tool.Description)
		}
	}
	schema := byName[toolCreate].InputSchema.(map[string]any)
	network := schema["properties"].(map[string]any)["network"].(map[string]any)
	if got := network["enum"]; len(got.([]any)) != 3 {
		t.Errorf("create_sandbox network enum %v: want none, open, allow", got)
	}
	run := byName[toolRun].InputSchema.(map[string]any)
	if req := run["required"].([]any); !slices.Contains(req, any("sandbox_id")) || !slices.Contains(req, any("command")) {
		t.Errorf("run_command required %v: want sandbox_id and command", req)
	}
}

// Bad calls come back as tool errors naming what was wrong, and the
// server keeps answering.
func TestToolErrors(t *testing.T) {
	_, cs := newTestServer(t, Config{})
	ctx := context.Background()
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{toolRun, map[string]any{"sandbox_id": "x"}, "command"},
		{toolRun, map[string]any{"sandbox_id": "x", "command": "ls", "timeout_seconds": "ten"}, "timeout_seconds"},
		{toolRun, map[string]any{"sandbox_id": "x", "command": "ls", "timeout_seconds": 999999}, "timeout_seconds 999999"},
		{toolRun, map[string]any{"sandbox_id": "nope", "command": "ls"}, `no sandbox "nope"`},
		{toolRun, map[string]any{"sandbox_id": "", "command": "ls"}, "sandbox_id is empty"},
		{toolRun, map[string]any{"sandbox_id": "x", "command": "  "}, "command is empty"},
		{toolRunCode, map[string]any{"sandbox_id": "x", "language": "ruby", "code": "p 1"}, "language"},
		{toolCreate, map[string]any{"network": "wide"}, "network"},
		{toolCreate, map[string]any{"network": "allow"}, "needs at least one destination"},
		{toolCreate, map[string]any{"allow": []string{"pypi.org"}}, "only for network \"allow\""},
		{toolCreate, map[string]any{"lifetime_seconds": 86401}, "lifetime_seconds"},
		{toolCreate, map[string]any{"memory_mb": -1}, "memory_mb"},
		{toolCreate, map[string]any{"env": map[string]any{"A=B": "c"}}, "env name"},
		{toolRead, map[string]any{"sandbox_id": "x", "path": "relative"}, "absolute path"},
		{toolRead, map[string]any{"sandbox_id": "x", "path": "/a", "max_bytes": 1 << 30}, "max_bytes"},
		{toolWrite, map[string]any{"sandbox_id": "x", "path": "/a", "content": "!!", "encoding": "base64"}, "base64"},
		{toolWrite, map[string]any{"sandbox_id": "x", "path": "/a", "content": "", "mode": "999"}, "mode"},
		{toolRemoveFile, map[string]any{"sandbox_id": "x", "path": "/"}, "refusing"},
		{toolUpload, map[string]any{"sandbox_id": "x", "host_path": "a", "path": "/a"}, "--allow-host-dir"},
		{toolDownload, map[string]any{"sandbox_id": "x", "host_path": "a", "path": "/a"}, "--allow-host-dir"},
		{toolExpose, map[string]any{"sandbox_id": "x", "port": 0}, "port 0"},
		{toolLogs, map[string]any{"sandbox_id": "x", "lines": -3}, "lines"},
		{toolSnapshot, map[string]any{"sandbox_id": "x", "name": "busybox"}, "built-in"},
		{toolRemove, map[string]any{"sandbox_id": "nope"}, "no sandbox"},
	} {
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Fatalf("%s %v: protocol error %v: want a tool error", c.tool, c.args, err)
		}
		text := ""
		if len(res.Content) > 0 {
			text = res.Content[0].(*sdk.TextContent).Text
		}
		if !res.IsError || !strings.Contains(text, c.want) {
			t.Errorf("%s %v: IsError %v, %q: want a tool error saying %q", c.tool, c.args, res.IsError, text, c.want)
		}
	}
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: toolSandboxes})
	if err != nil || res.IsError {
		t.Fatalf("list_sandboxes after the errors: %v %+v", err, res)
	}
}

func TestCreateRequest(t *testing.T) {
	s, _ := newTestServer(t, Config{Owner: "agent-1", DefaultLifetime: 10 * time.Minute})
	req, err := s.createRequest(createArgs{Image: "busybox", MemoryMB: 256, Env: map[string]string{"B": "2", "A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if req.Image != engine.TestImage || req.Memory != 256<<20 || !slices.Equal(req.Env, []string{"A=1", "B=2"}) {
		t.Errorf("request %+v", req)
	}
	if req.Labels[OwnerLabel] != "agent-1" || req.Timeout != 10*time.Minute || req.OnTimeout != engine.OnTimeoutRemove {
		t.Errorf("owner %q, lifetime %s, on timeout %q: want agent-1, the default 10m, rm", req.Labels[OwnerLabel], req.Timeout, req.OnTimeout)
	}
	req, err = s.createRequest(createArgs{LifetimeSecond: 90, Network: "allow", Allow: []string{"pypi.org:443"}})
	if err != nil || req.Timeout != 90*time.Second || req.Image != "" || req.Network != "allow" {
		t.Errorf("request %+v, %v", req, err)
	}
}

func TestManages(t *testing.T) {
	mine := map[string]string{OwnerLabel: "me"}
	theirs := map[string]string{OwnerLabel: "them"}
	var unlabelled map[string]string
	s := &Server{cfg: Config{Owner: "me"}}
	if !s.manages(mine) || s.manages(theirs) || s.manages(unlabelled) {
		t.Error("a server must manage its own sandboxes only")
	}
	s.cfg.AllSandboxes = true
	if !s.manages(theirs) || !s.manages(unlabelled) {
		t.Error("with AllSandboxes a server manages every sandbox")
	}
}

func TestNewConfig(t *testing.T) {
	eng, err := engine.Open(engine.Options{Root: t.TempDir(), RunscPath: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{
		{},
		{Engine: eng, DefaultLifetime: -time.Second},
		{Engine: eng, DefaultLifetime: 48 * time.Hour},
		{Engine: eng, HostDir: "/no/such/dir"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	a, err := New(Config{Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(Config{Engine: eng})
	if !strings.HasPrefix(a.Owner(), "mcp-") || a.Owner() == b.Owner() {
		t.Errorf("owners %q and %q: want a new one for each server", a.Owner(), b.Owner())
	}
}

func TestFilterLog(t *testing.T) {
	log := "2026-01-01T00:00:00.000000Z init started\n2026-01-01T00:00:01.000000Z 12 serving\n2026-01-01T00:00:02.000000Z 123 other\n"
	if got := filterLog(log, 12); len(got) != 1 || !strings.HasSuffix(got[0], " 12 serving") {
		t.Errorf("pid 12: %q", got)
	}
	if got := filterLog(log, 0); len(got) != 3 {
		t.Errorf("all: %q", got)
	}
	if got := filterLog("", 0); len(got) != 0 {
		t.Errorf("empty log: %q", got)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]uint32{"": 0o644, "0755": 0o755, "600": 0o600} {
		if m, err := parseMode(in); err != nil || uint32(m) != want {
			t.Errorf("parseMode(%q) = %o, %v", in, m, err)
		}
	}
	for _, in := range []string{"0", "8", "01777", "rwx", "-1"} {
		if _, err := parseMode(in); !errorIs(err, errdefs.ErrInvalidArgument) {
			t.Errorf("parseMode(%q) = %v: want invalid", in, err)
		}
	}
}
