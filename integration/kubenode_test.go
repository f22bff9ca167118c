package integration

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/kubenode"
	"hutch.dev/hutch/kubenode/nodesvc"
)

// The node service checkpoints a CRI pod's sandbox through containerd
// into its directory on the node, for the client that holds its key
// only: runsc's image lands there (not in containerd's content store)
// and the pod stops; a name that is taken, an unknown pod and a name
// that is a path are refused; remove deletes the checkpoint.
func TestNodeServiceCheckpoint(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()

	// The kubelet labels a pod's sandbox with the pod's metadata; crictl
	// passes the labels it is given.
	const uid = "6f1c2a4e-8d3b-4f7a-9c1e-2b5d7e9f0a13"
	podCfg := c.writeJSON("pod-ckpt.json", fmt.Sprintf(`{"metadata":{"name":"ckpt","namespace":"team-a","uid":%q},
"labels":{"io.kubernetes.pod.name":"ckpt","io.kubernetes.pod.namespace":"team-a","io.kubernetes.pod.uid":%q},
"linux":{"security_context":{"namespace_options":{"network":2}}},"log_directory":%q,"annotations":{"dev.hutch.network":"none"}}`,
		uid, uid, filepath.Join(c.dir, "logs", "ckpt")))
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	ctr := c.runContainer(pod, podCfg, "counter", "sh", "-c",
		"echo counting; i=0; while true; do i=$((i+1)); sleep 0.1; done")
	waitFor(t, func() bool { return strings.Contains(c.crictl("logs", ctr).stdout, "counting") })

	var insp struct {
		Status struct {
			Metadata struct{ Name, UID, Namespace string }
		}
	}
	if err := json.Unmarshal([]byte(c.crictlOK("inspectp", pod)), &insp); err != nil {
		t.Fatal(err)
	}
	md := insp.Status.Metadata
	if md.UID != uid || md.Name != "ckpt" || md.Namespace != "team-a" {
		t.Fatalf("inspectp: metadata %+v", md)
	}

	key := make([]byte, agentnet.KeySize)
	rand.Read(key)
	dir := filepath.Join(t.TempDir(), "checkpoints")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go (&nodesvc.Server{Key: key, Containerd: c.sock, Namespace: "k8s.io", Dir: dir}).Serve(l) //nolint:errcheck // ends with the listener
	port := l.Addr().(*net.TCPAddr).Port
	client := &kubenode.Client{Key: key, Port: port}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	name := "5f0e8d6c4b2a19087f6e5d4c3b2a1908"
	req := kubenode.CheckpointRequest{Namespace: md.Namespace, Pod: md.Name, PodUID: md.UID, Name: name}

	// Another key: refused, nothing written, the pod runs on.
	wrong := make([]byte, agentnet.KeySize)
	rand.Read(wrong)
	if _, err := (&kubenode.Client{Key: wrong, Port: port}).Checkpoint(ctx, "127.0.0.1", req); !errors.Is(err, agentnet.ErrAuth) {
		t.Fatalf("checkpoint with another key: want agentnet.ErrAuth, got %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused client's checkpoint touched %s (%v)", dir, err)
	}
	if st := containerState(c, ctr); st != "CONTAINER_RUNNING" {
		t.Fatalf("after a refused checkpoint the container is %s", st)
	}

	imagesBefore := c.ctrOK("k8s.io", "image", "ls", "-q")
	res, err := client.Checkpoint(ctx, "127.0.0.1", req)
	if err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, containerdLog(c))
	}
	img := filepath.Join(dir, "team-a", name, "checkpoint.img")
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatalf("checkpoint: no runsc image: %v", err)
	}
	if res.Bytes < fi.Size() || res.Duration <= 0 {
		t.Fatalf("checkpoint result %+v; checkpoint.img alone is %d bytes", res, fi.Size())
	}
	if after := c.ctrOK("k8s.io", "image", "ls", "-q"); after != imagesBefore {
		t.Fatalf("the checkpoint went into containerd's image store: before\n%s\nafter\n%s", imagesBefore, after)
	}
	waitFor(t, func() bool { return containerState(c, ctr) != "CONTAINER_RUNNING" })

	// Once more under the same name: it is taken.
	if _, err := client.Checkpoint(ctx, "127.0.0.1", req); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second checkpoint named %s: want already exists, got %v", name, err)
	}
	// A pod that is not on this node.
	other := req
	other.PodUID, other.Name = "00000000-0000-4000-8000-000000000000", "00000000000000000000000000000001"
	if _, err := client.Checkpoint(ctx, "127.0.0.1", other); !errdefs.IsNotFound(err) {
		t.Fatalf("checkpoint of an unknown pod: want not found, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "team-a", other.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused checkpoint left its directory (%v)", err)
	}
	// A name that is a path.
	bad := req
	bad.Name = "../x"
	if _, err := client.Checkpoint(ctx, "127.0.0.1", bad); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("checkpoint named ../x: want invalid argument, got %v", err)
	}
	if err := client.Remove(ctx, "127.0.0.1", kubenode.RemoveRequest{Namespace: "team-a", Name: "../x"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("remove ../x: want invalid argument, got %v", err)
	}

	if err := client.Remove(ctx, "127.0.0.1", kubenode.RemoveRequest{Namespace: "team-a", Name: name}); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "team-a", name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("remove left the checkpoint (%v)", err)
	}
	if err := client.Remove(ctx, "127.0.0.1", kubenode.RemoveRequest{Namespace: "team-a", Name: name}); err != nil {
		t.Fatalf("remove of a removed checkpoint: %v", err)
	}

	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, ctr)
}

// containerState is a CRI container's state (CONTAINER_RUNNING, ...).
func containerState(c *ctrd, id string) string {
	c.t.Helper()
	var v struct{ Status struct{ State string } }
	if err := json.Unmarshal([]byte(c.crictlOK("inspect", id)), &v); err != nil {
		c.t.Fatal(err)
	}
	return v.Status.State
}

func containerdLog(c *ctrd) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "containerd.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
