package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"hutch.dev/hutch/client"
)

// A sandbox's envd and traffic tokens leak (a log, a shared notebook, a
// URL pasted in a chat). Whoever holds them runs commands, reads files
// and opens its private previews, with no API key. Its tenant replaces
// them (POST /sandboxes/{id}/tokens): from then on the leaked ones answer
// exactly as a made-up token does, on the header and host routes of the
// data plane and on private previews; a stream they opened before ends;
// the new ones work, and are what connect gives, through pause and resume
// and a restart of the server. Another tenant, and a caller without a
// key, cannot replace them.
func TestServeHostileLeakedToken(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	owner := s.tenantAdd("owner")
	other := s.tenantAdd("other")
	s.serve()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	r := s.do("POST", "/sandboxes", strings.NewReader(`{"templateID":"busybox","timeout":600,"network":{"allowPublicTraffic":false}}`),
		map[string]string{"X-API-Key": owner, "Content-Type": "application/json"})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %s\nserver log:\n%s", r, s.logTail(20))
	}
	var created tokensAnswer
	if err := json.Unmarshal([]byte(r.body), &created); err != nil || created.TrafficAccessToken == nil || created.EnvdAccessToken == "" {
		t.Fatalf("create answer: %v: %s", err, r)
	}
	id := created.SandboxID
	leaked := tokensOf(created)
	// What leaked holders use: the data plane alone, with no API key.
	anyone := &client.Client{APIURL: s.url("")}
	leakedSB := anyone.Sandbox(id, leaked.envd)
	ownerAPI := &client.Client{APIURL: s.url(""), APIKey: owner}

	// A private preview to reach: busybox httpd, which binds its port
	// before it goes to the background.
	mustRun(ctx, t, leakedSB, "mkdir -p /www && echo preview-ok > /www/index.html && httpd -p 8080 -h /www")

	t.Run("the leaked tokens open the sandbox to anyone", func(t *testing.T) {
		s.checkTokens(t, id, leaked, true)
	})

	// A stream the leaked token opens, still open at the replacement.
	held, err := leakedSB.Start(ctx, client.ExecRequest{Cmd: "sleep", Args: []string{"600"}})
	if err != nil {
		t.Fatalf("a command with the leaked token: %v", err)
	}

	t.Run("another tenant, no key and bad calls replace nothing", func(t *testing.T) {
		unknown := shiftID(id)
		forOther := s.do("POST", "/sandboxes/"+id+"/tokens", nil, map[string]string{"X-API-Key": other})
		forUnknown := s.do("POST", "/sandboxes/"+unknown+"/tokens", nil, map[string]string{"X-API-Key": other})
		if forOther.status != http.StatusNotFound {
			t.Errorf("another tenant's replace: %s, want 404", forOther)
		}
		if a, u := strings.ReplaceAll(forOther.body, id, "{id}"), strings.ReplaceAll(forUnknown.body, unknown, "{id}"); a != u || forOther.status != forUnknown.status {
			t.Errorf("another tenant: the owner's sandbox answers %s, an unknown one %s", forOther, forUnknown)
		}
		if r := s.do("POST", "/sandboxes/"+id+"/tokens", nil, nil); r.status != http.StatusUnauthorized {
			t.Errorf("replace without a key: %s, want 401", r)
		}
		for _, c := range []struct {
			path, body string
			status     int
			says       string
		}{
			{"/sandboxes/not-a-sandbox/tokens", "", http.StatusNotFound, "not-a-sandbox"},
			{"/sandboxes/" + id + "/tokens", `{"generation":7}`, http.StatusBadRequest, "generation"},
			{"/sandboxes/" + id + "/tokens", `[`, http.StatusBadRequest, "request body"},
		} {
			r := s.do("POST", c.path, strings.NewReader(c.body), map[string]string{"X-API-Key": owner, "Content-Type": "application/json"})
			code, msg, err := r.errorBody()
			if r.status != c.status || err != nil || code != c.status || !strings.Contains(msg, c.says) {
				t.Errorf("POST %s %q: %s, want %d with E2B's error body naming %q", c.path, c.body, r, c.status, c.says)
			}
		}
		s.checkTokens(t, id, leaked, true)
	})

	r = s.do("POST", "/sandboxes/"+id+"/tokens", nil, map[string]string{"X-API-Key": owner})
	if r.status != http.StatusOK {
		t.Fatalf("the owner's replace of its sandbox's tokens: %s, want 200 with new tokens\nserver log:\n%s", r, s.logTail(20))
	}
	var rotated tokensAnswer
	if err := json.Unmarshal([]byte(r.body), &rotated); err != nil || rotated.SandboxID != id || rotated.TrafficAccessToken == nil {
		t.Fatalf("replace answer: %v: %s", err, r)
	}
	fresh := tokensOf(rotated)
	if fresh.envd == leaked.envd || fresh.traffic == leaked.traffic || fresh.envd == "" || fresh.traffic == "" {
		t.Fatalf("replaced tokens %+v: want two new ones, not %+v", fresh, leaked)
	}

	t.Run("the leaked tokens' stream under way ends", func(t *testing.T) {
		select {
		case <-held.Done():
		case <-time.After(15 * time.Second):
			t.Fatal("the stream of sleep 600 opened with the leaked token still runs 15 s after the replacement")
		}
		if res, err := held.Wait(ctx); err == nil {
			t.Errorf("the leaked token's stream ended with a result %+v, want it cut", res)
		}
	})
	t.Run("the leaked tokens now answer as made-up ones, the new ones work", func(t *testing.T) {
		s.checkTokens(t, id, leaked, false)
		s.checkTokens(t, id, fresh, true)
	})
	t.Run("connect gives the new tokens", func(t *testing.T) {
		s.checkConnect(t, owner, id, fresh)
	})

	t.Run("through pause and resume", func(t *testing.T) {
		if err := ownerAPI.Pause(ctx, id); err != nil {
			t.Fatalf("pause: %v\nserver log:\n%s", err, s.logTail(20))
		}
		// The leaked token, which would wake a paused sandbox, does not.
		if r := s.do("GET", "/files?path=/www/index.html", nil, envdFor(id, leaked.envd)); r.status != http.StatusBadGateway {
			t.Errorf("the leaked token on the paused sandbox: %s, want 502", r)
		}
		if r := s.do("GET", "/sandboxes/"+id, nil, map[string]string{"X-API-Key": owner}); !strings.Contains(r.body, `"state":"paused"`) {
			t.Errorf("after the leaked token's call the sandbox is %s, want it still paused", r)
		}
		s.checkConnect(t, owner, id, fresh)
		s.checkTokens(t, id, leaked, false)
		checkFile(t, s, id, fresh.envd, "preview-ok\n")
	})

	t.Run("through a restart of the server", func(t *testing.T) {
		s.stop()
		s.serve()
		s.checkConnect(t, owner, id, fresh)
		checkFile(t, s, id, fresh.envd, "preview-ok\n")
		if r := s.do("GET", "/files?path=/www/index.html", nil, envdFor(id, leaked.envd)); r.status != http.StatusBadGateway {
			t.Errorf("the leaked token after a restart: %s, want 502", r)
		}
	})

	if r := s.do("DELETE", "/sandboxes/"+id, nil, map[string]string{"X-API-Key": owner}); r.status != http.StatusNoContent {
		t.Errorf("kill: %s", r)
	}
	s.stopAndCheckClean()
}

