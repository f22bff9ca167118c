package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A server without --tenants makes one API key on its first start, prints
// it once, keeps it 0600 under its state root, and takes no call without
// it, in X-API-Key or as a bearer token. The E2B SDK works with it as
// E2B_API_KEY.
func TestServeNoTenantsKey(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	s := newServer(t, baseArchive(t))
	s.noTenants = true
	// The state root is the test process's shared one: a key an earlier
	// run of this test made there would make this start not the first.
	if err := os.Remove(s.apiKeyFile()); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	s.serve()
	if s.apiKey == "" {
		t.Fatalf("the server made no API key in %s\nserver log:\n%s", s.apiKeyFile(), s.logTail(20))
	}
	t.Run("the key file is the owner's only and the first start printed the key and where it is", func(t *testing.T) {
		fi, err := os.Stat(s.apiKeyFile())
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v: want 0600", s.apiKeyFile(), err, fi.Mode().Perm())
		}
		log, _ := os.ReadFile(s.logPath)
		if n := strings.Count(string(log), s.apiKey); n != 1 {
			t.Errorf("the first start printed the key %d times, want once", n)
		}
		if !strings.Contains(string(log), "cat "+s.apiKeyFile()) {
			t.Errorf("the first start did not say how to read the key again:\n%s", log)
		}
	})
	t.Run("no key, a wrong key: 401 in E2B's error shape", func(t *testing.T) {
		for name, h := range map[string]map[string]string{
			"no key":           nil,
			"wrong X-API-Key":  {"X-API-Key": "e2b_" + strings.Repeat("0", 40)},
			"wrong bearer":     {"Authorization": "Bearer e2b_" + strings.Repeat("0", 40)},
			"basic, not a key": {"Authorization": "Basic dXNlcjo="},
		} {
			for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/templates", "/metrics"} {
				r := s.do("GET", path, nil, h)
				if code, msg, err := r.errorBody(); r.status != http.StatusUnauthorized || err != nil || code != 401 || !strings.Contains(msg, "API key") {
					t.Errorf("GET %s with %s: %s, want 401 naming the API key", path, name, r)
				}
			}
		}
		r := s.do("POST", "/sandboxes", strings.NewReader(`{"templateID":"busybox"}`), map[string]string{"Content-Type": "application/json"})
		if r.status != http.StatusUnauthorized {
			t.Errorf("POST /sandboxes without a key: %s, want 401", r)
		}
		if ids := s.sandboxIDs(); len(ids) != 0 {
			t.Errorf("sandboxes after refused creates: %v", ids)
		}
	})
	t.Run("the key opens the API in X-API-Key and as a bearer token, and /metrics", func(t *testing.T) {
		for _, h := range []map[string]string{{"X-API-Key": s.apiKey}, {"Authorization": "Bearer " + s.apiKey}} {
			for _, path := range []string{"/sandboxes", "/metrics"} {
				if r := s.do("GET", path, nil, h); r.status != http.StatusOK {
					t.Errorf("GET %s with %v: %s", path, h, r)
				}
			}
		}
	})
	t.Run("E2B SDK with the key as E2B_API_KEY", func(t *testing.T) {
		s.runScript(t, "commands.mjs", s.apiKey, nil, 3*time.Minute)
	})
	t.Run("a second start prints no key and keeps it", func(t *testing.T) {
		s.stop()
		before, _ := os.ReadFile(s.logPath)
		key := s.apiKey
		s.stopped = false
		s.serve()
		log, _ := os.ReadFile(s.logPath)
		if strings.Contains(string(log[len(before):]), key) {
			t.Error("the second start printed the key again")
		}
		if s.apiKey != key {
			t.Fatalf("the key changed across a restart")
		}
		if r := s.do("GET", "/sandboxes", nil, map[string]string{"X-API-Key": key}); r.status != http.StatusOK {
			t.Errorf("GET /sandboxes with the key after a restart: %s", r)
		}
	})
	s.stopAndCheckClean()
}

