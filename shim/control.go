package shim

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"syscall"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/emptypb"

	"hutch.dev/hutch/runsc"
)

// The task calls on running containers and processes: signals, waits,
// state, pause and resume, resources, and the shim's own end.

// Kill signals the init (all of the container's processes with All) or
// one exec'd process.
func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st := p.getState()
	if st == stateStopped || st == stateDeleted {
		return nil, errgrpc.ToGRPCf(errdefs.ErrNotFound, "process %s already finished", p.idOrCID())
	}
	rs := s.runsc()
	sig := syscall.Signal(r.Signal)
	if r.ExecID == "" && st == stateCreated {
		// Killing a task that never started: its exit follows no start.
		p.markStarted()
		if !c.root {
			// A container that joins the sandbox has no process before
			// its start (runsc runs its init at start): killed, it has
			// exited, as runc's waiting init does. CRI waits for that
			// exit after a failed start.
			p.mu.Lock()
			if p.pio != nil {
				p.pio.closeProcessEnds()
			}
			p.mu.Unlock()
			go s.processExited(p, exitLost)
			return empty, nil
		}
	}
	if r.ExecID != "" {
		if st == stateCreated {
			return nil, errgrpc.ToGRPC(transitionError("kill", st))
		}
		err = s.killExec(ctx, rs, c, p, sig)
	} else {
		err = rs.Kill(ctx, c.id, sig, runsc.KillOpts{All: r.All})
	}
	if err != nil {
		// A kill that races the exit finds no process: NotFound, as
		// containerd's runc shim answers, which CRI's stop takes as done.
		if errors.Is(err, runsc.ErrProcessGone) || p.getState() == stateStopped {
			return nil, errgrpc.ToGRPCf(errdefs.ErrNotFound, "process %s already finished", p.idOrCID())
		}
		return nil, errgrpc.ToGRPC(err)
	}
	return empty, nil
}

// Wait waits for a process to exit.
func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, errgrpc.ToGRPC(ctx.Err())
	}
	code, at := p.exited()
	return &taskAPI.WaitResponse{ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// State reports a process's state as the shim tracks it.
func (s *service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	code, at := p.exited()
	return &taskAPI.StateResponse{
		ID: p.idOrCID(), Bundle: c.bundle, Pid: uint32(p.getPid()), Status: p.getState().proto(),
		Stdin: p.stdio.Stdin, Stdout: p.stdio.Stdout, Stderr: p.stdio.Stderr, Terminal: p.stdio.Terminal,
		ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at), ExecID: r.ExecID,
	}, nil
}

// Pids lists the container's processes by their PIDs inside the sandbox.
func (s *service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	ps, err := s.runsc().Ps(ctx, c.id)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	s.mu.Lock()
	byPid := map[int]string{}
	for id, e := range c.execs {
		byPid[e.getPid()] = id
	}
	s.mu.Unlock()
	var out []*task.ProcessInfo
	for _, p := range ps {
		pi := &task.ProcessInfo{Pid: uint32(p.PID)}
		if id, ok := byPid[p.PID]; ok {
			a, err := typeurl.MarshalAnyToProto(&options.ProcessDetails{ExecID: id})
			if err != nil {
				return nil, err
			}
			pi.Info = a
		}
		out = append(out, pi)
	}
	return &taskAPI.PidsResponse{Processes: out}, nil
}

// Pause freezes the container's processes.
func (s *service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	if st := c.init.getState(); st != stateRunning {
		return nil, errgrpc.ToGRPC(transitionError("pause", st))
	}
	if err := s.runsc().Pause(ctx, c.id); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if err := c.init.transition(evPause); err != nil {
		// It exited while runsc paused it.
		return nil, errgrpc.ToGRPC(err)
	}
	s.send(&eventstypes.TaskPaused{ContainerID: c.id})
	return empty, nil
}

// Resume thaws a paused container.
func (s *service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	if st := c.init.getState(); st != statePaused {
		return nil, errgrpc.ToGRPC(transitionError("resume", st))
	}
	if err := s.runsc().Resume(ctx, c.id); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if err := c.init.transition(evResume); err != nil {
		// It exited while runsc resumed it.
		return nil, errgrpc.ToGRPC(err)
	}
	s.send(&eventstypes.TaskResumed{ContainerID: c.id})
	return empty, nil
}

// Update applies new resource limits (a JSON LinuxResources) to the
// pod's sandbox within the operator's ceiling (see service.update).
func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	if r.Resources == nil {
		return nil, errgrpc.ToGRPCf(errdefs.ErrInvalidArgument, "update %s: no resources", r.ID)
	}
	var res specs.LinuxResources
	if err := json.Unmarshal(r.Resources.Value, &res); err != nil {
		return nil, errgrpc.ToGRPCf(errdefs.ErrInvalidArgument, "update %s: resources: %v", r.ID, err)
	}
	if err := s.update(c, &res); err != nil {
		log.G(ctx).WithError(err).WithField("id", r.ID).Error("update")
		return nil, errgrpc.ToGRPC(err)
	}
	return empty, nil
}

// Connect reports the shim's and the task's PIDs.
func (s *service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	var pid int
	if c, err := s.getContainer(r.ID); err == nil {
		pid = c.init.getPid()
	}
	return &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: uint32(pid)}, nil
}

// Shutdown stops the shim once it runs no container.
func (s *service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*emptypb.Empty, error) {
	s.mu.Lock()
	n := len(s.containers)
	s.mu.Unlock()
	if n > 0 {
		return empty, nil
	}
	s.sd.Shutdown()
	return empty, nil
}