// tokensAnswer is what create, connect and the replace answer.
type tokensAnswer struct {
	SandboxID          string  `json:"sandboxID"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
}

// sandboxTokens are a sandbox's envd and traffic tokens.
type sandboxTokens struct{ envd, traffic string }

func tokensOf(a tokensAnswer) sandboxTokens {
	t := sandboxTokens{envd: a.EnvdAccessToken}
	if a.TrafficAccessToken != nil {
		t.traffic = *a.TrafficAccessToken
	}
	return t
}

// envdFor are the headers of a data-plane request to sandbox id with
// token, and no API key.
func envdFor(id, token string) map[string]string {
	return map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
}

// madeUp is a token of the right shape that no sandbox has.
const madeUp = "0123456789abcdef0123456789abcdef01234567"

// checkTokens checks what toks open of sandbox id, without an API key:
// with works, a command through the Connect service, a file by the
// header route and by the host route, the private preview on port 8080;
// without, each answers exactly as a made-up token does.
func (s *server) checkTokens(t *testing.T, id string, toks sandboxTokens, works bool) {
	t.Helper()
	host := "49983-" + id + "." + serveDomain
	calls := []struct {
		name string
		do   func(token string) apiResponse
	}{
		{"envd by headers", func(tok string) apiResponse {
			return s.do("GET", "/files?path=/www/index.html", nil, envdFor(id, tok))
		}},
		{"envd by host", func(tok string) apiResponse {
			return s.do("GET", "/files?path=/www/index.html", nil, map[string]string{"Host": host, "X-Access-Token": tok})
		}},
		{"envd Connect call", func(tok string) apiResponse {
			h := envdFor(id, tok)
			h["Content-Type"] = "application/json"
			return s.do("POST", "/process.Process/List", strings.NewReader("{}"), h)
		}},
	}
	for _, c := range calls {
		got := c.do(toks.envd)
		if works {
			if got.status != http.StatusOK {
				t.Errorf("%s with the token: %s, want 200", c.name, got)
			}
			continue
		}
		wrong := c.do(madeUp)
		if got.status != http.StatusBadGateway || got.status != wrong.status || got.body != wrong.body {
			t.Errorf("%s with the replaced token: %s; a made-up token: %s; want both 502 and the same", c.name, got, wrong)
		}
	}
	preview := func(tok string) apiResponse {
		return s.do("GET", "/index.html", nil, map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "8080", "E2b-Traffic-Access-Token": tok})
	}
	got := preview(toks.traffic)
	if works {
		if got.status != http.StatusOK || got.body != "preview-ok\n" {
			t.Errorf("the private preview with the traffic token: %s, want 200 preview-ok", got)
		}
		return
	}
	wrong := preview(madeUp)
	if got.status != http.StatusForbidden || got.status != wrong.status || got.body != wrong.body {
		t.Errorf("the private preview with the replaced traffic token: %s; a made-up one: %s; want both 403 and the same", got, wrong)
	}
}

// checkConnect checks that connect gives sandbox id's tokens want.
func (s *server) checkConnect(t *testing.T, key, id string, want sandboxTokens) {
	t.Helper()
	r := s.do("POST", "/sandboxes/"+id+"/connect", strings.NewReader(`{"timeout":600}`), map[string]string{"X-API-Key": key, "Content-Type": "application/json"})
	var a tokensAnswer
	if r.status != http.StatusOK && r.status != http.StatusCreated {
		t.Fatalf("connect: %s\nserver log:\n%s", r, s.logTail(20))
	}
	if err := json.Unmarshal([]byte(r.body), &a); err != nil {
		t.Fatalf("connect answer: %v: %s", err, r)
	}
	if got := tokensOf(a); got != want {
		t.Errorf("connect gives tokens %+v, want %+v", got, want)
	}
}

// checkFile checks that sandbox id's /www/index.html reads want with
// token.
func checkFile(t *testing.T, s *server, id, token, want string) {
	t.Helper()
	if r := s.do("GET", "/files?path=/www/index.html", nil, envdFor(id, token)); r.status != http.StatusOK || r.body != want {
		t.Errorf("a file with the new token: %s, want 200 %q", r, want)
	}
}

// mustRun runs script in sb with sh as root, and fails the test unless
// it exits 0.
func mustRun(ctx context.Context, t *testing.T, sb *client.Sandbox, script string) {
	t.Helper()
	if out, code, err := shRun(ctx, sb, script); err != nil || code != 0 {
		t.Fatalf("%s: %q, exit %d, %v", script, out, code, err)
	}
}
