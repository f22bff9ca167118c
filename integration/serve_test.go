package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// `hutch serve` driven the way agent platforms drive it: by the real E2B
// JavaScript SDK (integration/e2b, e2b pinned in its package.json) with
// E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and E2B_DOMAIN pointing at the
// server, and by plain HTTP for what an SDK never sends. Each part runs its
// own server with its own state root and tenants, and ends with no sandbox
// and no process of that root left.
func TestServe(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	base := baseArchive(t)

	t.Run("E2B SDK", func(t *testing.T) { testServeSDK(t, base) })
	t.Run("tenant isolation", func(t *testing.T) { testServeIsolation(t, base) })
	t.Run("bad input", func(t *testing.T) { testServeBadInput(t, base) })
}

// One tenant runs the SDK's flows: commands and terminals, files, and a
// sandbox's life (list, getHost, timeouts, network, pause and resume,
// fork, snapshot, kill). Every mutating call lands in the audit log.
func testServeSDK(t *testing.T, base string) {
	s := newServer(t, base)
	const tenant = "sdk-tenant"
	key := s.tenantAdd(tenant)
	s.serve()

	t.Run("commands and pty", func(t *testing.T) {
		s.runScript(t, "commands.mjs", key, nil, 3*time.Minute)
	})
	t.Run("files", func(t *testing.T) {
		s.runScript(t, "files.mjs", key, nil, 4*time.Minute)
	})
	t.Run("sandbox lifecycle", func(t *testing.T) {
		s.runScript(t, "lifecycle.mjs", key, nil, 5*time.Minute)
	})
	t.Run("the audit log has a JSON line per mutating call, naming tenant, call, result and the sandboxes", func(t *testing.T) {
		lines, err := s.auditLines()
		if err != nil {
			t.Fatal(err)
		}
		sandboxes := map[string]bool{}
		for _, l := range lines {
			for _, k := range []string{"tenant", "call", "result"} {
				if _, ok := l[k]; !ok {
					t.Fatalf("audit line lacks %q: %v", k, l)
				}
			}
			if l["tenant"] != tenant {
				t.Fatalf("audit line names tenant %v, want %q: %v", l["tenant"], tenant, l)
			}
			if id, _ := l["sandbox"].(string); id != "" {
				sandboxes[id] = true
			}
		}
		// The scripts created six sandboxes and killed five of them.
		if len(sandboxes) < 5 {
			t.Fatalf("audit log names %d sandboxes, want at least 5:\n%v", len(sandboxes), lines)
		}
	})
	s.stopAndCheckClean()
}

