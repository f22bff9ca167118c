package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"
)

// errPeeked ends the handshake once the ClientHello is read.
var errPeeked = errors.New("client hello read")

// peekConn lets crypto/tls read a ClientHello from the sandbox's
// connection, keeping every byte it reads, and writes nothing back.
type peekConn struct {
	net.Conn
	read bytes.Buffer
}

func (c *peekConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Write(p[:n])
	return n, err
}

func (c *peekConn) Write(p []byte) (int, error) { return len(p), nil }

// clientHello reads the TLS ClientHello c starts with, parsed by
// crypto/tls, and returns its server name and the bytes read, which the
// upstream is to receive first. It fails on what is not a ClientHello.
func clientHello(c net.Conn) (string, []byte, error) {
	pc := &peekConn{Conn: c}
	var name string
	var seen bool
	c.SetReadDeadline(time.Now().Add(peekTimeout)) //nolint:errcheck // TCP supports deadlines
	err := tls.Server(pc, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name, seen = h.ServerName, true
		return nil, errPeeked
	}}).Handshake()
	c.SetReadDeadline(time.Time{}) //nolint:errcheck // as above
	if !seen {
		return "", nil, err
	}
	return name, pc.read.Bytes(), nil
}

// serveTLS passes a TLS connection through to the host its ClientHello
// names, if the policy allows it, without terminating it.
func (g *Gateway) serveTLS(ctx context.Context, c net.Conn, e *Entry) {
	name, hello, err := clientHello(c)
	if err != nil {
		e.Decision, e.Reason = Deny, "not a TLS ClientHello: "+err.Error()
		return
	}
	p, ok := g.decide(name, 443, e)
	if !ok {
		return
	}
	if rules := injectFor(g.cfg.Inject, name); len(rules) > 0 {
		g.terminate(ctx, c, hello, name, p, rules, e)
		return
	}
	up, err := dial(ctx, p, name, g.upstreamPort(443))
	if err != nil {
		e.Error = err.Error()
		return
	}
	defer up.Close()
	e.Upstream = up.RemoteAddr().String()
	if _, err := up.Write(hello); err != nil {
		e.Error = err.Error()
		return
	}
	e.BytesOut += int64(len(hello))
	splice(c, up, io.Reader(c), e)
}
