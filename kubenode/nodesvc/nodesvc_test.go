package nodesvc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/kubenode"
)

const name = "0123456789abcdef0123456789abcdef"

// syncBuffer is a log a test reads while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a server with a fresh key on loopback, its host's / a
// temporary directory; its containerd socket does not exist and its
// checkpoint directory does not yet. It returns the checkpoint directory
// as the test sees it.
func start(t *testing.T) (string, *kubenode.Client, *syncBuffer) {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	tmp := t.TempDir()
	logs := &syncBuffer{}
	s := &Server{Key: key, Containerd: filepath.Join(tmp, "no-containerd.sock"), Dir: DefaultDir, Root: tmp,
		Log: slog.New(slog.NewTextHandler(logs, nil))}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go s.Serve(l) //nolint:errcheck // ends with the listener
	return filepath.Join(tmp, DefaultDir), &kubenode.Client{Key: key, Port: l.Addr().(*net.TCPAddr).Port, Timeout: 30 * time.Second}, logs
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// A client with another key is refused in the handshake: it gets
// agentnet.ErrAuth, and the server runs nothing (it does not even create
// its checkpoint directory or reach containerd).
func TestWrongKey(t *testing.T) {
	dir, c, logs := start(t)
	other := *c
	other.Key = make([]byte, 32)
	rand.Read(other.Key)
	_, err := other.Checkpoint(context.Background(), "127.0.0.1", kubenode.CheckpointRequest{Namespace: "default", Pod: "p", PodUID: "u", Name: name})
	if !errors.Is(err, agentnet.ErrAuth) {
		t.Fatalf("wrong key: want agentnet.ErrAuth, got %v", err)
	}
	if err := other.Remove(context.Background(), "127.0.0.1", kubenode.RemoveRequest{Namespace: "default", Name: name}); !errors.Is(err, agentnet.ErrAuth) {
		t.Fatalf("wrong key, remove: want agentnet.ErrAuth, got %v", err)
	}
	if exists(dir) {
		t.Fatalf("a refused client's request made %s", dir)
	}
	if l := logs.String(); !strings.Contains(l, "handshake failed") || strings.Contains(l, "msg=checkpoint") {
		t.Fatalf("server log: want handshake failures and no checkpoint:\n%s", l)
	}
	// The right key reaches the request: containerd is not there.
	_, err = c.Checkpoint(context.Background(), "127.0.0.1", kubenode.CheckpointRequest{Namespace: "default", Pod: "p", PodUID: "u", Name: name})
	if err == nil || errors.Is(err, agentnet.ErrAuth) || !strings.Contains(err.Error(), "containerd") {
		t.Fatalf("right key without containerd: want containerd's error, got %v", err)
	}
	if exists(filepath.Join(dir, "default", name)) {
		t.Fatalf("a failed checkpoint left its directory")
	}
}

// raw sends one request as is, past the client's own checks.
func raw(t *testing.T, c *kubenode.Client, req string) kubenode.Response {
	t.Helper()
	nc, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	conn, err := agentnet.Client(nc, c.Key)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.WriteFrame(agentnet.ChanRequest, []byte(req)); err != nil {
		t.Fatal(err)
	}
	ch, p, err := conn.ReadFrame()
	if err != nil || ch != agentnet.ChanStatus {
		t.Fatalf("answer: channel %d, %v", ch, err)
	}
	var resp kubenode.Response
	if err := json.Unmarshal(p, &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

// The server checks what it is sent itself: bad names are refused
// before anything touches the disk or containerd.
func TestServerRefusesBadRequests(t *testing.T) {
	dir, c, _ := start(t)
	for _, req := range []string{
		`{"op":"checkpoint","checkpoint":{"namespace":"default","pod":"p","podUID":"u","name":"../x"}}`,
		`{"op":"checkpoint","checkpoint":{"namespace":"..","pod":"p","podUID":"u","name":"` + name + `"}}`,
		`{"op":"checkpoint","checkpoint":{"namespace":"default","pod":"p","podUID":"u\"||x","name":"` + name + `"}}`,
		`{"op":"remove","remove":{"namespace":"default","name":"../../etc"}}`,
		`{"op":"remove","remove":{"namespace":"../..","name":"` + name + `"}}`,
		`{"op":"remove"}`,
		`{"op":"format"}`,
		`not json`,
	} {
		resp := raw(t, c, req)
		if resp.Kind != kubenode.KindInvalidArgument || resp.Error == "" {
			t.Errorf("%s: want an invalid argument, got %+v", req, resp)
		}
	}
	if exists(dir) {
		t.Fatalf("refused requests made %s", dir)
	}
}

// Remove deletes a checkpoint; one that is not there is no error; a
// checkpoint of a name that is there is refused before containerd.
func TestRemoveAndAlreadyExists(t *testing.T) {
	dir, c, _ := start(t)
	ctx := context.Background()
	if err := c.Remove(ctx, "127.0.0.1", kubenode.RemoveRequest{Namespace: "default", Name: name}); err != nil {
		t.Fatalf("remove of a missing checkpoint: %v", err)
	}
	ckpt := filepath.Join(dir, "default", name)
	if err := os.MkdirAll(ckpt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ckpt, "checkpoint.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := c.Checkpoint(ctx, "127.0.0.1", kubenode.CheckpointRequest{Namespace: "default", Pod: "p", PodUID: "u", Name: name})
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("checkpoint of an existing name: want already exists, got %v", err)
	}
	if !exists(filepath.Join(ckpt, "checkpoint.img")) {
		t.Fatal("a refused checkpoint touched the existing one")
	}
	if err := c.Remove(ctx, "127.0.0.1", kubenode.RemoveRequest{Namespace: "default", Name: name}); err != nil {
		t.Fatal(err)
	}
	if exists(ckpt) {
		t.Fatalf("%s is still there after remove", ckpt)
	}
}

// A call is bounded by its context even when the server never answers.
func TestClientContext(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(5 * time.Second)
		}
	}()
	c := &kubenode.Client{Key: make([]byte, 32), Port: l.Addr().(*net.TCPAddr).Port}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err = c.Remove(ctx, "127.0.0.1", kubenode.RemoveRequest{Namespace: "default", Name: name})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > 3*time.Second {
		t.Fatalf("silent server: want the context's deadline within 3s, got %v after %s", err, time.Since(t0))
	}
}