// Tenant B cannot reach tenant A's sandbox or snapshot by any call, and
// every refusal is indistinguishable from an unknown ID; bad keys are 401;
// a quota refusal leaves nothing behind.
func testServeIsolation(t *testing.T, base string) {
	s := newServer(t, base)
	keyA := s.tenantAdd("tenant-a")
	keyB := s.tenantAdd("tenant-b", "--max-sandboxes", "1")
	s.serve()

	var kept struct {
		A        string `json:"a"`
		B        string `json:"b"`
		Snapshot string `json:"snapshot"`
	}
	t.Run("through the SDK", func(t *testing.T) {
		line := s.runScript(t, "isolation.mjs", keyA, map[string]string{"TENANT_B_KEY": keyB}, 5*time.Minute)
		if line == "" {
			t.Fatal("isolation.mjs printed no KEEP line")
		}
		if err := json.Unmarshal([]byte(line), &kept); err != nil || kept.A == "" || kept.B == "" {
			t.Fatalf("isolation.mjs KEEP line %q: %v", line, err)
		}
	})
	if kept.A == "" {
		s.deleteAllThroughAPI(keyA, keyB)
		s.stopAndCheckClean()
		return
	}

	t.Run("the refused create left nothing: the host has only A's and B's sandboxes", func(t *testing.T) {
		want := []string{kept.A, kept.B}
		sort.Strings(want)
		if got := s.sandboxIDs(); !reflect.DeepEqual(got, want) {
			t.Fatalf("hutch ls: %v, want %v", got, want)
		}
	})

	t.Run("plain HTTP: B on A's sandbox answers byte for byte as on an unknown ID", func(t *testing.T) {
		unknown := shiftID(kept.A)
		headersB := map[string]string{"X-API-KEY": keyB, "Content-Type": "application/json"}
		rest := []struct{ method, path, body string }{
			{"GET", "/sandboxes/%s", ""},
			{"DELETE", "/sandboxes/%s", ""},
			{"POST", "/sandboxes/%s/pause", "{}"},
			{"POST", "/sandboxes/%s/resume", `{"timeout":60}`},
			{"POST", "/sandboxes/%s/connect", `{"timeout":60}`},
			{"POST", "/v2/sandboxes/%s/connect", `{"timeout":60}`},
			{"POST", "/sandboxes/%s/timeout", `{"timeout":1}`},
			{"POST", "/sandboxes/%s/refreshes", `{"duration":60}`},
			{"POST", "/sandboxes/%s/fork", `{"count":1}`},
			{"POST", "/sandboxes/%s/snapshots", "{}"},
			{"PUT", "/sandboxes/%s/network", `{"denyOut":["0.0.0.0/0"]}`},
			{"GET", "/sandboxes/%s/metrics", ""},
			{"GET", "/sandboxes/%s/logs", ""},
		}
		for _, r := range rest {
			forA := s.do(r.method, fmt.Sprintf(r.path, kept.A), strings.NewReader(r.body), headersB)
			forUnknown := s.do(r.method, fmt.Sprintf(r.path, unknown), strings.NewReader(r.body), headersB)
			name := r.method + " " + fmt.Sprintf(r.path, "{id}")
			if forA.status != http.StatusNotFound {
				t.Errorf("%s as B on A's sandbox: %s, want 404", name, forA)
			}
			if a, u := strings.ReplaceAll(forA.body, kept.A, "{id}"), strings.ReplaceAll(forUnknown.body, unknown, "{id}"); forA.status != forUnknown.status || a != u {
				t.Errorf("%s as B: A's sandbox answers %s, an unknown one %s", name, forA, forUnknown)
			}
		}

		// The data plane, as the SDK reaches it, with B's key and the
		// access token of B's own sandbox.
		tokenB := s.sandboxToken(keyB, kept.B)
		envd := func(id string) map[string]string {
			h := envdHeaders(keyB, createdSandbox{SandboxID: id, EnvdAccessToken: tokenB})
			h["Content-Type"] = "application/json"
			return h
		}
		data := []struct{ method, path, body string }{
			{"GET", "/files?path=/home/user/secret.txt", ""},
			{"POST", "/filesystem.Filesystem/Stat", `{"path":"/home/user/secret.txt"}`},
			{"POST", "/filesystem.Filesystem/ListDir", `{"path":"/home/user","depth":1}`},
			{"POST", "/process.Process/List", `{}`},
		}
		for _, r := range data {
			forA := s.do(r.method, r.path, strings.NewReader(r.body), envd(kept.A))
			forUnknown := s.do(r.method, r.path, strings.NewReader(r.body), envd(unknown))
			a, u := strings.ReplaceAll(forA.body, kept.A, "{id}"), strings.ReplaceAll(forUnknown.body, unknown, "{id}")
			if forA.status < 400 || strings.Contains(forA.body, "tenant A only") {
				t.Errorf("%s %s as B in A's sandbox succeeded: %s", r.method, r.path, forA)
			}
			if forA.status != forUnknown.status || a != u {
				t.Errorf("%s %s as B: A's sandbox answers %s, an unknown one %s", r.method, r.path, forA, forUnknown)
			}
		}
		// envd routed by host name (a sandbox's other ports are public,
		// as in E2B: the browser that opens getHost(port) has no key).
		for _, port := range []string{"49983"} {
			forA := s.do("GET", "/", nil, map[string]string{"Host": port + "-" + kept.A + "." + serveDomain, "X-API-KEY": keyB})
			forUnknown := s.do("GET", "/", nil, map[string]string{"Host": port + "-" + unknown + "." + serveDomain, "X-API-KEY": keyB})
			a, u := strings.ReplaceAll(forA.body, kept.A, "{id}"), strings.ReplaceAll(forUnknown.body, unknown, "{id}")
			if forA.status != forUnknown.status || a != u {
				t.Errorf("Host %s-{id}: A's sandbox answers %s, an unknown one %s", port, forA, forUnknown)
			}
		}
		// Nothing of the above reached A's sandbox.
		r := s.do("GET", "/sandboxes/"+kept.A, nil, map[string]string{"X-API-KEY": keyA})
		var info struct {
			State string `json:"state"`
		}
		if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &info) != nil || info.State != "running" {
			t.Errorf("A's sandbox after B's calls: %s, want 200 and state running", r)
		}
	})

	t.Run("a missing or wrong API key is 401 with E2B's error shape", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			header map[string]string
		}{
			{"no key", map[string]string{}},
			{"wrong key", map[string]string{"X-API-KEY": "e2b_" + strings.Repeat("0", 40)}},
			{"A's key with a character changed", map[string]string{"X-API-KEY": keyA[:len(keyA)-1] + string(flipChar(keyA[len(keyA)-1]))}},
		} {
			for _, req := range []struct{ method, path, body string }{
				{"GET", "/sandboxes", ""},
				{"GET", "/v2/sandboxes", ""},
				{"GET", "/sandboxes/" + kept.A, ""},
				{"DELETE", "/sandboxes/" + kept.A, ""},
				{"POST", "/sandboxes", `{"templateID":"base"}`},
				{"POST", "/v2/sandboxes", `{"templateID":"base"}`},
			} {
				h := map[string]string{"Content-Type": "application/json"}
				for k, v := range tc.header {
					h[k] = v
				}
				r := s.do(req.method, req.path, strings.NewReader(req.body), h)
				if r.status != http.StatusUnauthorized {
					t.Errorf("%s: %s %s: %s, want 401", tc.name, req.method, req.path, r)
					continue
				}
				if code, msg, err := r.errorBody(); err != nil || code != 401 || msg == "" {
					t.Errorf("%s: %s %s: body %q: want {code: 401, message: ...} (%v)", tc.name, req.method, req.path, r.body, err)
				}
			}
		}
		want := []string{kept.A, kept.B}
		sort.Strings(want)
		if got := s.sandboxIDs(); !reflect.DeepEqual(got, want) {
			t.Fatalf("after refused calls, hutch ls: %v, want %v", got, want)
		}
	})

	t.Run("a tenant added while the server runs is served within seconds, and refused once removed", func(t *testing.T) {
		keyC := s.tenantAdd("tenant-c")
		h := map[string]string{"X-API-KEY": keyC}
		var r apiResponse
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if r = s.do("GET", "/v2/sandboxes", nil, h); r.status == http.StatusOK {
				break
			}
		}
		if r.status != http.StatusOK || strings.TrimSpace(r.body) != "[]" {
			t.Fatalf("GET /v2/sandboxes as a tenant added 5 s ago: %s, want 200 []", r)
		}
		s.ok("tenant", "rm", "--tenants", s.tenants, "tenant-c")
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if r = s.do("GET", "/v2/sandboxes", nil, h); r.status == http.StatusUnauthorized {
				break
			}
		}
		if r.status != http.StatusUnauthorized {
			t.Fatalf("GET /v2/sandboxes as a tenant removed 5 s ago: %s, want 401", r)
		}
	})

	for id, key := range map[string]string{kept.A: keyA, kept.B: keyB} {
		if r := s.do("DELETE", "/sandboxes/"+id, nil, map[string]string{"X-API-KEY": key}); r.status != http.StatusNoContent {
			t.Errorf("DELETE /sandboxes/%s as its owner: %s, want 204", id, r)
		}
	}
	s.deleteAllThroughAPI(keyA, keyB)
	if kept.Snapshot != "" {
		if r := s.do("DELETE", "/templates/"+kept.Snapshot, nil, map[string]string{"X-API-KEY": keyA}); r.status >= 300 {
			t.Errorf("DELETE /templates/%s as A: %s", kept.Snapshot, r)
		}
	}
	s.stopAndCheckClean()
}

