// Package egress is the egress gateway on the host side of a sandbox's
// link. The sandbox's firewall redirects its web connections (TCP to the
// ports policy.WebPorts names) to the gateway's listeners; the gateway
// reads the name each connection asks for (the TLS ClientHello's server
// name, without terminating TLS, or the HTTP Host), judges it by the
// sandbox's allow rules (policy.DecideWeb), and dials the named host
// itself through the resolvers the sandbox's own resolver forwards to.
// The address the sandbox connected to decides nothing: a forged address,
// an /etc/hosts entry inside, or an address shared by several sites opens
// only the site the rules allow. Every connection is written to the
// sandbox's egress log (log.go).
//
// It changes nothing on the host but its own sockets and log; the
// firewall that sends it connections is assembly/hostnet's.
package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"hutch.dev/hutch/policy"
)

// Policy is what the gateway judges by: the sandbox's network mode, its
// allow rules, and the resolvers (ip:port) it looks names up with.
type Policy struct {
	Mode      string
	Allow     []policy.AllowRule
	Upstreams []string
}

// Config is one sandbox's gateway.
type Config struct {
	// HTTP and TLS are the listening addresses of plain HTTP (port 80)
	// and TLS (port 443) connections.
	HTTP, TLS string
	// Policy returns the policy in force, read anew for each connection
	// so that an update applies to the next one; nil refuses all.
	Policy func() *Policy
	// Log is the egress log's path.
	Log string
	// Inject are the sandbox's inject rules, CA the file of the gateway
	// CA that signs what it presents for their hosts (NewCA), and
	// Secret returns a secret's value from the host's store.
	Inject []policy.InjectRule
	CA     string
	Secret func(name string) (string, error)
}

// Timeouts: how long a sandbox may take to say which host it wants, and
// the gateway to reach it.
const (
	peekTimeout = 10 * time.Second
	dialTimeout = 10 * time.Second
)

// maxConns bounds the connections the gateway serves at once for one
// sandbox: the gateway runs outside the sandbox, so it bounds what the
// sandbox can make it hold. More wait in the listener's backlog.
const maxConns = 256

// Gateway is a listening gateway; Serve runs it.
type Gateway struct {
	cfg       Config
	http, tls net.Listener
	log       *Log
	ca        *CA
	slots     chan struct{}
	// upstreamPorts, if set, is the port dialed for each web port (tests
	// stand an upstream on a port of their own for 80).
	upstreamPorts map[uint16]uint16
}

// upstreamPort is the port dialed for a connection to port.
func (g *Gateway) upstreamPort(port uint16) uint16 {
	if p, ok := g.upstreamPorts[port]; ok {
		return p
	}
	return port
}

// Listen opens the gateway's listeners and log.
func Listen(cfg Config) (*Gateway, error) {
	g := &Gateway{cfg: cfg, slots: make(chan struct{}, maxConns)}
	var err error
	if len(cfg.Inject) > 0 {
		if g.ca, err = LoadCA(cfg.CA); err != nil {
			return nil, err
		}
		if cfg.Secret == nil {
			return nil, errors.New("egress gateway: inject rules without a secret store")
		}
	}
	if g.log, err = OpenLog(cfg.Log); err != nil {
		return nil, err
	}
	if g.http, err = net.Listen("tcp4", cfg.HTTP); err != nil {
		g.log.Close()
		return nil, fmt.Errorf("egress gateway: %w", err)
	}
	if g.tls, err = net.Listen("tcp4", cfg.TLS); err != nil {
		g.http.Close()
		g.log.Close()
		return nil, fmt.Errorf("egress gateway: %w", err)
	}
	return g, nil
}

// Serve accepts connections until ctx ends or a listener fails.
func (g *Gateway) Serve(ctx context.Context) error {
	defer g.log.Close()
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	for l, port := range map[net.Listener]uint16{g.http: 80, g.tls: 443} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- g.accept(ctx, l, port)
		}()
	}
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	g.http.Close()
	g.tls.Close()
	wg.Wait()
	return err
}

