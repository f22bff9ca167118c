package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
)

// AgentExec runs req through the network endpoint of the agent of a pod
// (see package agentnet) at addr, proving key: the same command and
// streams as Exec, without the API server. The pod, namespace and
// container of req only name it in errors.
func AgentExec(ctx context.Context, addr string, key []byte, req ExecRequest) (int, error) {
	c, err := agentConn(ctx, addr, key)
	if err != nil {
		return -1, fmt.Errorf("pod %s/%s: %w", req.Namespace, req.Pod, err)
	}
	code, err := agentnet.Exec(ctx, c, req.Args, req.Stdin, req.Stdout, req.Stderr)
	switch {
	case errors.Is(err, agentnet.ErrExecFailed):
		return -1, fmt.Errorf("pod %s/%s: %w: %w", req.Namespace, req.Pod, err, ErrExecFailed)
	case err != nil && ctx.Err() == nil:
		return -1, fmt.Errorf("pod %s/%s: %w: %w", req.Namespace, req.Pod, err, errdefs.ErrUnavailable)
	}
	return code, err
}

// AgentDial connects to port on the loopback of the pod whose agent's
// endpoint is addr, proving key; nothing listening there is an error.
func AgentDial(ctx context.Context, addr string, key []byte, port int) (net.Conn, error) {
	c, err := agentConn(ctx, addr, key)
	if err != nil {
		return nil, err
	}
	pc, err := agentnet.Dial(c, port)
	if err != nil {
		// The agent answered: nothing listens on the port.
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	return pc, nil
}

// agentConn is an authenticated connection to the agent at addr.
func agentConn(ctx context.Context, addr string, key []byte) (*agentnet.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	// A pod that has just started may not listen yet.
	for wait := time.Now().Add(3 * time.Second); errors.Is(err, syscall.ECONNREFUSED) && time.Now().Before(wait); {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("agent endpoint %s: %w: %w", addr, err, errdefs.ErrUnavailable)
	}
	c, err := agentnet.Client(nc, key)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("agent endpoint %s: %w: %w", addr, err, errdefs.ErrUnavailable)
	}
	return c, nil
}
