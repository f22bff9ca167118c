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
// inside sandbox id, through its placement (on this host, the sandbox's
// kernel, so that a port preview works in every network mode, none
// included).
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
				return s.place.DialPort(s.stopCtx, id, port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: nothing answers on port %d: %v", id, port, err))
		},
	}
	rp.ServeHTTP(w, r)
}
