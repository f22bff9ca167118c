package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"time"
)

// Prefix is the path the console is served under.
const Prefix = "/console"

// EnvdPort is the port of a sandbox's envd data plane (E2B's).
const EnvdPort = "49983"

// OperatorTenantsPath is serve's operator view (serve.OperatorTenantsPath):
// every tenant's quota, use and sandboxes, for the operator's key only.
const OperatorTenantsPath = "/operator/tenants"

// ScreenPort is the port serve bridges to a desktop sandbox's VNC server
// (screen.VNCPort), with the sandbox's stream token.
const ScreenPort = "5909"

// CSP is the Content-Security-Policy of every console response: the
// pages run only their own scripts, reach only their own origin, and
// report any violation to the console.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; " +
	"connect-src 'self'; worker-src 'self' blob:; font-src 'self'; frame-ancestors 'none'; " +
	"base-uri 'none'; form-action 'self'; report-uri " + Prefix + "/csp-report"

// AssetsTarget is the make target that builds the assets.
const AssetsTarget = "make console-assets"

// Config configures a Handler.
type Config struct {
	// API is serve's routing (serve.Server.Routes), which the console
	// calls in process:
	// the control plane by path, a sandbox's envd by E2B's
	// E2b-Sandbox-Id and E2b-Sandbox-Port headers.
	API http.Handler
	// Secure marks the session cookie Secure: serve runs TLS.
	Secure bool
	// Domain is the domain sandbox ports are named under
	// (PORT-ID.DOMAIN), for the pages' preview links.
	Domain string
	// Logger receives the console's logs; nil: slog.Default().
	Logger *slog.Logger
	// Assets are the pages; nil: the embedded build, if any.
	Assets fs.FS
	// Now is the clock; nil: time.Now.
	Now func() time.Time
}

// Handler serves the console under Prefix.
type Handler struct {
	cfg      Config
	log      *slog.Logger
	assets   fs.FS
	sessions *sessions
	// cspReports counts the violation reports browsers sent.
	cspReports atomic.Int64
}

// New makes the console's handler.
func New(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	assets := cfg.Assets
	if assets == nil {
		assets = builtAssets()
	}
	return &Handler{cfg: cfg, log: cfg.Logger, assets: assets, sessions: newSessions(cfg.Now, MaxSessions)}
}

// CSPReports is the number of Content-Security-Policy violation reports
// received.
func (h *Handler) CSPReports() int64 { return h.cspReports.Load() }

// ServeHTTP serves a request whose path is Prefix or under it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", CSP)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	rest := strings.TrimPrefix(r.URL.Path, Prefix)
	switch {
	case rest == "":
		http.Redirect(w, r, Prefix+"/", http.StatusFound)
	case rest == "/session":
		h.serveSession(w, r)
	case rest == "/csp-report":
		h.serveCSPReport(w, r)
	case strings.HasPrefix(rest, "/api/"):
		h.serveAPI(w, r, strings.TrimPrefix(rest, "/api"))
	case strings.HasPrefix(rest, "/envd/"):
		h.serveEnvd(w, r, strings.TrimPrefix(rest, "/envd/"))
	case strings.HasPrefix(rest, "/screen/"):
		h.serveScreen(w, r, strings.TrimPrefix(rest, "/screen/"))
	default:
		h.serveAsset(w, r, rest)
	}
}

type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apiError{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// serveAsset serves the page's files; without a build, 503.
func (h *Handler) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, r.Method+" "+r.URL.Path+": the console's pages are read with GET")
		return
	}
	if h.assets == nil {
		writeError(w, http.StatusServiceUnavailable, "the console's assets are not built into this hutch: build them with `"+AssetsTarget+"` (make build does), then build hutch again")
		return
	}
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	if name == "" || !strings.Contains(path.Base(name), ".") {
		// The pages are one document; its script picks the view.
		name = "index.html"
	}
	b, err := fs.ReadFile(h.assets, name)
	if err != nil {
		writeError(w, http.StatusNotFound, "no console asset "+name)
		return
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	if name == "index.html" {
		w.Header().Set("Cache-Control", "no-cache")
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}

// serveCSPReport counts and logs a browser's violation report (POST);
// GET answers the count.
func (h *Handler) serveCSPReport(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		body, _ := io.ReadAll(io.LimitReader(r.Body, 16<<10))
		n := h.cspReports.Add(1)
		h.log.Warn("console: Content-Security-Policy violation", "report", string(body), "count", n)
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]int64{"reports": h.cspReports.Load()})
	default:
		writeError(w, http.StatusMethodNotAllowed, "the CSP report endpoint takes POST (reports) and GET (their count)")
	}
}