// Requests a web page can make a browser send, in plain HTTP: a Host that
// is not the server's (DNS rebinding) answers 421 and one from another
// Origin 403, even with a valid key; a control-plane body that is not
// JSON answers 415.
func TestServeHostileHostOrigin(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	keyA := s.tenantAdd("tenant-a")
	keyB := s.tenantAdd("tenant-b")
	s.serve()
	create := `{"templateID":"busybox","timeout":600}`
	asA := map[string]string{"X-API-Key": keyA, "Content-Type": "application/json"}
	with := func(h map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range h {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	port := fmt.Sprint(s.port)
	t.Run("a Host that is not the server's answers 421, even with a valid key", func(t *testing.T) {
		for _, host := range []string{"attacker.test:" + port, "127.0.0.2:" + port, "localhost:1", "e2e.hutch.test.attacker.test:" + port} {
			for _, c := range []struct{ method, path, body string }{{"GET", "/sandboxes", ""}, {"POST", "/sandboxes", create}, {"GET", "/health", ""}} {
				r := s.do(c.method, c.path, strings.NewReader(c.body), with(asA, "Host", host))
				if code, _, err := r.errorBody(); r.status != http.StatusMisdirectedRequest || err != nil || code != 421 {
					t.Errorf("%s %s for Host %s: %s, want 421", c.method, c.path, host, r)
				}
			}
		}
	})
	t.Run("a request from a page of another origin answers 403, even with a valid key", func(t *testing.T) {
		for _, origin := range []string{"http://127.0.0.2:8000", "http://attacker.test:" + port, "null", "https://e2e.hutch.test.attacker.test"} {
			r := s.do("POST", "/sandboxes", strings.NewReader(create), with(asA, "Origin", origin))
			if code, _, err := r.errorBody(); r.status != http.StatusForbidden || err != nil || code != 403 {
				t.Errorf("POST /sandboxes from Origin %s: %s, want 403", origin, r)
			}
		}
	})
	t.Run("a control-plane body that is not JSON answers 415, even with a valid key", func(t *testing.T) {
		for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"} {
			r := s.do("POST", "/sandboxes", strings.NewReader(create), with(asA, "Content-Type", ct))
			if code, msg, err := r.errorBody(); r.status != http.StatusUnsupportedMediaType || err != nil || code != 415 || !strings.Contains(msg, "application/json") {
				t.Errorf("POST /sandboxes as %s: %s, want 415 naming application/json", ct, r)
			}
		}
	})
	if ids := s.sandboxIDs(); len(ids) != 0 {
		t.Fatalf("refused requests created sandboxes: %v", ids)
	}
	var sbA, sbB createdSandbox
	t.Run("the server's own names and origins are served", func(t *testing.T) {
		r := s.do("POST", "/sandboxes", strings.NewReader(create), with(asA, "Origin", "http://localhost:"+port, "Host", "localhost:"+port))
		if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &sbA) != nil {
			t.Fatalf("POST /sandboxes for localhost from its own origin: %s", r)
		}
		sbB = s.createSandbox(keyB, "busybox")
		h := with(envdHeaders(keyA, sbA), "Host", "49983-"+sbA.SandboxID+"."+serveDomain+":"+port)
		delete(h, "E2b-Sandbox-Id")
		delete(h, "E2b-Sandbox-Port")
		if r := s.do("GET", "/health", nil, h); r.status != http.StatusNoContent {
			t.Errorf("envd's /health by the sandbox's host name: %s, want 204", r)
		}
		if r := s.do("GET", "/health", nil, with(envdHeaders(keyA, sbA), "Host", "attacker.test:"+port)); r.status != http.StatusMisdirectedRequest {
			t.Errorf("envd's /health by its headers for Host attacker.test: %s, want 421", r)
		}
	})
	for key, sb := range map[string]createdSandbox{keyA: sbA, keyB: sbB} {
		if sb.SandboxID != "" {
			if r := s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, map[string]string{"X-API-Key": key}); r.status != http.StatusNoContent {
				t.Errorf("DELETE %s: %s", sb.SandboxID, r)
			}
		}
	}
	s.stopAndCheckClean()
}

// Whoever reaches the server without a key writes a few hundred bytes to
// the audit log per request at most, whatever the path it sends.
func TestServeHostileAuditFlood(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	s.tenantAdd("tenant-a")
	s.serve()
	fi, err := os.Stat(s.audit)
	if err != nil {
		t.Fatal(err)
	}
	before := fi.Size()
	long := strings.Repeat("A", 500<<10)
	for i := range 100 {
		r := s.do("DELETE", fmt.Sprintf("/sandboxes/%d%s", i, long), nil, nil)
		if r.status != http.StatusUnauthorized {
			t.Fatalf("DELETE with a 500 KB path and no key: %s, want 401", r)
		}
	}
	lines, err := s.auditLines()
	if err != nil {
		t.Fatal(err)
	}
	fi, err = os.Stat(s.audit)
	if err != nil {
		t.Fatal(err)
	}
	grown := fi.Size() - before
	t.Logf("100 unauthenticated requests with 500 KB paths grew the audit log by %d bytes (%d lines)", grown, len(lines))
	if grown >= 100<<10 {
		t.Errorf("the audit log grew by %d bytes, want under 100 KiB", grown)
	}
	if len(lines) < 100 {
		t.Fatalf("%d audit lines, want one per refused call", len(lines))
	}
	last := lines[len(lines)-1]
	if last["status"] != float64(401) || last["truncated"] != true || !strings.HasPrefix(last["call"].(string), "DELETE /sandboxes/99AAA") {
		t.Errorf("the last line does not record the truncated refused call: %v", last)
	}
	s.stopAndCheckClean()
}

