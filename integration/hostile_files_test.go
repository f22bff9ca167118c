package integration

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A FIFO planted at /etc/passwd and snapshotted must not make root hutch
// block when it looks users up in an image made from the snapshot; no
// special file of the sandbox reaches the snapshot's layer.
func TestHostileFifoPasswdSnapshot(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	e.ok("exec", id, "--", "sh", "-c", "rm /etc/passwd && mkfifo /etc/passwd /tmp/fifo && mkfifo -m 0666 /etc/group.new && ln /tmp/fifo /tmp/fifolink")
	e.ok("snapshot", "-t", "fifo", id)
	e.ok("rm", "-f", id)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := e.cmd(nil, "run", "--rm", "--image", "fifo", "--", "sh", "-c", "ls -l /etc/passwd /etc/group.new /tmp/fifo /tmp/fifolink 2>&1; true")
	cmd := exec.CommandContext(ctx, c.Path, c.Args[1:]...)
	cmd.Env = c.Env
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("hutch run on an image with a FIFO at /etc/passwd hung: %s", out)
	}
	if err != nil {
		t.Fatalf("hutch run: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "p") {
			t.Errorf("a FIFO survived the snapshot: %s", line)
		}
	}
}
