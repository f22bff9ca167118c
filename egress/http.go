package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// serveHTTP forwards plain HTTP requests to the host their Host names, if
// the policy allows it. Every request on the connection is read and must
// name the same host as the first (a later request for another host is
// refused, and the connection ends); an upgraded connection (WebSocket)
// is passed through as it is once the upstream has its request.
func (g *Gateway) serveHTTP(ctx context.Context, c net.Conn, e *Entry) {
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(peekTimeout)) //nolint:errcheck // TCP supports deadlines
	req, err := http.ReadRequest(br)
	c.SetReadDeadline(time.Time{}) //nolint:errcheck // as above
	if err != nil {
		e.Decision, e.Reason = Deny, "not an HTTP request: "+err.Error()
		return
	}
	host := hostOf(req)
	e.Method, e.Path = req.Method, req.URL.Path
	p, ok := g.decide(host, 80, e)
	if !ok {
		refuse(c, e.Reason)
		return
	}
	up, err := dial(ctx, p, host, g.upstreamPort(80))
	if err != nil {
		e.Error = err.Error()
		refuseStatus(c, http.StatusBadGateway, "hutch egress: "+err.Error())
		return
	}
	defer up.Close()
	e.Upstream = up.RemoteAddr().String()
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(forwardRequests(br, pw, req, host, e))
	}()
	splice(c, up, pr, e)
	pr.Close()
}

// forwardRequests writes req and the requests after it on the connection
// to w, until one names another host than host or the connection is
// upgraded (then the rest passes as it is).
func forwardRequests(br *bufio.Reader, w io.Writer, req *http.Request, host string, e *Entry) error {
	for {
		if _, ok := req.Header["User-Agent"]; !ok {
			// Request.Write would add Go's own.
			req.Header["User-Agent"] = []string{""}
		}
		if err := req.Write(w); err != nil {
			return err
		}
		if strings.EqualFold(req.Header.Get("Connection"), "upgrade") || req.Header.Get("Upgrade") != "" {
			_, err := io.Copy(w, br)
			return err
		}
		next, err := http.ReadRequest(br)
		if err != nil {
			return nil // the sandbox closed its end, or sent no more
		}
		if h := hostOf(next); h != host {
			e.Decision, e.Reason = Deny, fmt.Sprintf("a later request on the connection names host %s, not %s", h, host)
			return fmt.Errorf("%s", e.Reason)
		}
		req = next
	}
}

// hostOf is the host req names, without a port.
func hostOf(req *http.Request) string {
	h := req.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

func refuse(c net.Conn, why string) {
	refuseStatus(c, http.StatusForbidden, "hutch egress: refused: "+why)
}

func refuseStatus(c net.Conn, status int, msg string) {
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n",
		status, http.StatusText(status), len(msg)+1, msg)
}
