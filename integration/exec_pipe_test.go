package integration

import (
	"bufio"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// `hutch exec` into a pipe whose reader goes away ends as a program does
// whose stdout breaks (by SIGPIPE), instead of waiting for ever on a
// process that keeps writing: as `hutch exec ID -- yes | head -1`.
func TestExecBrokenStdoutPipe(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	c := e.cmd(nil, "exec", id, "--", "yes")
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "y\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	out.Close()
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGPIPE {
			t.Fatalf("hutch exec into a broken pipe ended with %v, want SIGPIPE", err)
		}
	case <-time.After(30 * time.Second):
		c.Process.Kill()
		t.Fatal("hutch exec went on after its stdout's reader had gone")
	}
}
