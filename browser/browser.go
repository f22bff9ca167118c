// Package browser is the DevTools (CDP) endpoint of a sandbox's
// Chromium, as hutch serve and `hutch browser` give it out: one URL
// that carries a token, for Playwright's connectOverCDP and Puppeteer's
// connect, and needs no extra headers.
//
// Chromium serves DevTools on 127.0.0.1:Port inside the sandbox, where
// only the sandbox's own kernel reaches it; the host dials it through the
// sandbox (engine.PortDialer, serve's placement). Chromium insists on a
// Host header that is an IP address or localhost, and its /json answers
// name ws://127.0.0.1:Port/...: the Proxy rewrites both ways, so that the
// client's next connection comes back through the same route with the
// same token.
package browser

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
)

// Port is the port inside the sandbox on which its Chromium serves
// DevTools, on 127.0.0.1 only.
const Port = 9222

// TokenParam is the query parameter that carries a DevTools URL's token.
const TokenParam = "hutch_token"

// BrowserPath is the stable path of the browser's own DevTools
// WebSocket: the Proxy sends it on to /devtools/browser/GUID, whatever
// the GUID of the Chromium running now.
const BrowserPath = "/devtools/browser"

// StartCommand starts the sandbox's Chromium with DevTools on Port if it
// is not already running, and waits until DevTools answers: headless, or
// on the X display named (":0" on the desktop template). The command is
// in the templates that have Chromium (buildimg/desktop).
func StartCommand(display string) []string {
	args := []string{"/usr/local/bin/hutch-browser"}
	if display != "" {
		args = append(args, "--display", display)
	}
	return args
}

// ValidDisplay tells whether d names an X display: ":N" or ":N.S".
func ValidDisplay(d string) bool {
	if len(d) < 2 || len(d) > 8 || d[0] != ':' {
		return false
	}
	for _, c := range d[1:] {
		if (c < '0' || c > '9') && c != '.' {
			return false
		}
	}
	return true
}

// URL is the DevTools WebSocket URL a client connects to: scheme is ws
// or wss, host the host (and port) the client reaches the proxy at.
func URL(scheme, host, token string) string {
	u := url.URL{Scheme: scheme, Host: host, Path: BrowserPath}
	if token != "" {
		u.RawQuery = url.Values{TokenParam: {token}}.Encode()
	}
	return u.String()
}

// Proxy forwards DevTools requests (HTTP and WebSocket) to the Chromium
// in one sandbox.
type Proxy struct {
	// Transport carries requests to Port inside the sandbox, whatever
	// URL they name (DialTransport makes one).
	Transport http.RoundTripper
	// Token is added to every DevTools URL the proxy's answers name,
	// for the client's next connection; the caller checks it on the way
	// in (Check).
	Token string
	// OnError, if set, writes an error answer; the default is plain text.
	OnError func(w http.ResponseWriter, status int, msg string)
}

// DialTransport is a transport whose every connection is dial's: one
// to Port inside the sandbox.
func DialTransport(dial func(ctx context.Context) (net.Conn, error)) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
	}
}

// notAnswering says that nothing answers on Port.
func notAnswering(err error) string {
	return fmt.Sprintf("the sandbox's browser does not answer on port %d (start it: hutch browser ID, or POST /sandboxes/ID/browser): %v", Port, err)
}

// Check tells whether r carries token in its URL.
func Check(r *http.Request, token string) bool {
	got := r.URL.Query().Get(TokenParam)
	return token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// publicBase is the scheme and host the client reached the proxy at, for
// the URLs in the answers.
func publicBase(r *http.Request) (wsScheme, host string) {
	wsScheme = "ws"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		wsScheme = "wss"
	}
	return wsScheme, r.Host
}

func (p *Proxy) fail(w http.ResponseWriter, status int, msg string) {
	if p.OnError != nil {
		p.OnError(w, status, msg)
		return
	}
	http.Error(w, msg, status)
}