// Connections that never finish their headers, and ones left idle after
// a request without a key, cannot keep the server from serving a client
// with a key, from the same address, within seconds. The server's open
// files are limited to 1024 (a common default), which the slow clients
// alone would exceed.
func TestServeHostileSlowClients(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	key := s.tenantAdd("tenant-a")
	s.nofile = 1024
	s.serve()
	const slow = 1200
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range slow {
		c, err := net.DialTimeout("tcp", s.addr(), 5*time.Second)
		if err != nil {
			t.Fatalf("slow connection %d: %v", i, err)
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if i%2 == 0 {
			// Headers begun and never ended (slowloris).
			fmt.Fprintf(c, "GET /sandboxes HTTP/1.1\r\nHost: %s\r\nX-Slow: ", s.addr())
			continue
		}
		// A request without a key (answered 401, unread), then the
		// connection kept idle.
		fmt.Fprintf(c, "GET /sandboxes HTTP/1.1\r\nHost: %s\r\n\r\n", s.addr())
	}
	for i := range 3 {
		tr := &http.Transport{}
		cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", s.url("/sandboxes"), nil)
		req.Header.Set("X-API-Key", key)
		start := time.Now()
		resp, err := cl.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("request %d with a key, behind %d slow connections: %v after %s", i+1, slow, err, time.Since(start).Round(time.Millisecond))
		}
		resp.Body.Close()
		cancel()
		tr.CloseIdleConnections()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d with a key: %d", i+1, resp.StatusCode)
		}
		t.Logf("request %d with a key served in %s behind %d slow connections", i+1, time.Since(start).Round(time.Millisecond), slow)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	s.stopAndCheckClean()
}

// GET /metrics names every tenant and its counts: it needs the operator's
// key, and no route answers a tenant with another tenant's name or
// sandboxes.
func TestServeHostileMetrics(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	keyA := s.tenantAdd("tenant-a")
	keyB := s.tenantAdd("tenant-b")
	s.serve()
	sbB := s.createSandbox(keyB, "busybox")
	t.Run("GET /metrics needs the operator key; a tenant's reads no tenant's name or count", func(t *testing.T) {
		r := s.do("GET", "/metrics", nil, nil)
		if r.status != http.StatusUnauthorized {
			t.Errorf("GET /metrics without a key: %s, want 401", r)
		}
		r = s.do("GET", "/metrics", nil, map[string]string{"X-API-Key": keyA})
		if r.status != http.StatusForbidden || strings.Contains(r.body, "tenant-b") || strings.Contains(r.body, "hutch_serve_sandboxes") {
			t.Errorf("GET /metrics with tenant A's key: %s, want 403 naming no tenant", r)
		}
	})
	t.Run("no route answers tenant A with tenant B's name or sandbox", func(t *testing.T) {
		for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/templates", "/snapshots", "/volumes", "/sandboxes/" + sbB.SandboxID, "/sandboxes/" + sbB.SandboxID + "/metrics", "/sandboxes/" + sbB.SandboxID + "/logs", "/nothing"} {
			r := s.do("GET", path, nil, map[string]string{"X-API-Key": keyA})
			// A refusal may quote the ID A asked for; nothing else
			// of B's is in any answer.
			if strings.Contains(r.body, "tenant-b") || (!strings.Contains(path, sbB.SandboxID) && strings.Contains(r.body, sbB.SandboxID)) {
				t.Errorf("GET %s as tenant A names tenant B or its sandbox: %s", path, r)
			}
		}
	})
	t.Run("the operator's key reads every tenant's counts and acts as no tenant", func(t *testing.T) {
		s.stop()
		operatorKey := filepath.Join(t.TempDir(), "operator.key")
		s.flags = []string{"--operator-key-file", operatorKey}
		s.stopped = false
		s.serve()
		opKey, err := os.ReadFile(operatorKey)
		if err != nil {
			t.Fatalf("the operator key file was not made: %v", err)
		}
		op := strings.TrimSpace(string(opKey))
		r := s.do("GET", "/metrics", nil, map[string]string{"Authorization": "Bearer " + op})
		if r.status != http.StatusOK || !strings.Contains(r.body, `tenant="tenant-b"`) {
			t.Errorf("GET /metrics with the operator key: %s, want tenant B's count", r)
		}
		r = s.do("POST", "/sandboxes", strings.NewReader(`{"templateID":"busybox"}`), map[string]string{"X-API-Key": op, "Content-Type": "application/json"})
		if r.status != http.StatusForbidden {
			t.Errorf("POST /sandboxes with the operator key: %s, want 403", r)
		}
	})
	if r := s.do("DELETE", "/sandboxes/"+sbB.SandboxID, nil, map[string]string{"X-API-Key": keyB}); r.status != http.StatusNoContent {
		t.Errorf("DELETE %s: %s", sbB.SandboxID, r)
	}
	s.stopAndCheckClean()
}
