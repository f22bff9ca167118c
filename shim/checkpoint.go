package shim

import (
	"context"
	"fmt"
	"path/filepath"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/emptypb"

	runsc "sbx.dev/sbx/runsc-sandbox"
)

// RootfsUpperFile is the file in a checkpoint that holds the sandbox's
// root filesystem changes (gVisor's overlay upper layer) as a tar. runsc
// restores them from its own state; the tar makes them visible in the
// checkpoint image.
const RootfsUpperFile = "rootfs-upper.tar"

// Checkpoint saves the sandbox's memory and filesystem into r.Path, which
// containerd stores as the checkpoint image's content. With the runc
// checkpoint option Exit the sandbox stops afterwards; otherwise it keeps
// running.
func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	if !c.root {
		return nil, errgrpc.ToGRPCf(errdefs.ErrNotImplemented, "checkpoint of %s: only a sandbox's own container can be checkpointed, not one that joined it", r.ID)
	}
	exit := false
	if r.Options != nil && len(r.Options.Value) > 0 {
		v, err := typeurl.UnmarshalAny(r.Options)
		if err != nil {
			return nil, errgrpc.ToGRPC(err)
		}
		if o, ok := v.(*options.CheckpointOptions); ok {
			exit = o.Exit
		}
	}
	rs := s.runsc()
	paused := c.init.getState() == statePaused
	if paused {
		// containerd pauses a task before checkpointing it; runsc
		// checkpoints a running sandbox (and stops it itself).
		if err := rs.Resume(ctx, c.id); err != nil {
			return nil, errgrpc.ToGRPC(err)
		}
	}
	if err := s.checkpoint(ctx, rs, c, r.Path, exit); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if paused && !exit {
		if err := rs.Pause(ctx, c.id); err != nil {
			return nil, errgrpc.ToGRPC(err)
		}
	}
	s.send(&eventstypes.TaskCheckpointed{ContainerID: c.id, Checkpoint: r.Path})
	return empty, nil
}

func (s *service) checkpoint(ctx context.Context, rs *runsc.Runsc, c *container, dir string, exit bool) error {
	if err := rs.TarRootfsUpper(ctx, c.id, filepath.Join(dir, RootfsUpperFile)); err != nil {
		return fmt.Errorf("export rootfs changes: %w", err)
	}
	return rs.Checkpoint(ctx, c.id, dir, runsc.CheckpointOpts{LeaveRunning: !exit})
}

// restore starts the sandbox container from the checkpoint containerd
// unpacked for this task.
func (s *service) restore(ctx context.Context, rs *runsc.Runsc, c *container, p *process) error {
	if !c.root {
		return fmt.Errorf("restore of %s: only a sandbox's own container can be restored: %w", c.id, errdefs.ErrNotImplemented)
	}
	if p.stdio.Terminal {
		return fmt.Errorf("restore of %s: a task with a terminal cannot be restored: %w", c.id, errdefs.ErrNotImplemented)
	}
	pio, err := newPipeIO(ctx, p.stdio)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.pio = pio
	p.mu.Unlock()
	err = rs.Restore(ctx, c.id, c.bundle, c.checkpoint, runsc.RestoreOpts{
		Detach: true, PidFile: filepath.Join(c.bundle, "init.pid"),
		Stdin: pio.procIn, Stdout: pio.procOut, Stderr: pio.procErr,
	})
	pio.closeProcessEnds()
	if err != nil {
		rs.Delete(context.Background(), c.id, true) //nolint:errcheck // best effort
		return err
	}
	hp, err := rs.HostPids(c.id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.pod != nil {
		s.pod.sandboxPid = hp.Sandbox
		s.pod.oomCgroup = processCgroup(hp.Sandbox)
		s.pod.oomBase = oomKills(s.pod.oomCgroup)
	}
	s.mu.Unlock()
	p.mu.Lock()
	p.pid = hp.Sandbox
	p.mu.Unlock()
	go s.reapSandbox(c, hp)
	return nil
}
