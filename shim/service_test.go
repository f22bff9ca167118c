package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/protobuf/types/known/anypb"

	"hutch.dev/hutch/runsc"
)

// failingRunsc is a runsc that fails every command with msg on stderr and
// exit status 1, as runsc does.
func failingRunsc(t *testing.T, msg string) *runsc.Runsc {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nprintf '%s\\n' '" + msg + "' >&2\nexit 1\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &runsc.Runsc{Path: path, Root: t.TempDir()}
}

// testService is a service with one running container c1 in a pod whose
// runsc is r; its events are discarded.
func testService(t *testing.T, r *runsc.Runsc) (*service, *container) {
	t.Helper()
	s := &service{ctx: context.Background(), events: make(chan any, 1024), containers: map[string]*container{}}
	go func() {
		for range s.events {
		}
	}()
	c := &container{id: "c1", root: true, execs: map[string]*process{}, init: newProcess("c1", "", stdio{})}
	c.init.state, c.init.pid = stateRunning, 1
	s.containers["c1"] = c
	s.pod = &pod{id: "c1", r: r}
	return s, c
}

// A kill that races the container's exit (runsc finds no process before
// the shim has seen the exit) answers NotFound, as containerd's runc shim
// does; CRI's StopContainer and StopPodSandbox take that as done. Any other
// failure of runsc kill stays an error that is not NotFound.
func TestKillRacingExitIsNotFound(t *testing.T) {
	for _, tc := range []struct {
		stderr   string
		execID   string
		notFound bool
	}{
		{`signaling process in container "c1" PID 0: no such process`, "", true},
		{`sandbox is not running`, "", true},
		{`failed to signal pid 5: no such process with PID 5`, "e1", true},
		{`loading container: permission denied`, "", false},
	} {
		s, c := testService(t, failingRunsc(t, tc.stderr))
		if tc.execID != "" {
			e := newProcess("c1", tc.execID, stdio{})
			e.state, e.pid = stateRunning, 5
			c.execs[tc.execID] = e
		}
		_, err := s.Kill(context.Background(), &taskAPI.KillRequest{ID: "c1", ExecID: tc.execID, Signal: uint32(syscall.SIGKILL)})
		if err == nil {
			t.Fatalf("%q: kill succeeded", tc.stderr)
		}
		native := errgrpc.ToNative(err)
		if got := errdefs.IsNotFound(native); got != tc.notFound {
			t.Errorf("%q: NotFound = %v, want %v (err %v)", tc.stderr, got, tc.notFound, err)
		}
		if errdefs.IsUnknown(native) && tc.notFound {
			t.Errorf("%q: answered Unknown", tc.stderr)
		}
	}
}

// Deleting a container while execs are added and removed touches the
// exec map only under the service's lock (run with -race).
func TestDeleteContainerWithConcurrentExecs(t *testing.T) {
	s, c := testService(t, nil)
	s.pod = nil // nothing of runsc to delete
	c.root = false
	spec, err := anypb.New(&anypb.Any{})
	if err != nil {
		t.Fatal(err)
	}
	spec.Value = []byte(`{"args":["true"],"cwd":"/"}`)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("e%d", i)
			if _, err := s.Exec(context.Background(), &taskAPI.ExecProcessRequest{ID: "c1", ExecID: id, Spec: spec}); err == nil {
				s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "c1", ExecID: id}) //nolint:errcheck // may be gone
			}
		}
	}()
	for deadline := time.Now().Add(300 * time.Millisecond); ; {
		if err := s.deleteContainer(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			break
		}
		// Back as it was, for the next round.
		c.init.mu.Lock()
		c.init.state = stateRunning
		c.init.mu.Unlock()
		s.mu.Lock()
		s.containers["c1"] = c
		s.mu.Unlock()
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	if st := c.init.getState(); st != stateDeleted {
		t.Fatalf("init is %s after delete, want deleted", st)
	}
}

// When the sandbox goes while an exec's own waiter is still draining the
// exec's output (it recorded the exit first), the exec's exit is still
// published before the sandbox container's.
func TestSandboxExitAfterExecsExit(t *testing.T) {
	s := &service{ctx: context.Background(), events: make(chan any, 16), containers: map[string]*container{}}
	c := &container{id: "c1", root: true, execs: map[string]*process{}, init: newProcess("c1", "", stdio{})}
	c.init.state, c.init.pid = stateRunning, 1
	c.init.markStarted()
	e := newProcess("c1", "x2", stdio{})
	e.state, e.pid = stateRunning, 5
	e.markStarted()
	c.execs["x2"] = e
	s.containers["c1"] = c

	// The exec's waiter: it records the exit, then drains for a while.
	if !e.setExited(137) {
		t.Fatal("the exec's exit was not recorded")
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		s.send(&eventstypes.TaskExit{ContainerID: "c1", ID: "x2", ExitStatus: 137})
		e.finish()
	}()
	s.sandboxExited(c, 137)

	var ids []string
	for len(ids) < 2 {
		select {
		case ev := <-s.events:
			if x, ok := ev.(*eventstypes.TaskExit); ok {
				ids = append(ids, x.ID)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("exits published: %v", ids)
		}
	}
	if ids[0] != "x2" || ids[1] != "c1" {
		t.Fatalf("exits in order %v, want [x2 c1]", ids)
	}
}
