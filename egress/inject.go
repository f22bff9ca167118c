package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"hutch.dev/hutch/policy"
)

// idleTimeout ends a terminated connection that sends no request for
// this long.
const idleTimeout = 2 * time.Minute

// injectFor are the inject rules for host.
func injectFor(rules []policy.InjectRule, host string) []policy.InjectRule {
	var out []policy.InjectRule
	for _, r := range rules {
		if r.Host == host {
			out = append(out, r)
		}
	}
	return out
}

// replayConn gives crypto/tls the ClientHello already read, then the
// rest of the connection, counting what the sandbox sent.
type replayConn struct {
	net.Conn
	r io.Reader
	n *int64
}

func (c *replayConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += int64(n)
	return n, err
}

// countWriter counts what is written to the sandbox.
type countWriter struct {
	w io.Writer
	n *int64
}

func (c countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	*c.n += int64(n)
	return n, err
}

// terminate serves a TLS connection to host, which has inject rules, as
// that host, with a certificate of the sandbox's gateway CA: each request
// must name host as its Host, gets the rules' headers, and is sent on to
// the real host, whose certificate is checked against the host's trust
// store. The secrets' values exist only in the requests sent upstream.
func (g *Gateway) terminate(ctx context.Context, c net.Conn, hello []byte, host string, p *Policy, rules []policy.InjectRule, e *Entry) {
	leaf, err := g.ca.leaf(host)
	if err != nil {
		e.Error = err.Error()
		return
	}
	rc := &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello), c), n: &e.BytesOut}
	tc := tls.Server(rc, &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	hctx, cancel := context.WithTimeout(ctx, peekTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		e.Error = "TLS handshake with the sandbox: " + err.Error()
		return
	}
	e.Terminated = true
	upPort := g.upstreamPort(443)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			up, err := dial(ctx, p, host, upPort)
			if err == nil && e.Upstream == "" {
				e.Upstream = up.RemoteAddr().String()
			}
			return up, err
		},
		TLSClientConfig:    &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:  true,
		DisableCompression: true,
		IdleConnTimeout:    idleTimeout,
	}
	defer tr.CloseIdleConnections()
	out := countWriter{w: tc, n: &e.BytesIn}
	br := bufio.NewReader(tc)
	for {
		tc.SetReadDeadline(time.Now().Add(idleTimeout)) //nolint:errcheck // TCP supports deadlines
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		tc.SetReadDeadline(time.Time{}) //nolint:errcheck // as above
		if e.Method == "" {
			e.Method, e.Path = req.Method, req.URL.Path
		}
		if h := hostOf(req); h != host {
			e.Decision, e.Reason = Deny, fmt.Sprintf("Host %s on a connection to %s", h, host)
			refuseStatus(tc, http.StatusMisdirectedRequest, "hutch egress: refused: "+e.Reason)
			return
		}
		if err := g.inject(req, rules); err != nil {
			e.Error = err.Error()
			refuseStatus(tc, http.StatusBadGateway, "hutch egress: "+err.Error())
			return
		}
		req.URL.Scheme, req.URL.Host, req.RequestURI = "https", host, ""
		if upPort != 443 {
			req.URL.Host = net.JoinHostPort(host, strconv.Itoa(int(upPort)))
		}
		req = req.WithContext(ctx)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			e.Error = err.Error()
			refuseStatus(tc, http.StatusBadGateway, "hutch egress: "+err.Error())
			return
		}
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
		err = resp.Write(out)
		resp.Body.Close()
		if err != nil || req.Close || resp.Close {
			return
		}
	}
}

// inject applies rules to req: a rule's header is set to its value; an
// env rule's placeholder is replaced by its value in every header.
func (g *Gateway) inject(req *http.Request, rules []policy.InjectRule) error {
	for _, r := range rules {
		v, err := r.Resolve(g.cfg.Secret)
		if err != nil {
			return err
		}
		if r.Header != "" {
			req.Header.Set(r.Header, v)
			continue
		}
		if r.Placeholder == "" {
			continue
		}
		for k, vs := range req.Header {
			for i := range vs {
				vs[i] = strings.ReplaceAll(vs[i], r.Placeholder, v)
			}
			req.Header[k] = vs
		}
	}
	return nil
}
