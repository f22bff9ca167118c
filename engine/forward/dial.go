package forward

import (
	"context"
	"encoding/binary"
	"net"
)

// Dialer opens TCP connections to ports on the 127.0.0.1 of one running
// sandbox, by the same path as published ports: through the sandbox's
// kernel, or with a runsc that cannot, its agent. It works in every
// network mode, none included. With the agent it keeps one session open
// for all its connections; Close ends it. It is safe for concurrent use.
type Dialer struct {
	f      *forwarder
	cancel context.CancelFunc
}

// NewDialer returns a dialer into sb, bound to ctx: when ctx ends, so do
// its connections.
func NewDialer(ctx context.Context, sb Sandbox) *Dialer {
	ctx, cancel := context.WithCancel(ctx)
	return &Dialer{f: &forwarder{sb: sb, ctx: ctx}, cancel: cancel}
}

// Dial connects to port inside the sandbox, through the sandbox's kernel
// (an error if nobody listens on it) or, with a runsc that cannot, through
// its agent (a connection that the sandbox's side closes at once if
// nobody listens).
func (d *Dialer) Dial(port uint16) (net.Conn, error) {
	if c, ok, err := d.f.kernelConn(port, nil); ok {
		if err != nil {
			return nil, err
		}
		return c, nil
	}
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
func (d *Dialer) Close() {
	d.f.close()
	d.cancel()
}
