package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/policy"
	runsc "sbx.dev/sbx/runsc-sandbox"
	"sbx.dev/sbx/runsc-sandbox/agent"
)

// CreateRequest is what a new sandbox should be. Zero values take the
// defaults of DESIGN.md.
type CreateRequest struct {
	Name   string
	Image  string
	CPUs   float64
	Memory int64
	Pids   int64
	Disk   int64
	// Network is the network mode ("none").
	Network string
	// Env is added to the image's environment for every process.
	Env []string
	// Workdir is the default working directory of exec'd processes.
	Workdir string
	Labels  map[string]string
	// Explicit names the limits the caller set (e.g. "memory"), so
	// that a rootless create can refuse limits it cannot enforce.
	Explicit []string

	// Setup are shell commands run once per (image, commands): their
	// result is cached as an image and later creates start from it.
	Setup []string
	// Timeout, if positive, is the sandbox's lifetime; then OnTimeout
	// ("pause", the default, "stop" or "rm") happens.
	Timeout   time.Duration
	OnTimeout string
}

// cleanup runs its functions in reverse unless released: the undo stack of
// a create that fails halfway.
type cleanup struct{ fns []func() }

func (c *cleanup) add(f func()) { c.fns = append(c.fns, f) }
func (c *cleanup) release()     { c.fns = nil }
func (c *cleanup) clean() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
}