// ServeHTTP forwards r to the sandbox's Chromium.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if path == BrowserPath || path == BrowserPath+"/" {
		// The stable browser URL: find the GUID of the Chromium that
		// runs now.
		v, err := p.version(r.Context())
		if err != nil {
			p.fail(w, http.StatusBadGateway, notAnswering(err))
			return
		}
		u, err := url.Parse(v)
		if err != nil || !strings.HasPrefix(u.Path, BrowserPath+"/") {
			p.fail(w, http.StatusBadGateway, fmt.Sprintf("the sandbox's browser gave no DevTools URL (%q)", v))
			return
		}
		path = u.Path
	}
	wsScheme, host := publicBase(r)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			q := pr.In.URL.Query()
			q.Del(TokenParam)
			pr.Out.URL = &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(Port), Path: path, RawQuery: q.Encode()}
			// Chromium answers only a Host that is an IP address or
			// localhost, and checks Origin on WebSockets: it is the
			// proxy's client, from its own side.
			pr.Out.Host = "127.0.0.1:" + strconv.Itoa(Port)
			pr.Out.Header.Del("Origin")
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("X-Forwarded-For")
		},
		Transport: p.Transport,
		ModifyResponse: func(res *http.Response) error {
			if !strings.HasPrefix(path, "/json") || res.StatusCode != http.StatusOK {
				return nil
			}
			b, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
			res.Body.Close()
			if err != nil {
				return err
			}
			b = rewriteJSON(b, wsScheme, host, p.Token)
			res.Body = io.NopCloser(bytes.NewReader(b))
			res.ContentLength = int64(len(b))
			res.Header.Set("Content-Length", strconv.Itoa(len(b)))
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			p.fail(w, http.StatusBadGateway, notAnswering(err))
		},
	}
	rp.ServeHTTP(w, r)
}

// version asks the sandbox's Chromium for its browser's DevTools URL.
func (p *Proxy) version(ctx context.Context) (string, error) {
	c := &http.Client{Transport: p.Transport}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(Port)+"/json/version", nil)
	if err != nil {
		return "", err
	}
	res, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	var v struct {
		URL string `json:"webSocketDebuggerUrl"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&v); err != nil {
		return "", fmt.Errorf("/json/version: %w", err)
	}
	return v.URL, nil
}

// rewriteJSON rewrites the DevTools URLs in one of Chromium's /json
// answers (an object, or a list of them) to the proxy's, with the token:
// webSocketDebuggerUrl, and the ws= of devtoolsFrontendUrl.
func rewriteJSON(b []byte, wsScheme, host, token string) []byte {
	var one map[string]any
	if err := json.Unmarshal(b, &one); err == nil {
		rewriteTarget(one, wsScheme, host, token)
		out, _ := json.MarshalIndent(one, "", "   ")
		return out
	}
	var list []map[string]any
	if err := json.Unmarshal(b, &list); err == nil {
		for _, t := range list {
			rewriteTarget(t, wsScheme, host, token)
		}
		out, _ := json.MarshalIndent(list, "", "   ")
		return out
	}
	return b
}

func rewriteTarget(t map[string]any, wsScheme, host, token string) {
	if s, ok := t["webSocketDebuggerUrl"].(string); ok {
		if u, err := url.Parse(s); err == nil {
			u.Scheme, u.Host = wsScheme, host
			if token != "" {
				q := u.Query()
				q.Set(TokenParam, token)
				u.RawQuery = q.Encode()
			}
			t["webSocketDebuggerUrl"] = u.String()
		}
	}
	if s, ok := t["devtoolsFrontendUrl"].(string); ok {
		if u, err := url.Parse(s); err == nil {
			q := u.Query()
			if ws := q.Get("ws"); ws != "" {
				_, rest, _ := strings.Cut(ws, "/")
				target := host + "/" + rest
				if token != "" {
					target += "?" + TokenParam + "=" + token
				}
				q.Del("ws")
				if wsScheme == "wss" {
					q.Set("wss", target)
				} else {
					q.Set("ws", target)
				}
				u.RawQuery = q.Encode()
				t["devtoolsFrontendUrl"] = u.String()
			}
		}
	}
}
