package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
)

// Stdin reaches an exec whole, through ctr and through CRI (kubectl cp
// and kubectl exec -i stream it this way): the client's last bytes are
// still in the fifo when it closes stdin, and they must not be cut.
func TestContainerdExecStdinWhole(t *testing.T) {
	c := newContainerd(t)
	c.importBusybox("default")
	c.ctrOK("default", "run", "-d", "--runtime", hutchRuntime, "busybox:latest", "long", "sh", "-c", "while true; do sleep 1; done")
	c.setupCRI()
	cfg := c.podConfig("stdin", nil, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", cfg)
	ctr := c.runContainer(pod, cfg, "sink", "sh", "-c", "while true; do sleep 1; done")

	data := make([]byte, 4<<20)
	rand.Read(data) //nolint:errcheck // never fails
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	for i := 0; i < 8; i++ {
		r := c.exec("ctr", []string{"-a", c.sock, "task", "exec", "--exec-id", fmt.Sprintf("in%d", i), "long", "sha256sum"}, bytes.NewReader(data))
		if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
			t.Fatalf("ctr exec, try %d: want %s, got %s", i, want, r)
		}
		ep := "unix://" + c.sock
		r = c.exec("crictl", []string{"--config", os.DevNull, "-r", ep, "-i", ep, "-t", "60s", "exec", "-i", ctr, "sha256sum"}, bytes.NewReader(data))
		if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
			t.Fatalf("crictl exec -i, try %d: want %s, got %s", i, want, r)
		}
	}
	c.crictlOK("rmp", "-f", pod)
	c.ctr("default", "task", "delete", "-f", "long")
	c.ctrOK("default", "container", "delete", "long")
}