// current is r's session, or an answer written and nil.
func (h *Handler) current(w http.ResponseWriter, r *http.Request) *session {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		writeError(w, http.StatusUnauthorized, "not signed in to the console: POST "+Prefix+"/session with an API key")
		return nil
	}
	s, expired := h.sessions.get(c.Value)
	if s == nil {
		msg := "the console session is not known (signed out, or the server restarted): sign in again"
		if expired {
			msg = "the console session has expired: sign in again"
		}
		h.clearCookie(w)
		writeError(w, http.StatusUnauthorized, msg)
		return nil
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !s.csrfOK(r.Header.Get(CSRFHeader)) {
		writeError(w, http.StatusForbidden, r.Method+" "+r.URL.Path+": the console's CSRF token is missing or wrong ("+CSRFHeader+" header; GET "+Prefix+"/session gives it)")
		return nil
	}
	return s
}

func (h *Handler) setCookie(w http.ResponseWriter, s *session) {
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: s.id, Path: Prefix, Expires: s.expires, MaxAge: int(SessionTTL / time.Second),
		HttpOnly: true, Secure: h.cfg.Secure, SameSite: http.SameSiteStrictMode,
	})
}

func (h *Handler) clearCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, Secure: h.cfg.Secure, SameSite: http.SameSiteStrictMode})
}

// sessionInfo is what GET and POST /console/session answer.
type sessionInfo struct {
	SignedIn bool      `json:"signedIn"`
	CSRF     string    `json:"csrf,omitempty"`
	Expires  time.Time `json:"expires,omitzero"`
	Domain   string    `json:"domain,omitempty"`
	// Operator: signed in with the operator's key.
	Operator bool `json:"operator,omitempty"`
}

func (h *Handler) serveSession(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		c, err := r.Cookie(CookieName)
		var s *session
		if err == nil {
			s, _ = h.sessions.get(c.Value)
		}
		if s == nil {
			writeJSON(w, http.StatusOK, sessionInfo{})
			return
		}
		writeJSON(w, http.StatusOK, sessionInfo{SignedIn: true, CSRF: s.csrf, Expires: s.expires, Domain: h.cfg.Domain, Operator: s.operator})
	case http.MethodPost:
		h.signIn(w, r)
	case http.MethodDelete:
		s := h.current(w, r)
		if s == nil {
			return
		}
		h.sessions.remove(s.id)
		h.clearCookie(w)
		w.WriteHeader(http.StatusNoContent)
	default:
		writeError(w, http.StatusMethodNotAllowed, "the console session takes GET, POST (sign in) and DELETE (sign out)")
	}
}