// Create validates req, prepares the sandbox's rootfs and starts it. On any
// error it leaves nothing behind: no record, lease, cgroup or process.
func (e *Engine) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	pr, err := policy.Validate(policy.Request{
		CPUs: req.CPUs, Memory: req.Memory, Pids: req.Pids, Disk: req.Disk,
		Network: req.Network, Env: req.Env, Workdir: req.Workdir,
		Rootless: e.rootless, Explicit: req.Explicit,
	})
	if err != nil {
		return nil, err
	}
	if req.Name != "" {
		if err := checkName(req.Name); err != nil {
			return nil, err
		}
	}
	imageName := req.Image
	if imageName == "" {
		imageName = DefaultImage
	}
	img, err := e.Image(ctx, imageName)
	if err != nil {
		return nil, err
	}
	if err := e.checkLifetime(req.Timeout, req.OnTimeout); err != nil {
		return nil, err
	}
	img, setupKey, setupHit, err := e.setupImage(ctx, img, req.Setup)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(e.opts.InitPath); err != nil {
		return nil, fmt.Errorf("sbx-init %q missing (run `make`): %w", e.opts.InitPath, errdefs.ErrNotFound)
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	sb := &Sandbox{
		ID: id, Name: req.Name, Image: img.Name, ImageDigest: img.Digest,
		Created: time.Now().UTC(), CPUs: pr.CPUs, Memory: pr.Memory, Pids: pr.Pids,
		Disk: pr.Disk, Network: pr.Network, Env: pr.Env, Workdir: req.Workdir,
		Labels: req.Labels, Rootless: e.rootless, CreatorPid: os.Getpid(),
	}
	setPersistFields(sb, req)
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", id))

	var undo cleanup
	defer undo.clean()
	if err := e.reserve(sb, &undo); err != nil {
		return nil, err
	}

	rootfs, err := e.images.Rootfs(ctx, img, id)
	undo.add(func() {
		if err := e.images.Release(context.Background(), id); err != nil {
			log.G(ctx).WithError(err).Warn("release rootfs lease")
		}
	})
	if err != nil {
		return nil, err
	}
	sb.Rootfs = rootfs

	env := append(append([]string{}, img.Config.Config.Env...), "HOSTNAME="+sb.ShortID())
	spec := runsc.Spec(runsc.SpecConfig{
		Rootfs:   rootfs,
		Hostname: sb.ShortID(),
		Process: specs.Process{
			Args: []string{agent.MountPath},
			Env:  env,
			Cwd:  "/",
		},
		Mounts: []specs.Mount{{
			Destination: agent.MountPath, Type: "bind", Source: e.opts.InitPath,
			Options: []string{"rbind", "ro"},
		}},
		UserNamespace: e.rootless,
		HostUID:       uint32(os.Getuid()),
		HostGID:       uint32(os.Getgid()),
		CgroupsPath:   e.cgroupsPath(id),
		Annotations:   map[string]string{"dev.sbx.sandbox.id": id},
	})
	if err := policy.Resources(pr)(spec); err != nil {
		return nil, err
	}
	bundle := filepath.Join(e.sandboxDir(id), "bundle")
	if err := runsc.WriteBundle(bundle, spec); err != nil {
		return nil, err
	}

	r := e.runscFor(sb)
	undo.add(func() {
		if err := e.destroyRuntime(context.Background(), sb); err != nil {
			log.G(ctx).WithError(err).Error("cleaning up a failed create")
		}
	})
	pidFile := filepath.Join(e.sandboxDir(id), "sandbox.pid")
	logf, err := os.OpenFile(filepath.Join(e.sandboxDir(id), "init.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if err := r.Create(ctx, id, bundle, runsc.CreateOpts{PidFile: pidFile, Stdout: logf, Stderr: logf}); err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	if err := r.Start(ctx, id); err != nil {
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	st, err := r.State(ctx, id)
	if err != nil {
		return nil, err
	}
	if st.Status != runsc.StatusRunning {
		return nil, fmt.Errorf("sandbox %s is %s right after start", sb.ShortID(), st.Status)
	}
	sb.Pid = st.Pid
	if sb.PidStart, err = procStartTime(st.Pid); err != nil {
		return nil, fmt.Errorf("sandbox process %d: %w", st.Pid, err)
	}
	sb.BootID = bootID()
	sb.CreatorPid = 0
	if err := e.save(sb); err != nil {
		return nil, err
	}
	if err := e.finishCreate(ctx, sb, req, setupKey, setupHit); err != nil {
		return nil, err
	}
	undo.release()
	sb.State = StateRunning
	return sb, nil
}

// reserve creates sb's directory and record, checking that its name is
// free. The record is there from the start so that a crashed create shows
// in List and rm can clean it up.
func (e *Engine) reserve(sb *Sandbox, undo *cleanup) error {
	unlock, err := e.lockNames()
	if err != nil {
		return err
	}
	defer unlock()
	if sb.Name != "" {
		all, err := e.List(context.Background())
		if err != nil {
			return err
		}
		for _, o := range all {
			if o.Name == sb.Name {
				return fmt.Errorf("sandbox name %q is in use by %s: %w", sb.Name, o.ShortID(), errdefs.ErrAlreadyExists)
			}
		}
	}
	if err := os.Mkdir(e.sandboxDir(sb.ID), 0o700); err != nil {
		return err
	}
	undo.add(func() { os.RemoveAll(e.sandboxDir(sb.ID)) })
	return e.save(sb)
}

// cgroupsPath is the sandbox's cgroup, or none when rootless.
func (e *Engine) cgroupsPath(id string) string {
	if e.rootless {
		return ""
	}
	return cgroupPath(id)
}

// destroyRuntime removes everything runsc holds for sb: its processes,
// its runsc state and its cgroup. It is safe on a half-created sandbox and
// on one that is already gone.
func (e *Engine) destroyRuntime(ctx context.Context, sb *Sandbox) error {
	stopWatchdog(sb)
	r := e.runscFor(sb)
	var errs []error
	if err := r.Delete(ctx, sb.ID, true); err != nil {
		errs = append(errs, err)
	}
	// If runsc itself was killed mid-create, its sandbox and gofer may
	// remain without state runsc knows about, and may still be setting up
	// the cgroup: they must be gone before it is removed.
	killOrphans(sb.ID)
	if !e.rootless {
		if err := removeCgroup(cgroupPath(sb.ID)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
