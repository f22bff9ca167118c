package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/net/websocket"
)

// The channels of the v5.channel.k8s.io exec protocol: each binary
// message starts with its channel's byte.
const (
	chanStdin  = 0
	chanStdout = 1
	chanStderr = 2
	chanStatus = 3
	chanClose  = 255
)

// execProtocol is the WebSocket subprotocol of exec: v5 adds the close
// channel, which ends a command's input.
const execProtocol = "v5.channel.k8s.io"

// ExecRequest is a command to run in a container of a pod.
type ExecRequest struct {
	Namespace, Pod, Container string
	Args                      []string
	// Stdin, if set, is the command's input; its end closes it.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output (nil: discarded).
	Stdout, Stderr io.Writer
}

// ErrExecFailed wraps an exec the container runtime could not start
// (the executable does not exist, for one): the command never ran.
var ErrExecFailed = errors.New("exec failed")

// Exec runs req and returns the command's exit status once it has ended
// and its output is written. Cancelling ctx cuts the stream (the command
// may go on in the container).
func (c *Client) Exec(ctx context.Context, req ExecRequest) (int, error) {
	u := *c.server
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + podsPath(req.Namespace) + "/" + url.PathEscape(req.Pod) + "/exec"
	q := url.Values{"command": req.Args, "stdout": {"true"}, "stderr": {"true"}}
	if req.Container != "" {
		q.Set("container", req.Container)
	}
	if req.Stdin != nil {
		q.Set("stdin", "true")
	}
	u.RawQuery = q.Encode()
	cfg, err := websocket.NewConfig(u.String(), c.server.String())
	if err != nil {
		return -1, err
	}
	cfg.Protocol = []string{execProtocol}
	// WebSocket is HTTP/1.1: the API transport's config offers h2.
	cfg.TlsConfig = c.tls.Clone()
	cfg.TlsConfig.NextProtos = []string{"http/1.1"}
	cfg.Header = http.Header{}
	if c.token != "" {
		cfg.Header.Set("Authorization", "Bearer "+c.token)
	}
	ws, err := cfg.DialContext(ctx)
	if err != nil {
		return -1, fmt.Errorf("kubernetes: exec in pod %s/%s: %w: %w", req.Namespace, req.Pod, err, errdefs.ErrUnavailable)
	}
	ws.PayloadType = websocket.BinaryFrame
	stop := context.AfterFunc(ctx, func() { ws.Close() })
	defer stop()
	defer ws.Close()

	// wmu guards writing on ws: input and its close.
	var wmu sync.Mutex
	send := func(ch byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return websocket.Message.Send(ws, append([]byte{ch}, p...))
	}
	if req.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := req.Stdin.Read(buf)
				if n > 0 {
					if send(chanStdin, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					send(chanClose, []byte{chanStdin}) //nolint:errcheck // the stream is gone
					return
				}
			}
		}()
	}
	var st *status
	for {
		var msg []byte
		if err := websocket.Message.Receive(ws, &msg); err != nil {
			if ctx.Err() != nil {
				return -1, ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				break
			}
			return -1, fmt.Errorf("kubernetes: exec in pod %s/%s: %w: %w", req.Namespace, req.Pod, err, errdefs.ErrUnavailable)
		}
		if len(msg) == 0 {
			continue
		}
		var w io.Writer
		switch msg[0] {
		case chanStdout:
			w = req.Stdout
		case chanStderr:
			w = req.Stderr
		case chanStatus:
			st = &status{}
			if err := json.Unmarshal(msg[1:], st); err != nil {
				return -1, fmt.Errorf("kubernetes: exec in pod %s/%s: malformed status %q", req.Namespace, req.Pod, msg[1:])
			}
		}
		if w != nil && len(msg) > 1 {
			if _, err := w.Write(msg[1:]); err != nil {
				return -1, err
			}
		}
	}
	return execStatus(req, st)
}

// execStatus is the exit status the status message reports.
func execStatus(req ExecRequest, st *status) (int, error) {
	if st == nil {
		return -1, fmt.Errorf("kubernetes: exec in pod %s/%s: the stream ended without a status: %w", req.Namespace, req.Pod, errdefs.ErrUnavailable)
	}
	if st.Status == "Success" {
		return 0, nil
	}
	if st.Reason == "NonZeroExitCode" && st.Details != nil {
		for _, c := range st.Details.Causes {
			if c.Reason == "ExitCode" {
				if code, err := strconv.Atoi(c.Message); err == nil {
					return code, nil
				}
			}
		}
	}
	return -1, fmt.Errorf("kubernetes: exec %q in pod %s/%s: %s: %w", req.Args[0], req.Namespace, req.Pod, st.Message, ErrExecFailed)
}
