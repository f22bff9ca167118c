package serve

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
)

// Defaults of Config.MaxCreates and Config.CreateQueueTimeout.
const (
	DefaultMaxCreates         = 8
	DefaultCreateQueueTimeout = 10 * time.Second
)

// createGate bounds the creates a server makes at once: a burst queues,
// and a create that has waited its deadline is answered 429 with a
// Retry-After, which E2B's SDKs retry by themselves, instead of every
// create of the burst booting a sandbox at the same time on a host that
// cannot.
type createGate struct {
	slots   chan struct{}
	timeout time.Duration
}

func newCreateGate(max int, timeout time.Duration) *createGate {
	if max <= 0 {
		max = DefaultMaxCreates
	}
	if timeout <= 0 {
		timeout = DefaultCreateQueueTimeout
	}
	return &createGate{slots: make(chan struct{}, max), timeout: timeout}
}

// enter waits for a slot, at most the gate's timeout; the caller calls
// the release it returns when its create is done.
func (g *createGate) enter(ctx context.Context) (func(), error) {
	select {
	case g.slots <- struct{}{}:
		return func() { <-g.slots }, nil
	default:
	}
	t := time.NewTimer(g.timeout)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return func() { <-g.slots }, nil
	case <-t.C:
		return nil, &retryAfterError{after: time.Second,
			err: fmt.Errorf("the server is making %d sandboxes already and this create waited %s for one of them: try again: %w", cap(g.slots), g.timeout, errdefs.ErrResourceExhausted)}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// retryAfterError is an error whose answer carries Retry-After.
type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// retryAfter is the Retry-After header's value (whole seconds) for err,
// or "".
func retryAfter(err error) string {
	var ra *retryAfterError
	if !errors.As(err, &ra) {
		return ""
	}
	return strconv.Itoa(max(1, int((ra.after+time.Second-1)/time.Second)))
}
