package serve

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// front is what the server checks of every request before routing it,
// against DNS rebinding and requests forged by web pages (CSRF): the
// Host it is addressed to, and the Origin of a page that sent it.
//
// A browser sends a request for whatever name a page asks, to whatever
// address that name resolves to: a name the attacker controls, made to
// resolve to the server, reaches it with the attacker's Host. So a
// request is served only for the server's own names: its listen address,
// the loopback names at its port, its domain and the sandbox hosts below
// it, and the names given to it (--host). A request from a web page
// carries the page's Origin (every POST does, and every cross-origin
// request): one from a page of another origin is refused whatever its
// route, and a control-plane body must be JSON, which no page can send
// to another origin without its consent.
type front struct {
	// listenHost and listenPort are the listen address's; listenPort
	// empty: loopback names are the server's at any port.
	listenHost, listenPort string
	// domain is the server's domain, lower case.
	domain string
	// hosts are the names given to the server, lower case, each with
	// the port it holds for, or "" for any.
	hosts []hostName
}

type hostName struct{ host, port string }

// newFront is the front of a server listening on listen (HOST:PORT, or
// empty), with domain and the further names hosts (NAME or NAME:PORT).
func newFront(listen, domain string, hosts []string) (front, error) {
	f := front{domain: normalHost(domain)}
	if listen != "" {
		h, p, err := net.SplitHostPort(listen)
		if err != nil {
			return f, fmt.Errorf("listen address %q: %w: %w", listen, err, errdefs.ErrInvalidArgument)
		}
		f.listenHost, f.listenPort = normalHost(h), p
	}
	for _, h := range hosts {
		hn, err := parseHostName(h)
		if err != nil {
			return f, err
		}
		f.hosts = append(f.hosts, hn)
	}
	return f, nil
}

// parseHostName parses a --host value: a DNS name or an IP address,
// optionally with :PORT.
func parseHostName(s string) (hostName, error) {
	bad := func(why string) (hostName, error) {
		return hostName{}, fmt.Errorf("host %q: %s: want a name or an IP address, optionally with :PORT (e.g. hutch.example.test or 192.0.2.7:3000): %w", s, why, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsAny(s, "/?#@*") {
		return bad("a name, not a URL or a pattern")
	}
	host, port := splitHostPort(s)
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return bad("the port is not a number from 1 to 65535")
		}
	}
	host = normalHost(host)
	if host == "" {
		return bad("no name")
	}
	if net.ParseIP(host) == nil {
		for _, label := range strings.Split(host, ".") {
			if label == "" || len(label) > 63 || strings.Trim(label, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
				return bad("not a DNS name")
			}
		}
	}
	return hostName{host: host, port: port}, nil
}

// splitHostPort splits HOST[:PORT] (IPv6 in brackets), where PORT may be
// missing.
func splitHostPort(s string) (host, port string) {
	if h, p, err := net.SplitHostPort(s); err == nil {
		return h, p
	}
	return s, ""
}

// normalHost is a host name as compared: lower case, without brackets or
// a trailing dot.
func normalHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSuffix(h, "]"), "["), ".")
	return strings.ToLower(h)
}

// isLoopbackName tells whether host always names this machine.
func isLoopbackName(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}

// ours tells whether hostport (a Host header, or an Origin's host) names
// this server.
func (f front) ours(hostport string) bool {
	host, port := splitHostPort(hostport)
	host = normalHost(host)
	if host == "" {
		return false
	}
	if f.domain != "" && (host == f.domain || strings.HasSuffix(host, "."+f.domain)) {
		return true
	}
	for _, h := range f.hosts {
		if h.host == host && (h.port == "" || h.port == port) {
			return true
		}
	}
	if f.listenPort == "" {
		return isLoopbackName(host)
	}
	return port == f.listenPort && (host == f.listenHost || isLoopbackName(host))
}

// check is the status and message a request that is not the server's
// answers with, or 0.
func (f front) check(r *http.Request) (int, string) {
	if !f.ours(r.Host) {
		return http.StatusMisdirectedRequest, fmt.Sprintf("Host %q is not a name of this server (hutch serve): it answers for its listen address, localhost at its port, its --domain and the names given with --host", clip(r.Host, 100))
	}
	origin, ok := r.Header["Origin"]
	if !ok {
		return 0, ""
	}
	if len(origin) != 1 {
		return http.StatusForbidden, "more than one Origin header"
	}
	u, err := url.Parse(origin[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !f.ours(u.Host) {
		return http.StatusForbidden, fmt.Sprintf("Origin %q: requests from web pages of other origins are refused", clip(origin[0], 100))
	}
	return 0, ""
}

// checkJSONBody is the error of a control-plane request whose body is not
// declared JSON: a web page can send a body of another type (text/plain,
// a form) to any origin without asking it first.
func checkJSONBody(r *http.Request) error {
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return &unsupportedMediaError{contentType: ct}
}

// unsupportedMediaError answers 415.
type unsupportedMediaError struct{ contentType string }

func (e *unsupportedMediaError) Error() string {
	if e.contentType == "" {
		return "a request body needs Content-Type: application/json"
	}
	return fmt.Sprintf("Content-Type %q: the control plane takes request bodies of application/json only", clip(e.contentType, 100))
}

// clip is s cut to at most n bytes, saying so.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("...(%d bytes more)", len(s)-n)
}
