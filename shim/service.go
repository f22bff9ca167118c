package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/protobuf"
	cshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/emptypb"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/runsc"
)

var empty = &emptypb.Empty{}

// exitLost is the status of a process that went down with its sandbox
// without a status of its own: killed.
const exitLost = 128 + int(syscall.SIGKILL)

// ioDrain bounds how long an exited process's output may take to reach
// containerd.
const ioDrain = 2 * time.Second

// container is one task: the pod's sandbox container or one that joins it.
type container struct {
	id     string
	bundle string
	spec   *specs.Spec
	root   bool   // boots the sandbox
	rootfs string // mounted by the shim; "" if containerd passed none
	// checkpoint, when set, is restored at start instead of started.
	checkpoint string
	init       *process
	execs      map[string]*process // guarded by service.mu
}

// service is the containerd task API (v3) over runsc, for one pod.
type service struct {
	ctx       context.Context
	publisher cshim.Publisher
	sd        shutdown.Service
	events    chan any // published in order by forward

	mu         sync.Mutex // guards containers and pod
	containers map[string]*container
	pod        *pod
}

var _ taskAPI.TTRPCTaskService = (*service)(nil)

// NewTaskService returns the task service, publishing through publisher.
func NewTaskService(ctx context.Context, publisher cshim.Publisher, sd shutdown.Service) (taskAPI.TTRPCTaskService, error) {
	s := &service{
		ctx: ctx, publisher: publisher, sd: sd,
		events:     make(chan any, 128),
		containers: make(map[string]*container),
	}
	go s.forward(ctx)
	// Events queued before shutdown (the last TaskDelete) must reach
	// containerd before the shim exits.
	sd.RegisterCallback(func(context.Context) error {
		flushed := make(chan struct{})
		s.events <- flushed
		select {
		case <-flushed:
		case <-time.After(5 * time.Second):
		}
		return nil
	})
	if address, err := cshim.ReadAddress("address"); err == nil {
		sd.RegisterCallback(func(context.Context) error { return cshim.RemoveSocket(address) })
	}
	return s, nil
}

// RegisterTTRPC serves the task API.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, s)
	return nil
}

func (s *service) send(ev any) { s.events <- ev }

// forward publishes events in the order they were queued.
func (s *service) forward(ctx context.Context) {
	ns, _ := namespaces.Namespace(ctx)
	ctx = namespaces.WithNamespace(context.WithoutCancel(ctx), ns)
	for ev := range s.events {
		if flushed, ok := ev.(chan struct{}); ok {
			close(flushed)
			continue
		}
		if err := s.publisher.Publish(ctx, topic(ev), ev); err != nil {
			log.G(ctx).WithError(err).Error("publish event")
		}
	}
	s.publisher.Close()
}

func topic(ev any) string {
	switch ev.(type) {
	case *eventstypes.TaskCreate:
		return runtime.TaskCreateEventTopic
	case *eventstypes.TaskStart:
		return runtime.TaskStartEventTopic
	case *eventstypes.TaskOOM:
		return runtime.TaskOOMEventTopic
	case *eventstypes.TaskExit:
		return runtime.TaskExitEventTopic
	case *eventstypes.TaskDelete:
		return runtime.TaskDeleteEventTopic
	case *eventstypes.TaskExecAdded:
		return runtime.TaskExecAddedEventTopic
	case *eventstypes.TaskExecStarted:
		return runtime.TaskExecStartedEventTopic
	case *eventstypes.TaskPaused:
		return runtime.TaskPausedEventTopic
	case *eventstypes.TaskResumed:
		return runtime.TaskResumedEventTopic
	case *eventstypes.TaskCheckpointed:
		return runtime.TaskCheckpointedEventTopic
	}
	return runtime.TaskUnknownTopic
}

func (s *service) getContainer(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.containers[id]
	if c == nil {
		return nil, errgrpc.ToGRPCf(errdefs.ErrNotFound, "container %s not created", id)
	}
	return c, nil
}