// signIn checks the key of a POST /console/session {"apiKey": ...} by
// listing one sandbox with it, and makes a session for it.
func (h *Handler) signIn(w http.ResponseWriter, r *http.Request) {
	// A form of another site can post text/plain or a form; JSON it
	// cannot without asking first.
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "sign in with a JSON body {\"apiKey\": ...} (Content-Type: application/json)")
		return
	}
	var body struct {
		APIKey string `json:"apiKey"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 8<<10)).Decode(&body); err != nil || body.APIKey == "" {
		writeError(w, http.StatusBadRequest, "sign in with a JSON body {\"apiKey\": ...}: an API key is required")
		return
	}
	rec := h.call(r, http.MethodGet, "/v2/sandboxes?limit=1", body.APIKey, nil)
	operator := false
	if rec.status == http.StatusForbidden {
		// A valid key that acts as no tenant: the operator's, if it
		// opens the operator's view.
		rec = h.call(r, http.MethodGet, OperatorTenantsPath, body.APIKey, nil)
		operator = rec.status == http.StatusOK
	}
	switch {
	case rec.status == http.StatusUnauthorized || rec.status == http.StatusForbidden:
		writeError(w, http.StatusUnauthorized, "the API key is not valid for this server")
		return
	case rec.status != http.StatusOK:
		writeError(w, http.StatusBadGateway, "could not check the API key: the API answered "+http.StatusText(rec.status))
		return
	}
	s := h.sessions.add(body.APIKey, operator)
	h.setCookie(w, s)
	writeJSON(w, http.StatusOK, sessionInfo{SignedIn: true, CSRF: s.csrf, Expires: s.expires, Domain: h.cfg.Domain, Operator: operator})
}

// inner is r as the console passes it on: for path, with none of the
// browser's credentials or routing headers.
func inner(r *http.Request, method, target string, body io.Reader) *http.Request {
	r2 := r.Clone(r.Context())
	r2.Method = method
	u, err := url.ParseRequestURI(target)
	if err != nil {
		u = &url.URL{Path: "/"}
	}
	r2.URL = u
	r2.RequestURI = u.RequestURI()
	for _, k := range []string{"Cookie", CSRFHeader, "Authorization", "X-Api-Key", "X-Access-Token",
		"E2b-Sandbox-Id", "E2b-Sandbox-Port", "E2b-Traffic-Access-Token", "Origin", "Referer"} {
		r2.Header.Del(k)
	}
	if body != nil {
		r2.Body = io.NopCloser(body)
		r2.ContentLength = -1
		r2.Header.Set("Content-Type", "application/json")
	}
	return r2
}

// recorder keeps a bounded response of an in-process call.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (rc *recorder) Header() http.Header { return rc.header }
func (rc *recorder) WriteHeader(status int) {
	if rc.status == 0 {
		rc.status = status
	}
}

func (rc *recorder) Write(b []byte) (int, error) {
	if rc.status == 0 {
		rc.status = http.StatusOK
	}
	if rc.body.Len()+len(b) > 1<<20 {
		return 0, errors.New("console: response too large")
	}
	return rc.body.Write(b)
}

// call makes one control-plane call with key, in process.
func (h *Handler) call(r *http.Request, method, target, key string, body []byte) *recorder {
	var br io.Reader
	if body != nil {
		br = bytes.NewReader(body)
	}
	r2 := inner(r, method, target, br)
	r2.Header.Set("X-API-Key", key)
	rc := &recorder{header: http.Header{}}
	h.cfg.API.ServeHTTP(rc, r2)
	if rc.status == 0 {
		rc.status = http.StatusOK
	}
	return rc
}

// serveAPI passes /console/api/PATH to the control plane's PATH with the
// session's key.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request, p string) {
	s := h.current(w, r)
	if s == nil {
		return
	}
	target := p
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	r2 := inner(r, r.Method, target, nil)
	r2.Header.Set("X-API-Key", s.key)
	w.Header().Set("Cache-Control", "no-store")
	h.cfg.API.ServeHTTP(w, r2)
}

// validID tells whether id can name a sandbox: it goes into a path.
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// envdToken is the session's envd access token of sandbox id, obtained
// with its key (POST /sandboxes/ID/connect) the first time.
func (h *Handler) envdToken(r *http.Request, s *session, id string) (string, int, string) {
	if t, ok := s.token(id); ok {
		return t, 0, ""
	}
	rec := h.call(r, http.MethodPost, "/sandboxes/"+id+"/connect", s.key, []byte("{}"))
	if rec.status != http.StatusOK && rec.status != http.StatusCreated {
		var e apiError
		_ = json.Unmarshal(rec.body.Bytes(), &e)
		if e.Message == "" {
			e.Message = "sandbox " + id + ": " + http.StatusText(rec.status)
		}
		return "", rec.status, e.Message
	}
	var sb struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(rec.body.Bytes(), &sb); err != nil {
		return "", http.StatusBadGateway, "sandbox " + id + ": the connect call's answer is not JSON"
	}
	s.setToken(id, sb.EnvdAccessToken)
	return sb.EnvdAccessToken, 0, ""
}

// serveEnvd passes /console/envd/ID/PATH to PATH of sandbox ID's envd,
// with the envd access token the session's key obtains.
func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, rest string) {
	s := h.current(w, r)
	if s == nil {
		return
	}
	id, p, _ := strings.Cut(rest, "/")
	if !validID(id) {
		writeError(w, http.StatusBadRequest, "not a sandbox ID in the path: want "+Prefix+"/envd/ID/...")
		return
	}
	tok, status, msg := h.envdToken(r, s, id)
	if status != 0 {
		writeError(w, status, msg)
		return
	}
	target := "/" + p
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	r2 := inner(r, r.Method, target, nil)
	r2.Header.Set("E2b-Sandbox-Id", id)
	r2.Header.Set("E2b-Sandbox-Port", EnvdPort)
	if tok != "" {
		r2.Header.Set("X-Access-Token", tok)
	}
	sw := &statusWriter{ResponseWriter: w}
	h.cfg.API.ServeHTTP(sw, r2)
	if sw.status == http.StatusNotFound || sw.status == http.StatusBadGateway || sw.status == http.StatusUnauthorized {
		// Its tokens may have been replaced, or it is gone: ask again
		// next time.
		s.dropToken(id)
	}
}

// statusWriter notes the status of a response it passes on, streams
// included.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (sw *statusWriter) WriteHeader(status int) {
	if sw.status == 0 {
		sw.status = status
	}
	sw.ResponseWriter.WriteHeader(status)
}

func (sw *statusWriter) Write(b []byte) (int, error) {
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	return sw.ResponseWriter.Write(b)
}

func (sw *statusWriter) Flush() {
	if f, ok := sw.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (sw *statusWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

// serveScreen bridges /console/screen/ID, a WebSocket the page's noVNC
// opens, to sandbox ID's screen: serve's POST /sandboxes/ID/screen,
// called with the session's key, starts its VNC server if need be and
// gives the stream token that serve's port routing asks for the VNC
// port. The handshake must come from the console's own origin: a
// WebSocket carries no CSRF header, and the session cookie's
// SameSite=Strict is the other half of that guard.
func (h *Handler) serveScreen(w http.ResponseWriter, r *http.Request, id string) {
	s := h.current(w, r)
	if s == nil {
		return
	}
	if !validID(id) {
		writeError(w, http.StatusBadRequest, "not a sandbox ID in the path: want "+Prefix+"/screen/ID")
		return
	}
	if o, err := url.Parse(r.Header.Get("Origin")); err != nil || o.Host == "" || !strings.EqualFold(o.Host, r.Host) {
		writeError(w, http.StatusForbidden, "the screen's WebSocket opens only from the console's own pages (Origin "+r.Header.Get("Origin")+")")
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		writeError(w, http.StatusBadRequest, Prefix+"/screen/ID is a WebSocket (noVNC's)")
		return
	}
	rec := h.call(r, http.MethodPost, "/sandboxes/"+id+"/screen", s.key, []byte("{}"))
	if rec.status != http.StatusOK {
		var e apiError
		_ = json.Unmarshal(rec.body.Bytes(), &e)
		if e.Message == "" {
			e.Message = "sandbox " + id + ": " + http.StatusText(rec.status)
		}
		writeError(w, rec.status, e.Message)
		return
	}
	var sc struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(rec.body.Bytes(), &sc); err != nil || sc.Token == "" {
		writeError(w, http.StatusBadGateway, "sandbox "+id+": the screen call's answer has no token")
		return
	}
	r2 := inner(r, http.MethodGet, "/?"+url.Values{"hutch_token": {sc.Token}}.Encode(), nil)
	r2.Header.Set("E2b-Sandbox-Id", id)
	r2.Header.Set("E2b-Sandbox-Port", ScreenPort)
	h.cfg.API.ServeHTTP(w, r2)
}
