package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/emptypb"

	"hutch.dev/hutch/agent/ptywire"
	"hutch.dev/hutch/runsc"
)

// The task API for a container's extra processes (execs): start, kill,
// stdin and terminal size.

// Exec records an exec'd process; Start runs it.
func (s *service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	if st := c.init.getState(); st != stateRunning && st != statePaused {
		return nil, errgrpc.ToGRPC(transitionError("exec in", st))
	}
	var ps specs.Process
	if r.Spec == nil {
		return nil, errgrpc.ToGRPCf(errdefs.ErrInvalidArgument, "exec %s: no process spec", r.ExecID)
	}
	if err := json.Unmarshal(r.Spec.Value, &ps); err != nil {
		return nil, errgrpc.ToGRPCf(errdefs.ErrInvalidArgument, "exec %s: process spec: %v", r.ExecID, err)
	}
	ps.Terminal = r.Terminal
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := c.execs[r.ExecID]; ok {
		return nil, errgrpc.ToGRPCf(errdefs.ErrAlreadyExists, "exec %s", r.ExecID)
	}
	p := newProcess(r.ID, r.ExecID, stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal})
	p.spec = &ps
	c.execs[r.ExecID] = p
	s.send(&eventstypes.TaskExecAdded{ContainerID: r.ID, ExecID: r.ExecID})
	return empty, nil
}

// startExec runs an exec'd process with `runsc exec` and returns once it
// has a PID inside the sandbox, or failed to start.
func (s *service) startExec(ctx context.Context, r *runsc.Runsc, c *container, p *process) (retErr error) {
	if st := p.getState(); st != stateCreated {
		return transitionError("start", st)
	}
	opts := runsc.ExecOpts{IODrain: ioDrain}
	switch {
	case p.stdio.Terminal && s.agentTerminal(c):
		// A pty of the sandbox's own devpts, held by the agent
		// (agentpty.go).
		tty, err := newAgentTTY(ctx, p.stdio)
		if err != nil {
			return err
		}
		ep, err := r.Exec(context.Background(), c.id, agentPtyProcess(*p.spec), tty.agent.execOpts(ioDrain))
		if err != nil {
			tty.Close()
			return err
		}
		p.mu.Lock()
		p.tty, p.exec = tty, ep
		p.mu.Unlock()
	case p.stdio.Terminal:
		// No agent in the container: a host pty, passed in by runsc.
		log.G(ctx).WithField("id", c.id).WithField("exec", p.execID).Info("exec on a host pty: the container has no hutch-init")
		con, replica, err := newPty()
		if err != nil {
			return err
		}
		opts.Terminal = replica
		ep, err := r.Exec(context.Background(), c.id, *p.spec, opts)
		replica.Close()
		if err != nil {
			con.Close()
			return err
		}
		tty, err := copyTTY(ctx, con, p.stdio)
		if err != nil {
			ep.Signal(syscall.SIGKILL) //nolint:errcheck // best effort
			ep.Wait()                  //nolint:errcheck // reaping
			return err
		}
		p.mu.Lock()
		p.tty, p.exec = tty, ep
		p.mu.Unlock()
	default:
		pio, err := newPipeIO(ctx, p.stdio)
		if err != nil {
			return err
		}
		if pio.procIn != nil {
			opts.Stdin = pio.procIn
		}
		if pio.procOut != nil {
			opts.Stdout = pio.procOut
		}
		if pio.procErr != nil {
			opts.Stderr = pio.procErr
		}
		ep, err := r.Exec(context.Background(), c.id, *p.spec, opts)
		if err != nil {
			pio.closeProcessEnds()
			pio.Close()
			return err
		}
		p.mu.Lock()
		p.pio, p.exec = pio, ep
		p.mu.Unlock()
	}
	exited := make(chan struct{})
	var status int
	var waitErr error
	go func() {
		status, waitErr = p.exec.Wait()
		close(exited)
	}()
	// The PID appears once the process runs; a process that cannot
	// start makes runsc exec exit first.
	for {
		if pid, err := p.exec.Pid(); err == nil {
			p.mu.Lock()
			p.pid = pid
			p.transitionLocked(evStart) //nolint:errcheck // an exit recorded first stands
			p.mu.Unlock()
			break
		}
		select {
		case <-exited:
			if errors.Is(waitErr, runsc.ErrNotStarted) || waitErr != nil {
				p.closeIO()
				p.setExited(status)
				p.finish()
				p.markStarted()
				return fmt.Errorf("exec %s: %w", p.execID, waitErr)
			}
			// It ran and exited before its PID was read.
			p.transition(evStart) //nolint:errcheck // an exit recorded first stands
		case <-time.After(5 * time.Millisecond):
			continue
		}
		break
	}
	s.send(&eventstypes.TaskExecStarted{ContainerID: c.id, ExecID: p.execID, Pid: uint32(p.getPid())})
	p.markStarted()
	go func() {
		<-exited
		p.mu.Lock()
		pio := p.pio
		p.mu.Unlock()
		if pio != nil {
			// runsc exec has finished writing: let the copies see EOF.
			pio.closeProcessEnds()
		}
		s.processExited(p, status)
	}()
	return nil
}

// killExec signals an exec'd process. One on the agent's terminal is the
// agent's command: the signal goes to the command's process group, and
// SIGKILL to the agent as well, which takes its command with it.
func (s *service) killExec(ctx context.Context, rs *runsc.Runsc, c *container, p *process, sig syscall.Signal) error {
	p.mu.Lock()
	tty := p.tty
	p.mu.Unlock()
	if tty == nil || tty.agent == nil || sig < 1 || sig > ptywire.MaxSignal {
		return rs.Kill(ctx, c.id, sig, runsc.KillOpts{Pid: p.getPid()})
	}
	if sig == syscall.SIGKILL {
		// Not waited for: the frame waits while the agent is not
		// reading, and the agent's end ends the wait.
		go tty.agent.signal(sig) //nolint:errcheck // the agent's kill below stands
		return rs.Kill(ctx, c.id, sig, runsc.KillOpts{Pid: p.getPid()})
	}
	err := tty.agent.signal(sig)
	if errors.Is(err, io.ErrClosedPipe) {
		return fmt.Errorf("exec %s: %w", p.execID, runsc.ErrProcessGone)
	}
	return err
}

// CloseIO closes a process's stdin.
func (s *service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*emptypb.Empty, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.Stdin {
		p.closeStdin()
	}
	return empty, nil
}

// ResizePty sets a process's terminal size.
func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*emptypb.Empty, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	tty := p.tty
	p.mu.Unlock()
	if tty == nil {
		return nil, errgrpc.ToGRPCf(errdefs.ErrFailedPrecondition, "process %s has no terminal", p.idOrCID())
	}
	if err := tty.Resize(r.Width, r.Height); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return empty, nil
}
