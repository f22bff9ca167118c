// Package kubenode is the wire protocol and client of hutch's node service:
// the program that hutch's DaemonSet runs on every Kubernetes node
// (`hutch-node serve`, package kubenode/nodesvc) so that `hutch serve
// --backend kubernetes` can pause a sandbox. It checkpoints a pod's gVisor
// sandbox through the node's containerd into a directory on that node,
// from which the shim restores a new pod, and removes such a checkpoint
// once it is no longer wanted.
//
// The service listens on Port of the node's address (a pod's
// status.hostIP). A connection is authenticated and sealed as the
// sandbox agent's endpoint is (package agentnet: mutual HMAC handshake,
// AES-GCM frames) under one 32-byte key that the node service and serve
// share. The client sends one Request frame (agentnet.ChanRequest, JSON);
// the service answers one Response frame (agentnet.ChanStatus, JSON) and
// closes the connection.
//
// This package runs nothing and touches no disk: it imports only the
// standard library, errdefs and agentnet, so that serve can import it.
package kubenode

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
)

// Port is the node service's TCP port on every node.
const Port = 49984

// DefaultTimeout bounds one call of a Client whose Timeout is zero: a
// checkpoint of a sandbox with a few GiB resident takes tens of seconds.
const DefaultTimeout = 10 * time.Minute

// Operations of a Request.
const (
	OpCheckpoint = "checkpoint"
	OpRemove     = "remove"
)

// Request is the client's one frame.
type Request struct {
	// Op is OpCheckpoint or OpRemove; the field of that name is set.
	Op         string             `json:"op"`
	Checkpoint *CheckpointRequest `json:"checkpoint,omitempty"`
	Remove     *RemoveRequest     `json:"remove,omitempty"`
}

// Response is the service's one frame.
type Response struct {
	// Error, if set, says why the request failed; Kind says which kind
	// of failure it is (one of the Kind constants).
	Error string `json:"error,omitempty"`
	Kind  string `json:"kind,omitempty"`
	// Checkpoint is a checkpoint's result.
	Checkpoint *CheckpointResult `json:"checkpoint,omitempty"`
}

// Kinds of a failed request, each an errdefs sentinel on the client.
const (
	KindInvalidArgument    = "invalid-argument"
	KindNotFound           = "not-found"
	KindAlreadyExists      = "already-exists"
	KindFailedPrecondition = "failed-precondition"
	KindUnknown            = "unknown"
)

// ErrorKind is the Kind of err for a Response.
func ErrorKind(err error) string {
	switch {
	case errdefs.IsInvalidArgument(err):
		return KindInvalidArgument
	case errdefs.IsNotFound(err):
		return KindNotFound
	case errdefs.IsAlreadyExists(err):
		return KindAlreadyExists
	case errdefs.IsFailedPrecondition(err):
		return KindFailedPrecondition
	}
	return KindUnknown
}

// kindError is a failure the service reported: its message, and the
// errdefs sentinel of its kind.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return "node service: " + e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// responseError turns a Response's error back into an error of its kind.
func responseError(r *Response) error {
	var kind error = errdefs.ErrUnknown
	switch r.Kind {
	case KindInvalidArgument:
		kind = errdefs.ErrInvalidArgument
	case KindNotFound:
		kind = errdefs.ErrNotFound
	case KindAlreadyExists:
		kind = errdefs.ErrAlreadyExists
	case KindFailedPrecondition:
		kind = errdefs.ErrFailedPrecondition
	}
	return &kindError{msg: r.Error, kind: kind}
}

// CheckpointRequest asks for a checkpoint of a pod's sandbox. The
// sandbox stops once it is saved, unless LeaveRunning.
type CheckpointRequest struct {
	// Namespace, Pod and PodUID name the pod (its metadata).
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	PodUID    string `json:"podUID"`
	// Name is the checkpoint's name: 32 lowercase hex digits. The
	// checkpoint is the directory <checkpoint dir>/<Namespace>/<Name> on
	// the node.
	Name string `json:"name"`
	// LeaveRunning keeps the sandbox running after the checkpoint (a
	// snapshot); otherwise it stops (a pause).
	LeaveRunning bool `json:"leaveRunning,omitempty"`
}

// CheckpointResult is a checkpoint's size and how long it took.
type CheckpointResult struct {
	// Bytes is the size of the checkpoint's files.
	Bytes int64 `json:"bytes"`
	// Duration is the time the node took.
	Duration time.Duration `json:"duration"`
}

