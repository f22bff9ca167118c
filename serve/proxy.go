package serve

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"time"
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
		Transport: s.ports.transport(id, port, func() (net.Conn, error) {
			return s.place.DialPort(s.stopCtx, id, port)
		}),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: nothing answers on port %d: %v", id, port, err))
		},
	}
	// The transport may still be reading the request's body (to its end)
	// when the sandbox's server answers, as servers do once they have
	// read what they need: Go's HTTP/1 server would then consume and
	// close the body as the answer's headers go out, under the
	// transport's read, which fails the request's write, and the
	// transport drops the connection with the answer half sent. Full
	// duplex leaves the body to the transport. (HTTP/2 always is.)
	_ = http.NewResponseController(w).EnableFullDuplex() // not every writer can (tests' recorders, HTTP/2)
	rp.ServeHTTP(w, r)
}

// portIdle is how long a connection into a sandbox's port waits for the
// next request. It is shorter than the idle timeouts of common servers
// (Node's 5 s, uvicorn's 5 s; Python's http.server and Go's have none),
// so that the server in the sandbox does not close a connection just as
// a request is sent on it.
const portIdle = 2 * time.Second

// portTransports are the HTTP transports into sandboxes' ports, one per
// sandbox and port, so that the requests of a client calling a server in
// a sandbox over and over (the code interpreter, a dev server) reuse
// their connections into it instead of dialling each time.
type portTransports struct {
	mu sync.Mutex
	m  map[portKey]*http.Transport
}

type portKey struct {
	id   string
	port uint16
}

// transport is the transport into port of sandbox id, made with dial on
// first use.
func (p *portTransports) transport(id string, port uint16, dial func() (net.Conn, error)) *http.Transport {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := portKey{id, port}
	if t, ok := p.m[k]; ok {
		return t
	}
	t := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return dial()
		},
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     portIdle,
	}
	if p.m == nil {
		p.m = map[portKey]*http.Transport{}
	}
	p.m[k] = t
	return t
}

// forget closes the idle connections into sandbox id's ports and drops
// their transports: the sandbox is paused or removed.
func (p *portTransports) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, t := range p.m {
		if k.id == id {
			t.CloseIdleConnections()
			delete(p.m, k)
		}
	}
}