// Malformed or hostile requests get a 4xx with a message naming what was
// wrong, the server keeps serving, and nothing is left behind.
func testServeBadInput(t *testing.T, base string) {
	s := newServer(t, base)
	key := s.tenantAdd("bad-input")
	s.serve()
	jsonKey := map[string]string{"X-API-KEY": key, "Content-Type": "application/json"}

	// want4xx checks a refusal: the status, E2B's error shape, and a
	// message that names each of names.
	want4xx := func(t *testing.T, r apiResponse, statuses []int, names ...string) {
		t.Helper()
		ok := false
		for _, st := range statuses {
			ok = ok || r.status == st
		}
		if !ok {
			t.Fatalf("answer %s, want one of %v", r, statuses)
		}
		_, msg, err := r.errorBody()
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if !strings.Contains(strings.ToLower(msg), strings.ToLower(n)) {
				t.Fatalf("message %q does not name %q", msg, n)
			}
		}
	}

	t.Run("malformed JSON to POST /sandboxes is 400 with a message", func(t *testing.T) {
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			for _, body := range []string{`{"templateID": "base",`, `not json`, `{"templateID": 42}`} {
				r := s.do("POST", path, strings.NewReader(body), jsonKey)
				want4xx(t, r, []int{400})
				if _, msg, _ := r.errorBody(); msg == "" {
					t.Fatalf("POST %s %q: empty message", path, body)
				}
			}
		}
	})
	t.Run("an unknown template is a 4xx naming it", func(t *testing.T) {
		r := s.do("POST", "/sandboxes", strings.NewReader(`{"templateID":"no-such-template-e2e"}`), jsonKey)
		want4xx(t, r, []int{400, 404}, "no-such-template-e2e")
	})
	t.Run("a negative timeout is 400 naming the timeout", func(t *testing.T) {
		r := s.do("POST", "/sandboxes", strings.NewReader(`{"templateID":"base","timeout":-5}`), jsonKey)
		want4xx(t, r, []int{400}, "timeout")
	})
	t.Run("an unsupported field is refused naming it", func(t *testing.T) {
		r := s.do("POST", "/v2/sandboxes", strings.NewReader(`{"templateID":"base","mcp":{"server":{}}}`), jsonKey)
		want4xx(t, r, []int{400, 501}, "mcp")
	})
	t.Run("a 20 MiB body is refused with 413 or 400", func(t *testing.T) {
		huge := `{"templateID":"base","metadata":{"x":"` + strings.Repeat("a", 20<<20) + `"}}`
		r := s.do("POST", "/sandboxes", strings.NewReader(huge), jsonKey)
		if r.status != http.StatusRequestEntityTooLarge && r.status != http.StatusBadRequest {
			t.Fatalf("answer %s, want 413 or 400", r)
		}
	})
	t.Run("an unknown path answers E2B's error shape, naming the path", func(t *testing.T) {
		r := s.do("GET", "/no-such-endpoint-e2e", nil, jsonKey)
		want4xx(t, r, []int{404, 501}, "/no-such-endpoint-e2e")
	})

	sb := s.createSandbox(key, "base")
	envd := envdHeaders(key, sb)
	envd["Content-Type"] = "application/json"
	shadow, _ := os.ReadFile("/etc/shadow")
	hostShadow := strings.SplitN(string(shadow), "\n", 2)[0]

	t.Run("path traversal in GET and POST /files is 400", func(t *testing.T) {
		for _, p := range []string{"../../etc/shadow", "/home/user/../../../etc/shadow/..%2F..", "..%2F..%2Fetc%2Fshadow"} {
			r := s.do("GET", "/files?path="+p, nil, envd)
			if r.status != http.StatusBadRequest {
				t.Errorf("GET /files?path=%s: %s, want 400", p, r)
			}
			if hostShadow != "" && strings.Contains(r.body, hostShadow) {
				t.Fatalf("GET /files?path=%s returned the host's /etc/shadow", p)
			}
		}
		r := s.do("POST", "/files?path=../../tmp/escaped", strings.NewReader("x"), map[string]string{
			"X-API-KEY": key, "E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983",
			"X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/octet-stream",
		})
		if r.status != http.StatusBadRequest {
			t.Errorf("POST /files?path=../../tmp/escaped: %s, want 400", r)
		}
	})
	t.Run("path traversal in filesystem calls is invalid_argument", func(t *testing.T) {
		for _, c := range []struct{ method, body string }{
			{"Stat", `{"path":"../../etc/shadow"}`},
			{"ListDir", `{"path":"../..","depth":1}`},
			{"MakeDir", `{"path":"../../tmp/escaped"}`},
			{"Move", `{"source":"/home/user/.bashrc","destination":"../../tmp/escaped"}`},
			{"Remove", `{"path":"../../etc/passwd"}`},
		} {
			r := s.do("POST", "/filesystem.Filesystem/"+c.method, strings.NewReader(c.body), envd)
			var ce struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			}
			if r.status != http.StatusBadRequest || json.Unmarshal([]byte(r.body), &ce) != nil || ce.Code != "invalid_argument" || ce.Message == "" {
				t.Errorf("%s %s: %s, want 400 {code: invalid_argument, message: ...}", c.method, c.body, r)
			}
		}
		// What the refused calls would have touched is intact.
		r := s.do("POST", "/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/etc/passwd"}`), envd)
		if r.status != http.StatusOK {
			t.Errorf("Stat /etc/passwd after the refused calls: %s", r)
		}
	})
	t.Run("a 20 MiB Connect request is refused", func(t *testing.T) {
		huge := `{"path":"/` + strings.Repeat("a", 20<<20) + `"}`
		r := s.do("POST", "/filesystem.Filesystem/Stat", strings.NewReader(huge), envd)
		if r.status < 400 || r.status >= 500 {
			t.Fatalf("answer %s, want a 4xx", r)
		}
	})
	t.Run("the server keeps serving and nothing is left", func(t *testing.T) {
		if r := s.do("GET", "/health", nil, nil); r.status != http.StatusOK {
			t.Fatalf("GET /health: %s", r)
		}
		if got := s.sandboxIDs(); !reflect.DeepEqual(got, []string{sb.SandboxID}) {
			t.Fatalf("hutch ls: %v, want only %s", got, sb.SandboxID)
		}
		r := s.do("POST", "/process.Process/List", strings.NewReader(`{}`), envd)
		if r.status != http.StatusOK {
			t.Fatalf("process.Process/List on the sandbox after the bad calls: %s", r)
		}
		if r := s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, jsonKey); r.status != http.StatusNoContent {
			t.Fatalf("DELETE /sandboxes/%s: %s, want 204", sb.SandboxID, r)
		}
	})
	s.stopAndCheckClean()
}

// sandboxToken is the data-plane access token of id, from a connect as
// its owner (the same call the SDK's Sandbox.connect makes).
func (s *server) sandboxToken(key, id string) string {
	s.t.Helper()
	r := s.do("POST", "/sandboxes/"+id+"/connect", strings.NewReader(`{"timeout":600}`), map[string]string{"X-API-KEY": key, "Content-Type": "application/json"})
	if r.status != http.StatusOK && r.status != http.StatusCreated {
		s.t.Fatalf("POST /sandboxes/%s/connect as owner: %s", id, r)
	}
	var c createdSandbox
	json.Unmarshal([]byte(r.body), &c) //nolint:errcheck // an empty token is sent as none
	return c.EnvdAccessToken
}

// deleteAllThroughAPI deletes every sandbox, running or paused, that the
// tenants with keys list.
func (s *server) deleteAllThroughAPI(keys ...string) {
	s.t.Helper()
	for _, key := range keys {
		h := map[string]string{"X-API-KEY": key}
		for _, path := range []string{"/sandboxes", "/v2/sandboxes?state=running,paused"} {
			var listed []struct {
				SandboxID string `json:"sandboxID"`
			}
			if json.Unmarshal([]byte(s.do("GET", path, nil, h).body), &listed) != nil {
				continue
			}
			for _, l := range listed {
				s.do("DELETE", "/sandboxes/"+l.SandboxID, nil, h)
			}
		}
	}
}

// shiftID is an ID of the same shape as id that names nothing: each digit
// and letter moved by one within its class (as unknownIDLike in lib.mjs).
func shiftID(id string) string {
	b := []byte(id)
	for i, c := range b {
		b[i] = flipChar(c)
	}
	return string(b)
}

func flipChar(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return '0' + (c-'0'+1)%10
	case c >= 'a' && c <= 'z':
		return 'a' + (c-'a'+1)%26
	case c >= 'A' && c <= 'Z':
		return 'A' + (c-'A'+1)%26
	}
	return c
}
