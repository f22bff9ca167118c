// Package nodesvc is hutch's node service (`hutch-node serve`), the server
// side of package kubenode: on a Kubernetes node it checkpoints a pod's
// gVisor sandbox through the node's containerd (the hutch shim's task
// Checkpoint) into a directory on the node, and removes such directories.
//
// Only a client that holds the node key gets past the handshake; nothing
// a request carries names a path or a filter before it is validated. The
// service never runs runsc itself: containerd's shim does.
package nodesvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/api/types/task"
	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/kubenode"
)

// Defaults of a Server's fields.
const (
	DefaultContainerd = "/run/containerd/containerd.sock"
	DefaultNamespace  = "k8s.io"
	DefaultDir        = "/var/lib/hutch/checkpoints"
)

// RequestTimeout bounds the work of one request.
const RequestTimeout = 15 * time.Minute

// Labels CRI and the kubelet put on a pod's sandbox container.
const (
	labelKind      = "io.cri-containerd.kind"
	labelUID       = "io.kubernetes.pod.uid"
	labelNamespace = "io.kubernetes.pod.namespace"
	labelPod       = "io.kubernetes.pod.name"
)

// Server is the node service. Its fields are set before Serve.
type Server struct {
	// Key is the 32-byte key clients must hold.
	Key []byte
	// Containerd is containerd's socket; "": DefaultContainerd.
	Containerd string
	// Namespace is containerd's namespace of the kubelet's pods; "":
	// DefaultNamespace.
	Namespace string
	// Dir holds checkpoints as Dir/<namespace>/<name>; "": DefaultDir.
	// It is an absolute path on the host, as containerd's shim sees it.
	Dir string
	// Root is the host's / as this service sees it (a container's mount
	// of it); "": /. The service works on Root/Dir.
	Root string
	// Log gets a line per request; nil: slog.Default().
	Log *slog.Logger

	// mu guards busy.
	mu sync.Mutex
	// busy holds the pod UIDs and checkpoint paths a request works on.
	busy map[string]bool
}

func (s *Server) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

func (s *Server) dir() string {
	if s.Dir != "" {
		return s.Dir
	}
	return DefaultDir
}

// Serve answers connections on l until it fails (closing l ends it).
func (s *Server) Serve(l net.Listener) error {
	if len(s.Key) != agentnet.KeySize {
		return fmt.Errorf("node service: key of %d bytes, want %d: %w", len(s.Key), agentnet.KeySize, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(s.dir()) || s.Root != "" && !filepath.IsAbs(s.Root) {
		return fmt.Errorf("node service: checkpoint directory %q or root %q is not absolute: %w", s.dir(), s.Root, errdefs.ErrInvalidArgument)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go s.handle(c)
	}
}

// handle authenticates c, reads one request, runs it and answers.
func (s *Server) handle(c net.Conn) {
	defer c.Close()
	conn, err := agentnet.Server(c, s.Key)
	if err != nil {
		s.log().Warn("node service: handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	c.SetReadDeadline(time.Now().Add(agentnet.HandshakeTimeout)) //nolint:errcheck // the request still comes or not
	ch, p, err := conn.ReadFrame()
	if err != nil || ch != agentnet.ChanRequest {
		s.log().Warn("node service: no request", "remote", c.RemoteAddr().String(), "err", err, "channel", ch)
		return
	}
	c.SetReadDeadline(time.Time{}) //nolint:errcheck // as above
	var req kubenode.Request
	var resp kubenode.Response
	if err := json.Unmarshal(p, &req); err != nil {
		err = fmt.Errorf("malformed request: %v: %w", err, errdefs.ErrInvalidArgument)
		resp.Error, resp.Kind = err.Error(), kubenode.KindInvalidArgument
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), RequestTimeout)
		resp = s.do(ctx, &req)
		cancel()
	}
	b, err := json.Marshal(&resp)
	if err != nil {
		return
	}
	c.SetWriteDeadline(time.Now().Add(agentnet.HandshakeTimeout)) //nolint:errcheck // the answer still goes or not
	conn.WriteFrame(agentnet.ChanStatus, b)                       //nolint:errcheck // the client is gone: its loss
}

// do runs one request and logs it.
func (s *Server) do(ctx context.Context, req *kubenode.Request) kubenode.Response {
	var resp kubenode.Response
	var err error
	switch {
	case req.Op == kubenode.OpCheckpoint && req.Checkpoint != nil:
		r := req.Checkpoint
		var res *kubenode.CheckpointResult
		res, err = s.Checkpoint(ctx, r)
		if err == nil {
			resp.Checkpoint = res
			s.log().Info("checkpoint", "namespace", r.Namespace, "pod", r.Pod, "uid", r.PodUID, "name", r.Name, "bytes", res.Bytes, "duration", res.Duration)
		} else {
			s.log().Warn("checkpoint failed", "namespace", r.Namespace, "pod", r.Pod, "uid", r.PodUID, "name", r.Name, "err", err)
		}
	case req.Op == kubenode.OpRemove && req.Remove != nil:
		r := req.Remove
		err = s.Remove(r)
		if err == nil {
			s.log().Info("checkpoint removed", "namespace", r.Namespace, "name", r.Name)
		} else {
			s.log().Warn("remove failed", "namespace", r.Namespace, "name", r.Name, "err", err)
		}
	default:
		err = fmt.Errorf("unknown request %q: %w", req.Op, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		resp.Error, resp.Kind = err.Error(), kubenode.ErrorKind(err)
	}
	return resp
}

// claim marks keys busy, or says that one already is.
func (s *Server) claim(keys ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if s.busy[k] {
			return fmt.Errorf("another request works on %s: %w", k, errdefs.ErrFailedPrecondition)
		}
	}
	if s.busy == nil {
		s.busy = map[string]bool{}
	}
	for _, k := range keys {
		s.busy[k] = true
	}
	return nil
}

func (s *Server) release(keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.busy, k)
	}
}

