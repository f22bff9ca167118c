package engine

import (
	"context"
	"encoding/binary"
	"net"
)

// PortDialer opens TCP connections to ports inside one running sandbox,
// through its agent (the same path as published ports), so it works in
// every network mode, none included. It keeps one agent session open for
// all its connections; Close ends it. It is safe for concurrent use.
type PortDialer struct {
	f      *forwarder
	cancel context.CancelFunc
}

// PortDialer returns a dialer into sandbox ref, which must be running.
// It is bound to ctx: when ctx ends, so do its connections.
func (e *Engine) PortDialer(ctx context.Context, ref string) (*PortDialer, error) {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	return &PortDialer{f: &forwarder{e: e, sb: sb, ctx: ctx}, cancel: cancel}, nil
}

// Dial connects to port inside the sandbox. A port nobody listens on
// gives a connection that the sandbox's side closes at once.
func (d *PortDialer) Dial(port uint16) (net.Conn, error) {
	st, err := d.f.open()
	if err != nil {
		return nil, err
	}
	var hdr [2]byte
	binary.BigEndian.PutUint16(hdr[:], port)
	if _, err := st.Write(hdr[:]); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// Close ends the dialer's agent session and its connections.
func (d *PortDialer) Close() {
	d.f.close()
	d.cancel()
}
