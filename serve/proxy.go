package serve

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
)

// proxy forwards an HTTP request (WebSocket upgrades included) to port
// inside sandbox id, through the sandbox's kernel (engine.PortDialer): a
// port preview works in every network mode, none included.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string, port uint16) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: "sandbox:" + strconv.Itoa(int(port))})
			pr.Out.Host = r.Host
			pr.Out.Header.Del("X-Access-Token")
			pr.Out.Header.Del("E2b-Traffic-Access-Token")
			pr.Out.Header.Del("E2b-Sandbox-Id")
			pr.Out.Header.Del("E2b-Sandbox-Port")
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.dial(id, port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: nothing answers on port %d: %v", id, port, err))
		},
	}
	rp.ServeHTTP(w, r)
}

// dial connects to port in sandbox id with the server's one dialer for
// that sandbox, made on first use.
func (s *Server) dial(id string, port uint16) (net.Conn, error) {
	if s.kube != nil {
		return s.kube.dialPort(s.stopCtx, id, port)
	}
	s.dialMu.Lock()
	d, ok := s.dialers[id]
	if !ok {
		var err error
		if d, err = s.eng.PortDialer(s.stopCtx, id); err != nil {
			s.dialMu.Unlock()
			return nil, err
		}
		s.dialers[id] = d
	}
	s.dialMu.Unlock()
	c, err := d.Dial(port)
	if err != nil {
		// The sandbox may have been paused and resumed (a new
		// control socket, a new agent): drop the dialer so the next
		// request makes another.
		s.dialMu.Lock()
		if s.dialers[id] == d {
			delete(s.dialers, id)
		}
		s.dialMu.Unlock()
		d.Close()
	}
	return c, err
}