// RemoveRequest asks to delete a checkpoint.
type RemoveRequest struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// ValidName checks a checkpoint's name: 32 lowercase hex digits.
func ValidName(name string) error {
	if len(name) != 32 {
		return fmt.Errorf("checkpoint name %q: want 32 lowercase hex digits: %w", name, errdefs.ErrInvalidArgument)
	}
	for _, c := range name {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return fmt.Errorf("checkpoint name %q: want 32 lowercase hex digits: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// validLabel checks a DNS-1123 label of at most max characters:
// lowercase letters, digits and '-', alphanumeric at both ends.
func validLabel(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := '0' <= c && c <= '9' || 'a' <= c && c <= 'z'
		if !alnum && (c != '-' || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

// ValidNamespace checks a Kubernetes namespace (a directory's name on
// the node): a DNS-1123 label.
func ValidNamespace(s string) error {
	if !validLabel(s, 63) {
		return fmt.Errorf("namespace %q: want a DNS-1123 label (lowercase letters, digits and '-', at most 63): %w", s, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validPod checks a pod's name: a DNS-1123 subdomain (dot-separated
// labels, at most 253 characters).
func validPod(s string) error {
	ok := s != "" && len(s) <= 253
	for _, l := range strings.Split(s, ".") {
		ok = ok && validLabel(l, 63)
	}
	if !ok {
		return fmt.Errorf("pod %q: want a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253): %w", s, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validUID checks a pod's UID: letters, digits and '-', at most 128 (a
// Kubernetes UID is a UUID).
func validUID(s string) error {
	if s == "" || len(s) > 128 {
		return fmt.Errorf("pod UID %q: want letters, digits and '-': %w", s, errdefs.ErrInvalidArgument)
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-') {
			return fmt.Errorf("pod UID %q: want letters, digits and '-': %w", s, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Validate checks every field; an error wraps errdefs.ErrInvalidArgument.
func (r *CheckpointRequest) Validate() error {
	if err := ValidNamespace(r.Namespace); err != nil {
		return err
	}
	if err := validPod(r.Pod); err != nil {
		return err
	}
	if err := validUID(r.PodUID); err != nil {
		return err
	}
	return ValidName(r.Name)
}

// Validate checks every field; an error wraps errdefs.ErrInvalidArgument.
func (r *RemoveRequest) Validate() error {
	if err := ValidNamespace(r.Namespace); err != nil {
		return err
	}
	return ValidName(r.Name)
}

// Client calls the node service of a node.
type Client struct {
	// Key is the 32-byte key the node services hold.
	Key []byte
	// Port is the service's port; 0: Port.
	Port int
	// Timeout bounds each call besides its context; 0: DefaultTimeout.
	Timeout time.Duration
	// Dial connects to the service; nil: TCP.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Checkpoint checkpoints the pod's sandbox on the node at hostIP into
// the node's directory for r.Name, and stops the sandbox. An error wraps
// errdefs.ErrInvalidArgument for a bad request, ErrNotFound when no
// sandbox of the pod runs there, ErrAlreadyExists when a checkpoint of
// that name is there, agentnet.ErrAuth when the node holds another key.
func (c *Client) Checkpoint(ctx context.Context, hostIP string, r CheckpointRequest) (*CheckpointResult, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	resp, err := c.call(ctx, hostIP, &Request{Op: OpCheckpoint, Checkpoint: &r})
	if err != nil {
		return nil, fmt.Errorf("checkpoint of pod %s/%s on %s: %w", r.Namespace, r.Pod, hostIP, err)
	}
	if resp.Checkpoint == nil {
		return nil, fmt.Errorf("checkpoint of pod %s/%s on %s: the node sent no result", r.Namespace, r.Pod, hostIP)
	}
	return resp.Checkpoint, nil
}

// Remove deletes the checkpoint r names on the node at hostIP; one that
// is not there is not an error.
func (c *Client) Remove(ctx context.Context, hostIP string, r RemoveRequest) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if _, err := c.call(ctx, hostIP, &Request{Op: OpRemove, Remove: &r}); err != nil {
		return fmt.Errorf("remove checkpoint %s/%s on %s: %w", r.Namespace, r.Name, hostIP, err)
	}
	return nil
}

// call sends req and reads the answer, bounded by ctx and the timeout.
func (c *Client) call(ctx context.Context, hostIP string, req *Request) (*Response, error) {
	if ip := net.ParseIP(hostIP); ip == nil {
		return nil, fmt.Errorf("node address %q is not an IP address: %w", hostIP, errdefs.ErrInvalidArgument)
	}
	if len(c.Key) != agentnet.KeySize {
		return nil, fmt.Errorf("node key of %d bytes, want %d: %w", len(c.Key), agentnet.KeySize, errdefs.ErrInvalidArgument)
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	port := c.Port
	if port == 0 {
		port = Port
	}
	dial := c.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	raw, err := dial(ctx, "tcp", net.JoinHostPort(hostIP, strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		raw.SetDeadline(d) //nolint:errcheck // ctx closes the connection as well
	}
	conn, err := agentnet.Client(raw, c.Key)
	if err != nil {
		return nil, c.ctxErr(ctx, err)
	}
	if d, ok := ctx.Deadline(); ok {
		raw.SetDeadline(d) //nolint:errcheck // as above (the handshake cleared it)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if err := conn.WriteFrame(agentnet.ChanRequest, b); err != nil {
		return nil, c.ctxErr(ctx, err)
	}
	ch, p, err := conn.ReadFrame()
	if err != nil {
		return nil, c.ctxErr(ctx, fmt.Errorf("no answer: %w", err))
	}
	var resp Response
	if ch != agentnet.ChanStatus {
		return nil, fmt.Errorf("unexpected channel %d", ch)
	}
	if err := json.Unmarshal(p, &resp); err != nil {
		return nil, fmt.Errorf("malformed answer: %w", err)
	}
	if resp.Error != "" {
		return nil, responseError(&resp)
	}
	return &resp, nil
}

// ctxErr prefers ctx's error to the one the connection it closed gave
// (which may look like a refused key).
func (c *Client) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// ReadKeyFile reads the node services' key from file: 64 hex digits,
// around them white space. hutch-node serve and hutch serve --node-key read it.
func ReadKeyFile(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err == nil && len(key) != agentnet.KeySize {
		err = errors.New("wrong length")
	}
	if err != nil {
		return nil, fmt.Errorf("key file %s: want %d hex digits (%v)", file, 2*agentnet.KeySize, err)
	}
	return key, nil
}
