package runsc

import (
	"context"
	"errors"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/urpc"
)

// ctlIdleTimeout is how long a Control keeps a connection that no call
// uses. An open connection holds the sentry's shutdown: its control
// server waits for its connections to end, up to runsc's
// --control-rpc-stop-timeout (15 s). This bounds that wait.
const ctlIdleTimeout = 100 * time.Millisecond

// Control makes calls on one sandbox's control socket. While calls come
// closer together than ctlIdleTimeout it keeps one connection for the
// next, which then skips the connect and the sentry's accept (about 0.2
// ms of a forwarded connection's 3). Calls at the same time each take a
// connection of their own.
type Control struct {
	path string

	mu    sync.Mutex // guards idle and timer
	idle  *urpc.Client
	timer *time.Timer
}

// NewControl returns a Control for the control socket at path.
func NewControl(path string) *Control {
	return &Control{path: path}
}

// Path is the control socket's path.
func (c *Control) Path() string {
	return c.path
}

// call makes one call, giving up when ctx ends (ctx's error).
func (c *Control) call(ctx context.Context, method string, arg, result any) error {
	cl := c.take()
	if cl == nil {
		s, err := ctlConnect(c.path)
		if err != nil {
			return err
		}
		cl = urpc.NewClient(s)
	}
	err := clientCall(ctx, cl, method, arg, result)
	if ctx.Err() != nil {
		cl.Close()
		return err
	}
	// An answer, even a refusal, leaves the connection fit for the next
	// call; anything else (the sentry gone, a connection it closed) does
	// not. A call on a connection the sentry closed while it was idle
	// fails: that sentry is stopping, and the call is not tried again,
	// as it may have been made.
	var re urpc.RemoteError
	if err == nil || errors.As(err, &re) {
		c.put(cl)
	} else {
		cl.Close()
	}
	return err
}

// take returns the idle connection, if there is one, leaving none idle.
func (c *Control) take() *urpc.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.idle
	c.idle = nil
	return cl
}

// put keeps cl for the next call, for ctlIdleTimeout, unless another
// connection is kept already.
func (c *Control) put(cl *urpc.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle != nil {
		cl.Close()
		return
	}
	c.idle = cl
	if c.timer == nil {
		c.timer = time.AfterFunc(ctlIdleTimeout, c.expire)
	} else {
		c.timer.Reset(ctlIdleTimeout)
	}
}

// expire closes the idle connection, if it is still idle.
func (c *Control) expire() {
	if cl := c.take(); cl != nil {
		cl.Close()
	}
}

// Close closes the idle connection. Calls after it work, on connections
// of their own.
func (c *Control) Close() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	c.expire()
}
