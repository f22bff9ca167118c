package engine

import (
	"context"

	"hutch.dev/hutch/engine/forward"
)

// PortDialer opens TCP connections to ports on the 127.0.0.1 of one
// running sandbox (forward.Dialer).
type PortDialer = forward.Dialer

// PortDialer returns a dialer into sandbox ref, which must be running.
// It is bound to ctx: when ctx ends, so do its connections.
func (e *Engine) PortDialer(ctx context.Context, ref string) (*PortDialer, error) {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	return forward.NewDialer(ctx, forwardee{e, sb}), nil
}
