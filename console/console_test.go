package console

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"
)

// api stands in for serve's handler: one tenant key, a connect call
// that gives a token, and an envd that reports what reached it.
type api struct {
	mu    sync.Mutex
	calls []*http.Request
}

const (
	goodKey     = "key-of-tenant-a"
	operatorKey = "key-of-the-operator"
)

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.calls = append(a.calls, r)
	a.mu.Unlock()
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		if r.Header.Get("X-Access-Token") != "envd-token-"+id {
			http.Error(w, "gone", http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "port": r.Header.Get("E2b-Sandbox-Port"), "cookie": r.Header.Get("Cookie")})
		return
	}
	if r.Header.Get("X-API-Key") == operatorKey {
		// serve's operator key acts as no tenant.
		if r.URL.Path == OperatorTenantsPath {
			_, _ = w.Write([]byte(`[]`))
			return
		}
		http.Error(w, `{"code":403,"message":"acts as no tenant"}`, http.StatusForbidden)
		return
	}
	if r.Header.Get("X-API-Key") != goodKey {
		http.Error(w, `{"code":401,"message":"bad key"}`, http.StatusUnauthorized)
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v2/sandboxes":
		_, _ = w.Write([]byte(`[]`))
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/connect"):
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/sandboxes/"), "/connect")
		_ = json.NewEncoder(w).Encode(map[string]string{"sandboxID": id, "envdAccessToken": "envd-token-" + id})
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	default:
		_ = json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "cookie": r.Header.Get("Cookie"), "origin": r.Header.Get("Origin")})
	}
}

func (a *api) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.calls)
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTest(t *testing.T) (*Handler, *api, *clock) {
	t.Helper()
	a := &api{}
	c := &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	h := New(Config{API: a, Now: c.Now, Secure: true, Assets: fstest.MapFS{"index.html": {Data: []byte("<!doctype html>")}}})
	return h, a, c
}

