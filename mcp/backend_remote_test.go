package mcp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/engine"
)

// newRemoteTestServer serves a Server backed by a remote server at url.
func newRemoteTestServer(t *testing.T, url string, cfg Config) (*Server, *sdk.ClientSession) {
	t.Helper()
	cfg.Remote = &client.Client{APIURL: url, APIKey: "e2b_test"}
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

func TestBackendSelection(t *testing.T) {
	eng, err := engine.Open(engine.Options{Root: t.TempDir(), RunscPath: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	remote := &client.Client{APIURL: "http://127.0.0.1:1"}
	for _, cfg := range []Config{
		{},
		{Engine: eng, Remote: remote},
		{Remote: &client.Client{}},
	} {
		if _, err := New(cfg); !errorIs(err, errdefs.ErrInvalidArgument) {
			t.Errorf("New(engine %v, remote %+v) = %v: want invalid", cfg.Engine != nil, cfg.Remote, err)
		}
	}
	s, err := New(Config{Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.be.(*engineBackend); !ok {
		t.Errorf("with an engine the backend is %T", s.be)
	}
	s, err = New(Config{Remote: remote})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.be.(*remoteBackend); !ok {
		t.Errorf("with a remote server the backend is %T", s.be)
	}
}

func TestRemoteCreateRequest(t *testing.T) {
	s, err := New(Config{Remote: &client.Client{APIURL: "http://127.0.0.1:1"}, Owner: "agent-1", DefaultLifetime: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	b := s.be.(*remoteBackend)
	req, err := b.remoteCreate(createArgs{Image: "busybox", Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if req.TemplateID != "busybox" || req.Timeout != 600 || req.AutoPause || req.Metadata[OwnerLabel] != "agent-1" || req.EnvVars["A"] != "1" {
		t.Errorf("request %+v: want busybox, the default lifetime, no auto-pause, the owner", req)
	}
	if req.AllowInternetAccess == nil || *req.AllowInternetAccess || req.Network != nil {
		t.Errorf("default network: %+v: want internet access off", req)
	}
	req, err = b.remoteCreate(createArgs{LifetimeSecond: 90, Network: "allow", Allow: []string{"pypi.org:443"}})
	if err != nil || req.TemplateID != "base" || req.Timeout != 90 || req.Network == nil || !slices.Equal(req.Network.AllowOut, []string{"pypi.org:443"}) ||
		!slices.Equal(req.Network.DenyOut, []string{"0.0.0.0/0"}) {
		t.Errorf("allow: request %+v %+v, %v", req, req.Network, err)
	}
	req, _ = b.remoteCreate(createArgs{Network: "open"})
	if req.AllowInternetAccess == nil || !*req.AllowInternetAccess {
		t.Errorf("open: %+v: want internet access", req)
	}
	for _, a := range []createArgs{{CPUs: 1}, {MemoryMB: 512}, {Name: "x"}} {
		if _, err := b.remoteCreate(a); !errorIs(err, errdefs.ErrNotImplemented) {
			t.Errorf("remoteCreate(%+v) = %v: want not implemented", a, err)
		}
	}
}

// A server refusing the key, and one that is not there, are tool errors
// that say so; arguments are checked before any call.
func TestRemoteToolErrors(t *testing.T) {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"code":401,"message":"invalid API key"}`))
	}))
	defer api.Close()
	_, cs := newRemoteTestServer(t, api.URL, Config{})
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	_, csGone := newRemoteTestServer(t, gone.URL, Config{})
	ctx := context.Background()
	for _, c := range []struct {
		cs   *sdk.ClientSession
		tool string
		args map[string]any
		want string
	}{
		{cs, toolCreate, map[string]any{"image": "busybox"}, "refused the API key"},
		{cs, toolSandboxes, nil, "refused the API key"},
		{cs, toolRun, map[string]any{"sandbox_id": "x", "command": "ls"}, "refused the API key"},
		{csGone, toolSandboxes, nil, "cannot reach the hutch server"},
		{cs, toolCreate, map[string]any{"network": "wide"}, "network"},
		{cs, toolRun, map[string]any{"sandbox_id": "", "command": "ls"}, "sandbox_id is empty"},
		{cs, toolRead, map[string]any{"sandbox_id": "x", "path": "relative"}, "absolute path"},
		{cs, toolExpose, map[string]any{"sandbox_id": "x", "port": 0}, "port 0"},
	} {
		res, err := c.cs.CallTool(ctx, &sdk.CallToolParams{Name: c.tool, Arguments: c.args})
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
	if n := calls.Load(); n != 3 {
		t.Errorf("the server got %d calls: want 3, bad arguments refused before any", n)
	}
}

func TestRemoteExposeURL(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/sandboxes/sb1":
			w.Write([]byte(`{"sandboxID":"sb1","templateID":"busybox","state":"running","metadata":{"hutch.mcp/owner":"me"}}`))
		case r.Method == http.MethodGet && r.URL.Path == "/sandboxes/sb2":
			w.Write([]byte(`{"sandboxID":"sb2","templateID":"busybox","state":"running","metadata":{"hutch.mcp/owner":"someone"}}`))
		case r.Method == http.MethodPost && r.URL.Path == "/v2/sandboxes/sb1/connect":
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"sandboxID":"sb1","templateID":"busybox","envdAccessToken":"t","domain":"hutch.example.test"}`))
		default:
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"code":404,"message":"not found"}`))
		}
	}))
	defer api.Close()
	s, _ := newRemoteTestServer(t, api.URL, Config{Owner: "me"})
	ctx := context.Background()
	res, err := s.be.expose(ctx, "sb1", 8080, 0)
	port := api.URL[strings.LastIndex(api.URL, ":")+1:]
	if err != nil || res.URL != "http://8080-sb1.hutch.example.test:"+port || res.Headers["E2b-Sandbox-Id"] != "sb1" || res.Headers["E2b-Sandbox-Port"] != "8080" {
		t.Errorf("expose: %+v, %v", res, err)
	}
	if _, err := s.be.expose(ctx, "sb1", 8080, 9000); !errorIs(err, errdefs.ErrInvalidArgument) {
		t.Errorf("expose with a host port: %v: want invalid", err)
	}
	if _, err := s.be.expose(ctx, "sb2", 8080, 0); !errorIs(err, errdefs.ErrNotFound) {
		t.Errorf("expose on another owner's sandbox: %v: want not found", err)
	}
}
