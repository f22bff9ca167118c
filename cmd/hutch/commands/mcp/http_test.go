package mcp

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hutch.dev/hutch/engine"
)

func TestParseListen(t *testing.T) {
	abs, _ := filepath.Abs("rel.sock")
	for in, want := range map[string]listenAddr{
		"127.0.0.1:8931":   {tcp: "127.0.0.1:8931"},
		"unix":             {unix: true},
		"unix:/run/x.sock": {unix: true, socket: "/run/x.sock"},
		"unix:rel.sock":    {unix: true, socket: abs},
	} {
		if got, err := parseListen(in); err != nil || got != want {
			t.Errorf("parseListen(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"unix:", "unix:/run/", "0.0.0.0:8931", ":8931", "unixx", "10.0.0.1:80"} {
		if _, err := parseListen(bad); err == nil {
			t.Errorf("parseListen(%q) accepted", bad)
		}
	}
}

func TestHostCheck(t *testing.T) {
	h := hostCheck(8931, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	for host, ok := range map[string]bool{
		"127.0.0.1:8931":        true,
		"localhost:8931":        true,
		"LocalHost:8931":        true,
		"[::1]:8931":            true,
		"127.0.0.1:8932":        false,
		"localhost":             false,
		"evil.example:8931":     false,
		"127.0.0.1.nip.io:8931": false,
		"":                      false,
	} {
		r := httptest.NewRequest("POST", "/mcp", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := w.Code == 200; got != ok {
			t.Errorf("Host %q: %d %q, want allowed %v", host, w.Code, w.Body.String(), ok)
		}
		if !ok && !strings.Contains(w.Body.String(), "answers only to localhost:8931") {
			t.Errorf("Host %q refused with %q: want the names it answers to", host, w.Body.String())
		}
	}
	// On port 80 a client leaves the port out.
	r := httptest.NewRequest("POST", "/mcp", nil)
	r.Host = "localhost"
	w := httptest.NewRecorder()
	hostCheck(80, http.NotFoundHandler()).ServeHTTP(w, r)
	if w.Code != 404 {
		t.Errorf("port 80, Host localhost: %d, want it let through", w.Code)
	}
}

func TestToken(t *testing.T) {
	dir := t.TempDir()
	tok, err := loadToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(tok.value) != 2*tokenLen || strings.ToLower(tok.value) != tok.value {
		t.Fatalf("token %q: want %d lower hex digits", tok.value, 2*tokenLen)
	}
	fi, err := os.Stat(filepath.Join(dir, tokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v, want mode 0600", fi, err)
	}
	again, err := loadToken(dir)
	if err != nil || again.value != tok.value {
		t.Fatalf("second load: %q %v, want the same token", again.value, err)
	}
	h := tok.require(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	for auth, code := range map[string]int{
		"":                               401,
		"Bearer " + tok.value:            200,
		"bearer " + tok.value:            200,
		"Bearer " + tok.value[:39] + "x": 401,
		"Bearer " + tok.value + "0":      401,
		"Basic " + tok.value:             401,
		"Bearer":                         401,
	} {
		r := httptest.NewRequest("POST", "/mcp", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != code {
			t.Errorf("Authorization %q: %d %q, want %d", auth, w.Code, w.Body.String(), code)
		}
	}
	// A token file someone changed is put back; a new key is a new
	// token, and the old one no longer opens anything.
	if err := os.WriteFile(filepath.Join(dir, tokenFile), []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if again, err := loadToken(dir); err != nil || again.value != tok.value {
		t.Errorf("after the token file was changed: %q %v, want the token again", again.value, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, tokenFile)); strings.TrimSpace(string(b)) != tok.value {
		t.Errorf("the token file holds %q, want the token", b)
	}
	if err := os.Remove(filepath.Join(dir, keyFile)); err != nil {
		t.Fatal(err)
	}
	renewed, err := loadToken(dir)
	if err != nil || renewed.value == tok.value || len(renewed.value) != 2*tokenLen {
		t.Fatalf("after the key was removed: %q %v, want a new token", renewed.value, err)
	}
	r := httptest.NewRequest("POST", "/mcp", nil)
	r.Header.Set("Authorization", "Bearer "+tok.value)
	w := httptest.NewRecorder()
	renewed.require(h).ServeHTTP(w, r)
	if w.Code != 401 {
		t.Errorf("the revoked token: %d, want 401", w.Code)
	}
}

// The socket serves its owner; the peer check reads who connected.
func TestOwnerOnlySocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "mcp.sock")
	l, err := engine.ListenOwnerSocket(sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{ConnContext: peerContext, Handler: ownerOnly(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), slog.New(slog.DiscardHandler))}
	go hs.Serve(l)
	defer hs.Close()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Get("http://localhost/mcp")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("the owner through the socket: %s %q", resp.Status, b)
	}
	// A request that did not come through the socket is not taken for
	// root's.
	w := httptest.NewRecorder()
	ownerOnly(http.NotFoundHandler(), slog.New(slog.DiscardHandler)).ServeHTTP(w, httptest.NewRequest("GET", "/mcp", nil))
	if w.Code != 403 {
		t.Errorf("a request without a peer: %d, want 403", w.Code)
	}
}
