package serve

import (
	"container/list"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// The HTTP server's timeouts. A request's body is bounded by
// Config.BodyTimeout, set per request (Handler) and lifted by the
// handlers that stream.
const (
	// readHeaderTimeout bounds the reading of a request's headers.
	readHeaderTimeout = 10 * time.Second
	// idleTimeout bounds how long a kept-alive connection waits for its
	// next request.
	idleTimeout = 90 * time.Second
)

// HTTPServer is an http.Server for the server's Handler, with its
// timeouts; serve it on Listener(l).
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ConnContext:       connContext,
		// Failed TLS handshakes and the like, which any client can
		// cause, at debug level.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// Listener is l with the server's bound on untrusted connections: of the
// connections from one client address that have not yet presented a valid
// API key or sandbox token, at most Config.MaxUntrustedConns stay open;
// one more closes the oldest that is not in a request (waiting for its
// headers, or idle after a request without a key), else the oldest. A
// client that shows a key on its connection is never closed for others,
// nor, in a burst, one whose request is being answered; one that holds
// many idle or slow connections without a key crowds out only itself.
func (s *Server) Listener(l net.Listener) net.Listener {
	return &limitListener{Listener: l, lim: s.conns}
}

// connLimiter tracks the untrusted connections of each client address.
type connLimiter struct {
	max int
	log *slog.Logger

	// mu guards untrusted, the untrusted connections by client
	// address, oldest first, each trackedConn's elem and busy, and the
	// count of closed connections not yet logged.
	mu        sync.Mutex
	untrusted map[string]*list.List
	closed    int
	loggedAt  time.Time
}

func newConnLimiter(max int, log *slog.Logger) *connLimiter {
	return &connLimiter{max: max, log: log, untrusted: map[string]*list.List{}}
}

// trackedConn is an accepted connection, untrusted while elem is set,
// busy while the server answers requests on it (HTTP/2 answers several
// at once).
type trackedConn struct {
	net.Conn
	lim  *connLimiter
	addr string
	elem *list.Element
	busy int
}

func (c *trackedConn) Close() error {
	c.lim.remove(c)
	return c.Conn.Close()
}

// add counts c as untrusted, closing the oldest untrusted connection of
// its address if that makes one too many.
func (l *connLimiter) add(c *trackedConn) {
	l.mu.Lock()
	conns := l.untrusted[c.addr]
	if conns == nil {
		conns = list.New()
		l.untrusted[c.addr] = conns
	}
	c.elem = conns.PushBack(c)
	var evict *trackedConn
	if conns.Len() > l.max {
		evict = conns.Front().Value.(*trackedConn)
		for e := conns.Front(); e != nil; e = e.Next() {
			if tc := e.Value.(*trackedConn); tc.busy == 0 {
				evict = tc
				break
			}
		}
		l.removeLocked(evict)
		l.closed++
	}
	var report int
	if l.closed > 0 && time.Since(l.loggedAt) > 10*time.Second {
		report, l.closed, l.loggedAt = l.closed, 0, time.Now()
	}
	l.mu.Unlock()
	if evict != nil {
		evict.Conn.Close()
	}
	if report > 0 && l.log != nil {
		l.log.Warn("closed connections that showed no key: too many open from one address", "closed", report, "address", c.addr, "max", l.max)
	}
}

// serving marks the connection of a request as answering it (busy) or
// done.
func (l *connLimiter) serving(ctx context.Context, busy bool) {
	if tc, ok := ctx.Value(connKey{}).(*trackedConn); ok {
		l.mu.Lock()
		if busy {
			tc.busy++
		} else {
			tc.busy--
		}
		l.mu.Unlock()
	}
}

func (l *connLimiter) remove(c *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.removeLocked(c)
}

func (l *connLimiter) removeLocked(c *trackedConn) {
	if c.elem == nil {
		return
	}
	conns := l.untrusted[c.addr]
	conns.Remove(c.elem)
	c.elem = nil
	if conns.Len() == 0 {
		delete(l.untrusted, c.addr)
	}
}

type connKey struct{}

// connContext puts the connection in its requests' contexts, for trust;
// over TLS, the connection under it.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*trackedConn); ok {
		return context.WithValue(ctx, connKey{}, tc)
	}
	return ctx
}

// trust marks the connection of a request that presented a valid key or
// token: it no longer counts against its address.
func (l *connLimiter) trust(ctx context.Context) {
	if tc, ok := ctx.Value(connKey{}).(*trackedConn); ok {
		l.remove(tc)
	}
}

type limitListener struct {
	net.Listener
	lim *connLimiter
}

func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	addr := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(addr); err == nil {
		addr = h
	}
	tc := &trackedConn{Conn: c, lim: l.lim, addr: addr}
	l.lim.add(tc)
	return tc, nil
}
