package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"hutch.dev/hutch/integration/browser"
)

// What a web page can make the operator's browser do to a `hutch serve`
// without tenants on loopback, in a real Chromium: a page of the
// attacker's site (another loopback address) posts a create as a CORS
// simple request (text/plain), and a page whose name the attacker made
// resolve to 127.0.0.1 after it loaded (DNS rebinding, here Chromium's
// host resolver rules and a document the test serves) calls the API as
// its own origin. Nothing is done: the browser gets 403 and 421, the page
// reads what CORS lets it, and the server has no sandbox.
func TestServeHostileBrowser(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, "")
	s.noTenants = true
	s.serve()

	// The attacker's site.
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	site := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, "<!doctype html><title>attacker</title>")
	})}
	go site.Serve(l) //nolint:errcheck // closed at the end
	t.Cleanup(func() { site.Close() })
	create := `{"templateID":"busybox","timeout":600}`
	b := browser.Start(t, browser.Options{HostRules: []string{"MAP attacker.test 127.0.0.1"}})

	// attempt runs fetches in the page and reports, for each, the status
	// the page could read or the error it got instead.
	attempt := func(fetches map[string]string) map[string]string {
		t.Helper()
		var js strings.Builder
		js.WriteString("(async () => { const out = {};\n")
		for name, f := range fetches {
			fmt.Fprintf(&js, "try { const r = await %s; out[%q] = r.type === 'opaque' ? 'opaque' : String(r.status) } catch (e) { out[%q] = 'error: ' + e.message }\n", f, name, name)
		}
		js.WriteString("return JSON.stringify(out) })()")
		res, err := browser.Eval[string](b, js.String())
		if err != nil {
			t.Fatalf("the page's script: %v", err)
		}
		out := map[string]string{}
		if err := json.Unmarshal([]byte(res), &out); err != nil {
			t.Fatalf("the page's result %q: %v", res, err)
		}
		return out
	}
	api := s.url("/sandboxes")
	t.Run("a page of another site posts a create as text/plain", func(t *testing.T) {
		if err := b.Open("http://" + l.Addr().String() + "/"); err != nil {
			t.Fatal(err)
		}
		got := attempt(map[string]string{
			"cors":    fmt.Sprintf("fetch(%q, {method: 'POST', headers: {'Content-Type': 'text/plain'}, body: %q})", api, create),
			"no-cors": fmt.Sprintf("fetch(%q, {method: 'POST', mode: 'no-cors', body: %q})", api, create),
			"list":    fmt.Sprintf("fetch(%q)", api),
		})
		t.Logf("the page read: %v", got)
		for name, v := range got {
			if !strings.HasPrefix(v, "error: ") && v != "opaque" {
				t.Errorf("%s: the page read %s, want CORS to hide the answer", name, v)
			}
		}
		checkBrowserSaw(t, b, api, map[string]int{"POST": http.StatusForbidden})
	})
	t.Run("a page whose name rebinds to the server calls the API as its own origin", func(t *testing.T) {
		page := fmt.Sprintf("http://attacker.test:%d/rebind.html", s.port)
		b.Serve(page, "<!doctype html><title>rebound</title>")
		if err := b.Open(page); err != nil {
			t.Fatal(err)
		}
		got := attempt(map[string]string{
			"create": fmt.Sprintf("fetch('/sandboxes', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: %q})", create),
			"list":   "fetch('/sandboxes')",
			"health": "fetch('/health')",
		})
		t.Logf("the page read: %v", got)
		for name, v := range got {
			if v != "421" {
				t.Errorf("%s: the page read %s, want 421", name, v)
			}
		}
		checkBrowserSaw(t, b, fmt.Sprintf("http://attacker.test:%d/sandboxes", s.port), map[string]int{"POST": http.StatusMisdirectedRequest, "GET": http.StatusMisdirectedRequest})
	})
	if ids := s.sandboxIDs(); len(ids) != 0 {
		t.Errorf("the pages created sandboxes: %v", ids)
	}
	s.stopAndCheckClean()
}

// checkBrowserSaw checks that the browser got a response for url to each
// method, with the status want gives.
func checkBrowserSaw(t *testing.T, b *browser.Browser, url string, want map[string]int) {
	t.Helper()
	seen := map[string][]int{}
	for _, r := range b.Responses() {
		if r.URL == url {
			seen[r.Method] = append(seen[r.Method], r.Status)
		}
	}
	for method, status := range want {
		if len(seen[method]) == 0 {
			t.Errorf("the browser got no answer to %s %s (it got %v)", method, url, seen)
		}
		for _, got := range seen[method] {
			if got != status {
				t.Errorf("the browser got %d for %s %s, want %d", got, method, url, status)
			}
		}
	}
}