// Checkpoint checkpoints the sandbox of the pod r names into
// Dir/<namespace>/<name> and stops it; on failure it leaves no directory.
func (s *Server) Checkpoint(ctx context.Context, r *kubenode.CheckpointRequest) (*kubenode.CheckpointResult, error) {
	start := time.Now()
	if err := r.Validate(); err != nil {
		return nil, err
	}
	top := s.local(s.dir())
	nsDir := filepath.Join(top, r.Namespace)
	path := filepath.Join(nsDir, r.Name)
	// The same directory as the shim sees it.
	hostPath := filepath.Join(s.dir(), r.Namespace, r.Name)
	if err := s.claim("pod "+r.PodUID, path); err != nil {
		return nil, err
	}
	defer s.release("pod "+r.PodUID, path)
	// A checkpoint of that name first: a retry after a lost answer finds
	// it (its pod has stopped by then).
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("checkpoint %s/%s: %w", r.Namespace, r.Name, errdefs.ErrAlreadyExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if _, err := os.Stat(s.containerd()); err != nil {
		return nil, fmt.Errorf("containerd: %w", err)
	}
	cl, err := ctrd.New(s.containerd(), ctrd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("containerd %s: %w", s.containerd(), err)
	}
	defer cl.Close()
	ctx = namespaces.WithNamespace(ctx, s.namespace())
	id, err := s.sandbox(ctx, cl, r)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{top, nsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("checkpoint %s/%s: %w", r.Namespace, r.Name, errdefs.ErrAlreadyExists)
		}
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(path) //nolint:errcheck // best effort: the error says what failed
		}
	}()
	opts, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{Exit: !r.LeaveRunning, ImagePath: hostPath})
	if err != nil {
		return nil, err
	}
	// The tasks service itself, not the client's Task.Checkpoint: with
	// ImagePath it hands the path to the shim and stores nothing in the
	// content store, while the client would pause the task first and,
	// for a runtime other than runc, write the sandbox's writable layer
	// and an image into the content store.
	if _, err := cl.TaskService().Checkpoint(ctx, &tasks.CheckpointTaskRequest{ContainerID: id, Options: opts}); err != nil {
		return nil, fmt.Errorf("checkpoint of pod %s/%s (sandbox %s): %w", r.Namespace, r.Pod, id, errgrpc.ToNative(err))
	}
	size, err := dirSize(path)
	if err != nil {
		return nil, err
	}
	ok = true
	return &kubenode.CheckpointResult{Bytes: size, Duration: time.Since(start)}, nil
}

// local is the host's path p as this service sees it.
func (s *Server) local(p string) string {
	if s.Root == "" {
		return p
	}
	return filepath.Join(s.Root, p)
}

func (s *Server) containerd() string {
	if s.Containerd != "" {
		return s.Containerd
	}
	return DefaultContainerd
}

func (s *Server) namespace() string {
	if s.Namespace != "" {
		return s.Namespace
	}
	return DefaultNamespace
}

// sandbox finds the running sandbox container of the pod r names.
func (s *Server) sandbox(ctx context.Context, cl *ctrd.Client, r *kubenode.CheckpointRequest) (string, error) {
	// The filter names only a constant; the pod's labels are compared here.
	list, err := cl.ContainerService().List(ctx, fmt.Sprintf("labels.%q==sandbox", labelKind))
	if err != nil {
		return "", fmt.Errorf("list containers: %w", err)
	}
	for _, c := range list {
		if c.Labels[labelUID] != r.PodUID || c.Labels[labelNamespace] != r.Namespace || c.Labels[labelPod] != r.Pod {
			continue
		}
		t, err := cl.TaskService().Get(ctx, &tasks.GetRequest{ContainerID: c.ID})
		if err != nil {
			if errdefs.IsNotFound(errgrpc.ToNative(err)) {
				continue
			}
			return "", fmt.Errorf("task of sandbox %s: %w", c.ID, errgrpc.ToNative(err))
		}
		if t.Process != nil && t.Process.Status == task.Status_RUNNING {
			return c.ID, nil
		}
	}
	return "", fmt.Errorf("no running sandbox of pod %s/%s (uid %s) on this node: %w", r.Namespace, r.Pod, r.PodUID, errdefs.ErrNotFound)
}

// dirSize is the size of the regular files below dir.
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// Remove deletes Dir/<namespace>/<name>; one that is not there is not an
// error.
func (s *Server) Remove(r *kubenode.RemoveRequest) error {
	if err := r.Validate(); err != nil {
		return err
	}
	path := filepath.Join(s.local(s.dir()), r.Namespace, r.Name)
	if err := s.claim(path); err != nil {
		return err
	}
	defer s.release(path)
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove checkpoint %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}
