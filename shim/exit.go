package shim

import (
	"syscall"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/pkg/protobuf"

	"hutch.dev/hutch/runsc"
)

// How the ends of a pod's processes are reaped and published.

// reapSandbox waits for the sandbox process, a child of this shim (a
// subreaper) since `runsc create` exited: its exit status is the status of
// the sandbox container's init, and its end is the end of every process
// of the pod.
func (s *service) reapSandbox(c *container, hp runsc.HostPids) {
	if hp.Gofer > 0 {
		go reap(hp.Gofer)
	}
	status := reap(hp.Sandbox)
	s.mu.Lock()
	if s.pod != nil {
		close(s.pod.gone)
	}
	s.mu.Unlock()
	s.sandboxExited(c, status)
}

// reap waits for a child process and returns a shell's view of its exit.
func reap(pid int) int {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return exitLost
		}
		break
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// sandboxExited handles the end of the sandbox: every other process of
// the pod is gone with it and exits first, then the OOM event if the
// sandbox's cgroup saw an OOM kill, then the sandbox container's exit.
func (s *service) sandboxExited(root *container, status int) {
	<-root.init.started
	s.mu.Lock()
	if s.containers[root.id] != root {
		s.mu.Unlock()
		return
	}
	var others []*process
	for _, c := range s.containers {
		for _, e := range c.execs {
			others = append(others, e)
		}
	}
	for _, c := range s.containers {
		if c != root {
			others = append(others, c.init)
		}
	}
	pd := s.pod
	s.mu.Unlock()
	// An OOM kill of the sandbox's cgroup is every container's OOM:
	// they share one gVisor kernel and its memory.
	oom := pd != nil && oomKills(pd.oomCgroup) > pd.oomBase
	for _, p := range others {
		if p.getState() == stateCreated {
			continue
		}
		if oom && p.execID == "" {
			s.send(&eventstypes.TaskOOM{ContainerID: p.cid})
		}
		s.processExited(p, exitLost)
	}
	// An exit that its own waiter recorded first is published by that
	// waiter once the output is drained: wait for it (up to a drain's
	// time), so that it still comes before the sandbox's.
	waitPublished(others, ioDrain+time.Second)
	if oom {
		s.send(&eventstypes.TaskOOM{ContainerID: root.id})
	}
	s.processExited(root.init, status)
}

// processExited records p's exit and publishes it once its output is
// drained.
func (s *service) processExited(p *process, status int) {
	<-p.started
	if !p.setExited(status) {
		return
	}
	p.drainIO(ioDrain)
	code, at := p.exited()
	s.send(&eventstypes.TaskExit{
		ContainerID: p.cid, ID: p.idOrCID(), Pid: uint32(p.getPid()),
		ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at),
	})
	p.finish()
}

func (p *process) idOrCID() string {
	if p.execID != "" {
		return p.execID
	}
	return p.cid
}