func (s *service) getProcess(id, execID string) (*container, *process, error) {
	c, err := s.getContainer(id)
	if err != nil {
		return nil, nil, err
	}
	if execID == "" {
		return c, c.init, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := c.execs[execID]
	if p == nil {
		return nil, nil, errgrpc.ToGRPCf(errdefs.ErrNotFound, "exec %s of %s not found", execID, id)
	}
	return c, p, nil
}

func (s *service) runscLocked() *runsc.Runsc {
	if s.pod == nil {
		return nil
	}
	return s.pod.r
}

func (s *service) runsc() *runsc.Runsc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runscLocked()
}

// Create creates a container: the pod's sandbox (which boots gVisor), or a
// container that joins the sandbox this shim runs.
func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, retErr error) {
	resp, err := s.create(ctx, r)
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", r.ID).Error("create")
		return nil, errgrpc.ToGRPC(err)
	}
	return resp, nil
}

func (s *service) create(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, retErr error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	spec, err := runsc.ReadBundle(r.Bundle)
	if err != nil {
		return nil, err
	}
	root := spec.Annotations[criContainerType] != criTypeContainer
	sandboxID := r.ID
	if !root {
		sandboxID = spec.Annotations[criSandboxID]
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.containers[r.ID]; ok {
		return nil, fmt.Errorf("container %s: %w", r.ID, errdefs.ErrAlreadyExists)
	}
	var undo assembly.Undo
	defer func() {
		if retErr != nil {
			undo.Run()
		}
	}()

	if root {
		if s.pod != nil {
			return nil, fmt.Errorf("this shim already runs sandbox %s: %w", s.pod.id, errdefs.ErrFailedPrecondition)
		}
		cfg, err := loadConfig(r.Options)
		if err != nil {
			return nil, err
		}
		restore, err := restoreDir(cfg, spec)
		if err != nil {
			return nil, err
		}
		p, err := newPod(ctx, ns, r.ID, cfg, spec)
		if err != nil {
			return nil, err
		}
		p.restore = restore
		s.pod = p
		undo.Add(func() {
			p.teardown(context.Background()) //nolint:errcheck // best effort undo
			s.pod = nil
		})
	} else if s.pod == nil || s.pod.id != sandboxID {
		return nil, fmt.Errorf("container %s joins sandbox %q, which this shim does not run: %w", r.ID, sandboxID, errdefs.ErrFailedPrecondition)
	}
	pd := s.pod
	if err := pd.adjustSpec(spec, root); err != nil {
		return nil, err
	}
	if err := pd.allowNameservers(ctx, spec); err != nil {
		return nil, err
	}
	if err := runsc.WriteBundle(r.Bundle, spec); err != nil {
		return nil, err
	}

	c := &container{id: r.ID, bundle: r.Bundle, spec: spec, root: root, execs: map[string]*process{}, checkpoint: r.Checkpoint}
	if len(r.Rootfs) > 0 {
		c.rootfs = filepath.Join(r.Bundle, "rootfs")
		if err := os.MkdirAll(c.rootfs, 0o711); err != nil {
			return nil, err
		}
		var mounts []mount.Mount
		for _, m := range r.Rootfs {
			mounts = append(mounts, mount.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
		}
		if err := mount.All(mounts, c.rootfs); err != nil {
			return nil, fmt.Errorf("mount rootfs: %w", err)
		}
		undo.Add(func() { mount.UnmountRecursive(c.rootfs, 0) }) //nolint:errcheck // best effort undo
	}
	if err := writeRecord(r.Bundle, record{SandboxID: sandboxID, Root: root, Runsc: *pd.r, Linked: pd.linked, StateDir: pd.stateDir, Cgroup: pd.ownCgroup, Egress: pd.egress}); err != nil {
		return nil, err
	}

	p := newProcess(r.ID, "", stdio{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal})
	c.init = p
	// A failed create releases the sandbox's exit handler, which finds
	// the container unregistered and reports nothing.
	undo.Add(p.markStarted)
	if c.checkpoint == "" {
		undo.Add(func() { pd.r.Delete(context.Background(), r.ID, true) }) //nolint:errcheck // best effort undo
		if err := s.runscCreate(ctx, pd, c, p); err != nil {
			return nil, err
		}
		undo.Add(p.closeIO)
	}
	s.containers[r.ID] = c
	s.send(&eventstypes.TaskCreate{
		ContainerID: r.ID, Bundle: r.Bundle, Rootfs: r.Rootfs,
		IO:         &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Checkpoint: r.Checkpoint, Pid: uint32(p.getPid()),
	})
	return &taskAPI.CreateTaskResponse{Pid: uint32(p.getPid())}, nil
}

// runscCreate runs `runsc create` for c's init with its stdio. A root
// container's stdio goes with create; a subcontainer's with start.
func (s *service) runscCreate(ctx context.Context, pd *pod, c *container, p *process) (retErr error) {
	opts := runsc.CreateOpts{PidFile: filepath.Join(c.bundle, "init.pid")}
	if p.stdio.Terminal {
		cs, err := newConsoleSocket()
		if err != nil {
			return err
		}
		defer cs.Close()
		opts.ConsoleSocket = cs.Path()
		defer func() {
			if retErr == nil {
				p.tty, retErr = receiveTTY(ctx, cs, p.stdio)
			}
		}()
	} else {
		pio, err := newPipeIO(ctx, p.stdio)
		if err != nil {
			return err
		}
		p.pio = pio
		if c.root {
			opts.Stdin, opts.Stdout, opts.Stderr = pio.procIn, pio.procOut, pio.procErr
		}
	}
	if err := pd.r.Create(ctx, c.id, c.bundle, opts); err != nil {
		p.closeIO()
		return err
	}
	if c.root && p.pio != nil {
		p.pio.closeProcessEnds()
	}
	hp, err := pd.r.HostPids(c.id)
	if err != nil {
		return err
	}
	p.pid = hp.Sandbox
	if c.root {
		pd.sandboxPid = hp.Sandbox
		pd.oomCgroup = processCgroup(hp.Sandbox)
		pd.oomBase = oomKills(pd.oomCgroup)
		go s.reapSandbox(c, hp)
	}
	return nil
}

// Start starts a created init (or restores it from a checkpoint), or an
// exec'd process.
func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	r2 := s.runsc()
	if r.ExecID != "" {
		if err := s.startExec(ctx, r2, c, p); err != nil {
			return nil, errgrpc.ToGRPC(err)
		}
		return &taskAPI.StartResponse{Pid: uint32(p.getPid())}, nil
	}
	if st := p.getState(); st != stateCreated {
		return nil, errgrpc.ToGRPC(transitionError("start", st))
	}
	switch {
	case c.checkpoint != "":
		err = s.restore(ctx, r2, c, p)
	case c.root:
		err = s.startSandbox(ctx, r2, c)
	default:
		err = s.startSubcontainer(ctx, r2, c, p)
	}
	if err != nil {
		log.G(ctx).WithError(err).WithField("id", r.ID).Error("start")
		// No start event will come: an exit may be published.
		p.markStarted()
		return nil, errgrpc.ToGRPC(err)
	}
	if err := p.transition(evStart); err != nil {
		// It exited before the start was recorded: its exit stands.
		log.G(ctx).WithError(err).WithField("id", r.ID).Debug("start")
	}
	s.send(&eventstypes.TaskStart{ContainerID: c.id, Pid: uint32(p.getPid())})
	p.markStarted()
	return &taskAPI.StartResponse{Pid: uint32(p.getPid())}, nil
}

// startSubcontainer starts a container that joins the sandbox and waits
// for its init in the background.
func (s *service) startSubcontainer(ctx context.Context, r *runsc.Runsc, c *container, p *process) error {
	s.mu.Lock()
	pd := s.pod
	s.mu.Unlock()
	if pd == nil {
		return fmt.Errorf("container %s: its sandbox is gone: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	var o runsc.StartOpts
	if p.pio != nil {
		o = runsc.StartOpts{Stdin: p.pio.procIn, Stdout: p.pio.procOut, Stderr: p.pio.procErr}
	}
	if err := s.startOrRestore(ctx, r, c, o); err != nil {
		return err
	}
	if p.pio != nil {
		p.pio.closeProcessEnds()
	}
	if hp, err := r.HostPids(c.id); err == nil && hp.Gofer > 0 && hp.Gofer != pd.sandboxPid {
		go reap(hp.Gofer)
	}
	gone := pd.gone
	go func() {
		status := exitLost
		ws, err := r.Wait(context.Background(), c.id, 0)
		if err == nil {
			status = ws.ExitStatus
		} else {
			// runsc wait fails when the sandbox is gone: the sandbox's
			// exit handling reports this container (after its OOM).
			select {
			case <-gone:
				return
			case <-time.After(5 * time.Second):
			}
		}
		// The container's other processes end with its init.
		r.Kill(context.Background(), c.id, syscall.SIGKILL, runsc.KillOpts{All: true}) //nolint:errcheck // may be gone
		s.waitExecs(c, ioDrain)
		s.processExited(p, status)
	}()
	return nil
}

// waitExecs gives c's exec'd processes up to d to report their exits, so
// that they are published before the init's.
func (s *service) waitExecs(c *container, d time.Duration) {
	waitPublished(s.execsOf(c), d)
}

// waitPublished gives the started processes of ps up to d in all to have
// their exits published.
func waitPublished(ps []*process, d time.Duration) {
	deadline := time.After(d)
	for _, p := range ps {
		if p.getState() == stateCreated {
			continue
		}
		select {
		case <-p.done:
		case <-deadline:
			return
		}
	}
}

// Delete deletes an exited process; for an init, its container: runsc
// state, rootfs mount and, for the sandbox container, the pod's host
// set-up.
func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	c, p, err := s.getProcess(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.ExecID != "" {
		if st := p.getState(); st != stateStopped && st != stateCreated {
			return nil, errgrpc.ToGRPC(transitionError("delete", st))
		}
		p.closeIO()
		s.mu.Lock()
		delete(c.execs, r.ExecID)
		s.mu.Unlock()
		code, at := p.exited()
		return &taskAPI.DeleteResponse{Pid: uint32(p.getPid()), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
	}
	st := p.getState()
	if st == stateRunning || st == statePaused {
		return nil, errgrpc.ToGRPC(transitionError("delete", st))
	}
	if err := s.deleteContainer(ctx, c); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	code, at := p.exited()
	if st == stateCreated {
		code, at = exitLost, time.Now()
	}
	s.send(&eventstypes.TaskDelete{
		ContainerID: c.id, Pid: uint32(p.getPid()), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at), ID: c.id,
	})
	return &taskAPI.DeleteResponse{Pid: uint32(p.getPid()), ExitStatus: uint32(code), ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// execsOf is a snapshot of c's exec'd processes, taken under s.mu (Exec
// and DeleteProcess change the map concurrently).
func (s *service) execsOf(c *container) []*process {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*process, 0, len(c.execs))
	for _, e := range c.execs {
		out = append(out, e)
	}
	return out
}

func (s *service) deleteContainer(ctx context.Context, c *container) error {
	s.mu.Lock()
	pd := s.pod
	s.mu.Unlock()
	var errs []error
	if pd != nil {
		if err := pd.r.Delete(ctx, c.id, true); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeContainerCgroup(c.spec); err != nil {
		errs = append(errs, err)
	}
	c.init.closeIO()
	for _, e := range s.execsOf(c) {
		e.closeIO()
	}
	if c.rootfs != "" {
		if err := mount.UnmountRecursive(c.rootfs, 0); err != nil {
			errs = append(errs, fmt.Errorf("unmount rootfs: %w", err))
		}
	}
	s.mu.Lock()
	delete(s.containers, c.id)
	if c.root && s.pod != nil {
		if err := s.pod.teardown(ctx); err != nil {
			errs = append(errs, err)
		}
		s.pod = nil
	}
	s.mu.Unlock()
	// A task deleted before it ran has exited now, for any waiter.
	if c.init.setExited(exitLost) {
		c.init.finish()
	}
	c.init.transition(evDelete) //nolint:errcheck // deleted once; the exit above came first
	return errors.Join(errs...)
}