func (g *Gateway) accept(ctx context.Context, l net.Listener, port uint16) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		g.slots <- struct{}{}
		go func() {
			defer func() { <-g.slots }()
			defer c.Close()
			e := Entry{Time: time.Now().UTC(), Port: port}
			if port == 443 {
				g.serveTLS(ctx, c, &e)
			} else {
				g.serveHTTP(ctx, c, &e)
			}
			e.DurationMs = time.Since(e.Time).Milliseconds()
			g.log.Write(e)
		}()
	}
}

// decide judges name on port by the policy in force, filling e.
func (g *Gateway) decide(name string, port uint16, e *Entry) (*Policy, bool) {
	e.Host = name
	p := g.cfg.Policy()
	if p == nil {
		e.Decision, e.Reason = Deny, "the sandbox's policy is unreadable"
		return nil, false
	}
	if p.Mode != policy.NetAllow {
		e.Decision, e.Reason = Deny, "the sandbox's network mode is "+p.Mode
		return nil, false
	}
	d := policy.DecideWeb(p.Allow, name, port)
	e.Rule, e.Reason = d.Rule, d.Reason
	if !d.Allowed {
		e.Decision = Deny
		return nil, false
	}
	e.Decision = Allow
	return p, true
}

// dial connects to the allowed host name on port: a name through the
// policy's resolvers, never to an address in policy.DeniedRanges or of
// the host's own that no address rule names on port (an allowed name
// answering the metadata address opens nothing); an address literal
// (which an address rule allowed) as it is.
func dial(ctx context.Context, p *Policy, name string, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	d := net.Dialer{}
	if a, err := netip.ParseAddr(name); err == nil {
		return d.DialContext(ctx, "tcp4", net.JoinHostPort(a.String(), strconv.Itoa(int(port))))
	}
	addrs, err := lookup(ctx, p.Upstreams, name)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", name, err)
	}
	var errs []error
	for _, a := range addrs {
		if (policy.Denied(a) || hostAddr(a)) && !policy.AllowsAddrPort(p.Allow, a, port) {
			errs = append(errs, fmt.Errorf("%s answers %s, a denied address", name, a))
			continue
		}
		c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort(a.String(), strconv.Itoa(int(port))))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%s has no IPv4 address", name)
	}
	return nil, errors.Join(errs...)
}

// hostAddr reports whether a is an address of the host's own: the
// gateway dials from the host, where such an address reaches the host's
// services, which the sandbox's firewall keeps from it.
func hostAddr(a netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if h, ok := netip.AddrFromSlice(n.IP); ok && h.Unmap() == a.Unmap() {
				return true
			}
		}
	}
	return false
}

// lookup resolves name's IPv4 addresses through upstreams, in turn.
func lookup(ctx context.Context, upstreams []string, name string) ([]netip.Addr, error) {
	if len(upstreams) == 0 {
		return nil, errors.New("no resolver to ask")
	}
	var errs []error
	for _, u := range upstreams {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, u)
		}}
		addrs, err := r.LookupNetIP(ctx, "ip4", name)
		if err == nil {
			return addrs, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// splice copies both ways between the sandbox's connection and the
// upstream's until both are done, counting bytes into e.
func splice(client, up net.Conn, fromClient io.Reader, e *Entry) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n, _ := io.Copy(up, fromClient)
		e.BytesOut += n
		closeWrite(up)
	}()
	n, _ := io.Copy(client, up)
	e.BytesIn += n
	closeWrite(client)
	// The upstream is done: a sandbox that keeps its end open holds
	// nothing more.
	client.SetReadDeadline(time.Now()) //nolint:errcheck // closes below anyway
	wg.Wait()
}

func closeWrite(c net.Conn) {
	if t, ok := c.(interface{ CloseWrite() error }); ok {
		t.CloseWrite() //nolint:errcheck // the peer may be gone
		return
	}
	c.Close()
}