func do(h http.Handler, method, target, body string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// signIn signs in with key and returns the cookie and CSRF token.
func signIn(t *testing.T, h http.Handler, key string) (cookie, csrf string) {
	t.Helper()
	w := do(h, "POST", "/console/session", `{"apiKey":"`+key+`"}`, map[string]string{"Content-Type": "application/json"})
	if w.Code != http.StatusOK {
		t.Fatalf("sign in: %d %s", w.Code, w.Body)
	}
	var info sessionInfo
	if err := json.Unmarshal(w.Body.Bytes(), &info); err != nil || !info.SignedIn || info.CSRF == "" {
		t.Fatalf("sign in answered %s", w.Body)
	}
	res := w.Result()
	for _, c := range res.Cookies() {
		if c.Name == CookieName {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || !c.Secure || c.Path != "/console" {
				t.Fatalf("cookie %+v: want HttpOnly, SameSite=Strict, Secure, Path=/console", c)
			}
			return CookieName + "=" + c.Value, info.CSRF
		}
	}
	t.Fatalf("sign in set no %s cookie: %v", CookieName, res.Header)
	return "", ""
}

func TestBadKeyKeepsNothing(t *testing.T) {
	h, _, _ := newTest(t)
	w := do(h, "POST", "/console/session", `{"apiKey":"wrong"}`, map[string]string{"Content-Type": "application/json"})
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("bad key: %d %s, want 401", w.Code, w.Body)
	}
	if n := h.sessions.len(); n != 0 {
		t.Fatalf("a bad key left %d sessions", n)
	}
	if c := w.Result().Cookies(); len(c) != 0 {
		t.Fatalf("a bad key set cookies %v", c)
	}
	// Not JSON: a form of another site.
	w = do(h, "POST", "/console/session", `apiKey=`+goodKey, map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	if w.Code != http.StatusUnsupportedMediaType || h.sessions.len() != 0 {
		t.Fatalf("form sign-in: %d %s, sessions %d", w.Code, w.Body, h.sessions.len())
	}
}

// The operator's key, which acts as no tenant, signs in to the
// operator's view; a tenant's key does not.
func TestOperatorSession(t *testing.T) {
	h, _, _ := newTest(t)
	for key, want := range map[string]bool{operatorKey: true, goodKey: false} {
		cookie, _ := signIn(t, h, key)
		w := do(h, "GET", "/console/session", "", map[string]string{"Cookie": cookie})
		var info sessionInfo
		if err := json.Unmarshal(w.Body.Bytes(), &info); err != nil || !info.SignedIn || info.Operator != want {
			t.Errorf("session of %s: %s, want operator %v", key, w.Body, want)
		}
	}
}

func TestCSRFRequired(t *testing.T) {
	h, a, _ := newTest(t)
	cookie, csrf := signIn(t, h, goodKey)
	before := a.count()
	for _, hdr := range []map[string]string{
		{"Cookie": cookie, "Content-Type": "application/json"},
		{"Cookie": cookie, "Content-Type": "application/json", CSRFHeader: "not-the-token"},
	} {
		for _, target := range []string{"/console/api/sandboxes/abc", "/console/envd/abc/files", "/console/session"} {
			w := do(h, "DELETE", target, "", hdr)
			if w.Code != http.StatusForbidden {
				t.Errorf("DELETE %s with CSRF %q: %d %s, want 403", target, hdr[CSRFHeader], w.Code, w.Body)
			}
		}
	}
	if a.count() != before {
		t.Fatalf("a call without the CSRF token reached the API (%d calls)", a.count()-before)
	}
	w := do(h, "DELETE", "/console/api/sandboxes/abc", "", map[string]string{"Cookie": cookie, CSRFHeader: csrf})
	if w.Code != http.StatusNoContent {
		t.Fatalf("DELETE with the token: %d %s", w.Code, w.Body)
	}
	// A GET needs none.
	if w := do(h, "GET", "/console/api/v2/sandboxes", "", map[string]string{"Cookie": cookie}); w.Code != http.StatusOK {
		t.Fatalf("GET: %d %s", w.Code, w.Body)
	}
}

func TestPassesKeyNotCookies(t *testing.T) {
	h, a, _ := newTest(t)
	cookie, csrf := signIn(t, h, goodKey)
	w := do(h, "POST", "/console/api/sandboxes/x1/pause?q=1", "{}", map[string]string{
		"Cookie": cookie + "; other=1", CSRFHeader: csrf, "Content-Type": "application/json",
		"X-API-Key": "a-key-the-page-chose", "E2b-Sandbox-Id": "elsewhere", "E2b-Sandbox-Port": "80",
	})
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	last := a.calls[len(a.calls)-1]
	if last.URL.Path != "/sandboxes/x1/pause" || last.URL.RawQuery != "q=1" || last.Header.Get("X-API-Key") != goodKey ||
		last.Header.Get("Cookie") != "" || last.Header.Get(CSRFHeader) != "" || last.Header.Get("E2b-Sandbox-Id") != "" {
		t.Fatalf("the API got %s %s?%s with headers %v", last.Method, last.URL.Path, last.URL.RawQuery, last.Header)
	}
	// envd: the token from connect, the envd port, no cookie; fetched
	// once per session and sandbox.
	for range 2 {
		w = do(h, "GET", "/console/envd/sb-1/files?path=/a", "", map[string]string{"Cookie": cookie})
		if w.Code != http.StatusOK {
			t.Fatalf("envd: %d %s", w.Code, w.Body)
		}
		var got map[string]string
		_ = json.Unmarshal(w.Body.Bytes(), &got)
		if got["path"] != "/files" || got["port"] != EnvdPort || got["cookie"] != "" {
			t.Fatalf("envd got %v", got)
		}
	}
	connects := 0
	for _, c := range a.calls {
		if strings.HasSuffix(c.URL.Path, "/connect") {
			connects++
		}
	}
	if connects != 1 {
		t.Fatalf("%d connect calls for one sandbox of one session, want 1", connects)
	}
	if w := do(h, "GET", "/console/envd/..%2fx/files", "", map[string]string{"Cookie": cookie}); w.Code != http.StatusBadRequest {
		t.Fatalf("bad ID: %d", w.Code)
	}
}

func TestSessionExpires(t *testing.T) {
	h, _, c := newTest(t)
	cookie, _ := signIn(t, h, goodKey)
	c.add(SessionTTL - time.Minute)
	if w := do(h, "GET", "/console/api/v2/sandboxes", "", map[string]string{"Cookie": cookie}); w.Code != http.StatusOK {
		t.Fatalf("before expiry: %d", w.Code)
	}
	c.add(2 * time.Minute)
	w := do(h, "GET", "/console/api/v2/sandboxes", "", map[string]string{"Cookie": cookie})
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "expired") {
		t.Fatalf("after expiry: %d %s, want 401 naming expiry", w.Code, w.Body)
	}
	if h.sessions.len() != 0 {
		t.Fatal("the expired session is still held")
	}
	// Signed out is signed out.
	cookie, csrf := signIn(t, h, goodKey)
	if w := do(h, "DELETE", "/console/session", "", map[string]string{"Cookie": cookie, CSRFHeader: csrf}); w.Code != http.StatusNoContent {
		t.Fatalf("sign out: %d", w.Code)
	}
	if w := do(h, "GET", "/console/api/v2/sandboxes", "", map[string]string{"Cookie": cookie}); w.Code != http.StatusUnauthorized {
		t.Fatalf("after sign out: %d", w.Code)
	}
}

func TestSessionsBounded(t *testing.T) {
	h, _, c := newTest(t)
	first, _ := signIn(t, h, goodKey)
	for range MaxSessions + 10 {
		c.add(time.Millisecond)
		signIn(t, h, goodKey)
	}
	if n := h.sessions.len(); n != MaxSessions {
		t.Fatalf("%d sessions held, want %d", n, MaxSessions)
	}
	if w := do(h, "GET", "/console/api/v2/sandboxes", "", map[string]string{"Cookie": first}); w.Code != http.StatusUnauthorized {
		t.Fatalf("the oldest session still works past the bound: %d", w.Code)
	}
}

func TestHeadersAndAssets(t *testing.T) {
	h, _, _ := newTest(t)
	for _, target := range []string{"/console/", "/console/sandbox/abc", "/console/api/v2/sandboxes", "/console/session"} {
		w := do(h, "GET", target, "", nil)
		if w.Header().Get("Content-Security-Policy") != CSP || w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: headers %v", target, w.Header())
		}
	}
	if w := do(h, "GET", "/console/sandbox/abc", "", nil); w.Code != 200 || !strings.Contains(w.Body.String(), "doctype") {
		t.Fatalf("page: %d %s", w.Code, w.Body)
	}
	if w := do(h, "POST", "/console/csp-report", `{"csp-report":{}}`, map[string]string{"Content-Type": "application/csp-report"}); w.Code != http.StatusNoContent || h.CSPReports() != 1 {
		t.Fatalf("report: %d, count %d", w.Code, h.CSPReports())
	}
	bare := New(Config{API: &api{}})
	bare.assets = nil // as a go build without make console-assets
	w := do(bare, "GET", "/console/", "", nil)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), AssetsTarget) {
		t.Fatalf("without assets: %d %s", w.Code, w.Body)
	}
}
