package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/emptypb"

	"hutch.dev/hutch/runsc"
)

// RootfsUpperFile is the file in a checkpoint that holds the sandbox's
// root filesystem changes (gVisor's overlay upper layer) as a tar. runsc
// restores them from its own state; the tar makes them visible in the
// checkpoint image.
const RootfsUpperFile = "rootfs-upper.tar"

// ContainersFile is the file in a pod's checkpoint that names the pod's
// containers it holds (JSON: {"containers": [NAME...]}); a pod restored
// from it restores containers of those names only.
const ContainersFile = "hutch-containers.json"

type containersFile struct {
	Containers []string `json:"containers"`
}

// Checkpoint saves the sandbox's memory and filesystem, with every
// container of its pod, into r.Path: the runc checkpoint option
// ImagePath when the caller gave one (made if missing), else a directory
// containerd then stores as the checkpoint image's content. With the runc
// checkpoint option Exit the sandbox stops afterwards and every
// container of the pod exits; otherwise it keeps running.
func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*emptypb.Empty, error) {
	c, err := s.getContainer(r.ID)
	if err != nil {
		return nil, err
	}
	if !c.root {
		return nil, errgrpc.ToGRPCf(errdefs.ErrNotImplemented, "checkpoint of %s: only a sandbox's own container can be checkpointed, not one that joined it", r.ID)
	}
	if !filepath.IsAbs(r.Path) {
		return nil, errgrpc.ToGRPCf(errdefs.ErrInvalidArgument, "checkpoint of %s: image path %q is not absolute", r.ID, r.Path)
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
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("checkpoint directory: %w", err)
	}
	if err := s.writeContainers(dir); err != nil {
		return err
	}
	// A pod's sandbox container (pause) has a read-only root and no
	// changes to export; its containers' changes are in runsc's image.
	if c.spec.Root == nil || !c.spec.Root.Readonly {
		if err := rs.TarRootfsUpper(ctx, c.id, filepath.Join(dir, RootfsUpperFile)); err != nil {
			return fmt.Errorf("export rootfs changes: %w", err)
		}
	}
	return rs.Checkpoint(ctx, c.id, dir, runsc.CheckpointOpts{LeaveRunning: !exit})
}

// writeContainers writes ContainersFile: the names of the pod's
// containers that run (or are paused) and so are in the checkpoint.
func (s *service) writeContainers(dir string) error {
	f := containersFile{Containers: []string{}}
	s.mu.Lock()
	for _, c := range s.containers {
		if st := c.init.getState(); !c.root && (st == stateRunning || st == statePaused) {
			f.Containers = append(f.Containers, c.spec.Annotations[criContainerName])
		}
	}
	s.mu.Unlock()
	slices.Sort(f.Containers)
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ContainersFile), b, 0o600); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// checkpointNames are the names of the containers the checkpoint in dir
// holds, nil if it does not say (no ContainersFile).
func checkpointNames(dir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, ContainersFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f := containersFile{Containers: []string{}}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", ContainersFile, err)
	}
	return f.Containers, nil
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

// checkpointName is a checkpoint's name as AnnotationRestore gives it; it
// can never be a path of more than one element.
var checkpointName = regexp.MustCompile(`^[0-9a-f]{32}$`)

// namespaceName is a Kubernetes namespace's name (a DNS label).
var namespaceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// restoreDir is the checkpoint a pod's sandbox spec asks to be restored
// from (AnnotationRestore), "" if it asks for none: cfg.CheckpointDir/
// NAMESPACE/NAME, where NAMESPACE is the pod's own, so that a pod can only
// restore a checkpoint of its namespace.
func restoreDir(cfg Config, spec *specs.Spec) (string, error) {
	name, ok := spec.Annotations[AnnotationRestore]
	if !ok {
		return "", nil
	}
	if !checkpointName.MatchString(name) {
		return "", fmt.Errorf("annotation %s=%q: a checkpoint name is 32 lowercase hex digits: %w", AnnotationRestore, name, errdefs.ErrInvalidArgument)
	}
	ns := spec.Annotations[criSandboxNamespace]
	if !namespaceName.MatchString(ns) {
		return "", fmt.Errorf("annotation %s=%s: the pod's namespace (annotation %s) is %q, not a Kubernetes namespace: %w",
			AnnotationRestore, name, criSandboxNamespace, ns, errdefs.ErrInvalidArgument)
	}
	dir := filepath.Join(cfg.CheckpointDir, ns, name)
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) || err == nil && !fi.IsDir() {
		return "", fmt.Errorf("annotation %s=%s: no checkpoint of that name in namespace %s on this node: %w", AnnotationRestore, name, ns, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("annotation %s=%s: %w", AnnotationRestore, name, err)
	}
	return dir, nil
}

// startSandbox starts a pod's sandbox container, or, when the pod names a
// checkpoint, restores the sandbox from it: runsc created the sandbox at
// Create, and the checkpoint's kernel, loaded into it, resumes once each
// of the pod's containers is restored too (startOrRestore).
func (s *service) startSandbox(ctx context.Context, rs *runsc.Runsc, c *container) error {
	s.mu.Lock()
	dir := ""
	if s.pod != nil {
		dir = s.pod.restore
	}
	s.mu.Unlock()
	if dir == "" {
		return rs.Start(ctx, c.id)
	}
	return rs.Restore(ctx, c.id, c.bundle, dir, runsc.RestoreOpts{Detach: true})
}

// startOrRestore starts a created container that joins the sandbox, with
// the stdio in o. In a pod restored from a checkpoint, the first container
// of each name the checkpoint holds is restored from it instead (runsc
// matches it by name to the checkpointed container); a later one of that
// name (a restart) starts afresh. A container of another name starts once
// all of the checkpoint's are restored (the restored sandbox runs nothing
// until then, and runsc would wait forever for a container it cannot
// match); before, it is refused.
func (s *service) startOrRestore(ctx context.Context, rs *runsc.Runsc, c *container, o runsc.StartOpts) error {
	name := c.spec.Annotations[criContainerName]
	s.mu.Lock()
	pd := s.pod
	dir := ""
	if pd != nil && !pd.restored[name] {
		dir = pd.restore
	}
	s.mu.Unlock()
	if dir == "" {
		return rs.StartIO(ctx, c.id, o)
	}
	names, err := checkpointNames(dir)
	if err != nil {
		return fmt.Errorf("container %q: restore from %s: %w", name, dir, err)
	}
	s.mu.Lock()
	if names != nil && !slices.Contains(names, name) {
		var pending []string
		for _, n := range names {
			if !pd.restored[n] {
				pending = append(pending, n)
			}
		}
		s.mu.Unlock()
		if len(pending) == 0 {
			return rs.StartIO(ctx, c.id, o)
		}
		return fmt.Errorf("container %q: the pod's checkpoint (annotation %s=%s) holds no container of that name, and it starts only once the checkpoint's containers are restored; not yet restored: %s: %w",
			name, AnnotationRestore, filepath.Base(dir), strings.Join(pending, ", "), errdefs.ErrFailedPrecondition)
	}
	claimed := pd.restored[name]
	if pd.restored == nil {
		pd.restored = map[string]bool{}
	}
	pd.restored[name] = true
	s.mu.Unlock()
	if claimed {
		return rs.StartIO(ctx, c.id, o)
	}
	return rs.Restore(ctx, c.id, c.bundle, dir, runsc.RestoreOpts{
		Detach: true, Stdin: o.Stdin, Stdout: o.Stdout, Stderr: o.Stderr,
	})
}
