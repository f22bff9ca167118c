package engine

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/engine/workspace"
	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
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
	// Network is the network mode: none (default), open or allow.
	Network string
	// Allow are the --allow rules: CIDR[:PORT] or DOMAIN[:PORT].
	Allow []string
	// Inject are the --inject rules (policy.ParseInject): headers the
	// egress gateway sets, from the host's secret store, on requests to
	// an allowed host; the sandbox holds at most a placeholder.
	Inject []string
	// DNS are upstream resolvers for the sandbox's resolver; empty means
	// the host's.
	DNS []string
	// NetRate limits what the sandbox sends, in bits per second
	// (policy.ParseRate); 0 is no limit.
	NetRate int64
	// Env is added to the image's environment for every process.
	Env []string
	// Workdir is the default working directory of exec'd processes.
	Workdir string
	Labels  map[string]string
	// Docker gives the sandbox what a Docker daemon inside it needs
	// (policy.Request.Docker); without Image, its image is DockerImage.
	// An image labelled LabelDocker implies it.
	Docker bool
	// Ports are published on the host by a detached forwarder process
	// (Options.HutchPath) until the sandbox stops.
	Ports []PortMapping
	// Explicit names the limits the caller set (e.g. "memory"), so
	// that a rootless create can refuse limits it cannot enforce.
	Explicit []string
	// Secrets are "NAME=@FILE" or "NAME=env:VAR": read by Create from
	// this process's files and environment, they reach the sandbox's
	// processes as environment and as files in /run/secrets, and are
	// kept nowhere else (docs/security.md). A program that takes
	// secrets from others passes SecretValues instead: a reference
	// reads this process's files and environment.
	Secrets []string
	// SecretValues are secrets given by value; Create reads nothing for
	// them.
	SecretValues []Secret

	// Setup are shell commands run once per (image, commands): their
	// result is cached as an image and later creates start from it.
	Setup []string
	// SetupScope limits the reuse of cached setup results to creates of
	// the same scope (e.g. a tenant); results are also keyed on the
	// image, env, workdir, network policy, CA certificates and secrets.
	SetupScope string
	// Timeout, if positive, is the sandbox's lifetime; then OnTimeout
	// ("pause", the default, "stop" or "rm") happens.
	Timeout   time.Duration
	OnTimeout string

	// Pull says when Image is fetched from a registry first: PullNever
	// (the zero value), PullMissing or PullAlways.
	Pull PullPolicy
	// Registry says how a pull reaches registries.
	Registry RegistryOptions

	// CACerts are certificates the sandbox trusts besides its image's
	// and the state root's (TrustDir): in its system bundle and in the
	// variables Node, Python, pip, curl and git read (policy.CAEnv).
	CACerts []CACert

	// Mounts are host directories and named volumes mounted into the
	// sandbox (Mount).
	Mounts []Mount

	// pool is the pool this create boots a sandbox for (FillPool).
	pool string
	// noWarm boots a template's image cold and runs nothing in it: the
	// sandbox its checkpoint is built from.
	noWarm bool
}

// image is the image req names, or the default one.
func (req CreateRequest) image() string {
	switch {
	case req.Image != "":
		return req.Image
	case req.Docker:
		return DockerImage
	}
	return DefaultImage
}

// Create validates req, prepares the sandbox's rootfs and starts it. On any
// error it leaves nothing behind: no record, lease, cgroup or process.
func (e *Engine) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	sb, err := e.create(ctx, req, nil)
	return sb.view(), err
}

// create is Create; with cmd, cmd is the sandbox's init (Run). A warm
// pool's sandbox serves it if one matches; otherwise its steps (prepare,
// reserve, provision, assemble, launch, finish) share one record and one
// undo stack, which takes back everything they made unless the last of
// them succeeds.
func (e *Engine) create(ctx context.Context, req CreateRequest, cmd *initCommand) (*record, error) {
	pr, err := e.validate(req)
	if err != nil {
		return nil, err
	}
	if cmd == nil && req.pool == "" {
		// A warm pool's sandbox, if one matches (pool.go).
		if sb, err := e.claim(ctx, req, pr); sb != nil || err != nil {
			return sb, err
		}
	}
	c := &creation{e: e, req: req, pr: pr, cmd: cmd}
	defer c.release()
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", c.sb.ID))
	defer c.undo.Run()
	for _, step := range []func(context.Context) error{c.reserve, c.provision, c.assemble, c.launch, c.finish} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	c.undo.Release()
	c.sb.State = StateRunning
	return c.sb, nil
}

// creation is a create under way: what its steps share.
type creation struct {
	e   *Engine
	req CreateRequest
	pr  policy.Request
	cmd *initCommand

	// undo takes back what the steps made, last made first, when a step
	// fails.
	undo assembly.Undo
	// sb is the new sandbox's record.
	sb *record

	unlockVolumes func()
	volMounts     []specs.Mount
	cas           []*x509.Certificate
	// gatewayCA is the sandbox's gateway CA (egress.NewCA), made when it
	// has inject rules; written to its state directory at assemble.
	gatewayCA []byte
	listeners []PortListener
	img       overlay.Image
	setupKey  string
	setupHit  bool

	// tmpl is the template of the image, if it is one (TemplateOf);
	// warm is its checkpoint, which launch restores, unless that cannot
	// be (coldReason): then the template's command is started in the
	// sandbox booted cold.
	tmpl       *Template
	warm       *warmTemplate
	coldReason string

	// owners is a rootless store's list of the image's file owners.
	owners   string
	caMounts []specs.Mount
	init     specs.Process
	bundle   string
}

// release lets go of what prepare holds for the whole create, whether it
// succeeds or not: the ports' listeners (the forwarder has its own) and
// the lock on the volumes.
func (c *creation) release() {
	for _, l := range c.listeners {
		l.Listener.Close()
	}
	if c.unlockVolumes != nil {
		c.unlockVolumes()
	}
}

// prepare resolves what the request names, before anything is made: the
// volumes it mounts (locked against removal until the bundle names them),
// its CA certificates, its ports (bound, so that a port in use fails the
// create first), its image (pulled, and set up, as the request says),
// and hutch-init. It fills in the record, unsaved, under a new ID.
// It makes nothing for the undo stack; release lets go of what it holds.
func (c *creation) prepare(ctx context.Context) error {
	e, req, pr := c.e, c.req, c.pr
	var err error
	if c.unlockVolumes, err = e.lockVolumes(unix.LOCK_SH); err != nil {
		return err
	}
	if c.volMounts, err = e.resolveMounts(req.Mounts); err != nil {
		return err
	}
	if c.cas, err = e.extraCAs(req.CACerts); err != nil {
		return err
	}
	inject, err := policy.ParseInjectList(req.Inject, pr.Network, pr.Allow)
	if err != nil {
		return err
	}
	// The forwarder inherits the listeners.
	if c.listeners, err = ListenPorts(req.Ports); err != nil {
		return err
	}
	if err := e.pullFor(ctx, req); err != nil {
		return err
	}
	img, err := e.Image(ctx, req.image())
	if err != nil {
		return err
	}
	if wantsDocker(img) && !pr.Docker {
		// The image's daemon needs what a Docker sandbox has.
		if err := e.checkDocker(true); err != nil {
			return fmt.Errorf("image %s (label %s): %w", img.Name, LabelDocker, err)
		}
		c.req.Docker, c.pr.Docker = true, true
		req, pr = c.req, c.pr
	}
	if c.img, c.setupKey, c.setupHit, err = e.setupImageFor(ctx, img, req, pr.Secrets, req.SetupScope); err != nil {
		return err
	}
	if _, err := os.Stat(e.opts.InitPath); err != nil {
		return fmt.Errorf("hutch-init %q missing (run `make`): %w", e.opts.InitPath, errdefs.ErrNotFound)
	}
	if err := c.template(ctx, img); err != nil {
		return err
	}
	id, err := newID()
	if err != nil {
		return err
	}
	c.sb = &record{
		ID: id, Name: req.Name, Image: c.img.Name, ImageDigest: c.img.Digest,
		Created: time.Now().UTC(), CPUs: pr.CPUs, Memory: pr.Memory, Pids: pr.Pids,
		Disk: pr.Disk, Network: pr.Network, Allow: req.Allow, DNS: req.DNS, NetRate: req.NetRate, Env: pr.Env, Workdir: req.Workdir,
		Docker: pr.Docker, Labels: req.Labels, Rootless: e.rootless, CreatorPid: os.Getpid(),
		Secrets: secretNames(pr.Secrets), Mounts: req.Mounts,
	}
	if pr.Docker && req.Timeout > 0 && req.OnTimeout == OnTimeoutPause {
		return fmt.Errorf("--on-timeout pause: a Docker sandbox cannot be paused (%s); give --on-timeout stop or rm: %w", dockerNoCheckpointWhy, errdefs.ErrInvalidArgument)
	}
	setPersistFields(c.sb, req)
	e.setRootlessLimits(c.sb)
	return c.prepareInject(inject)
}

// reserve saves the record in the sandbox's new directory (a pool's boot
// directory for a pool's sandbox), taking its name. The undo removes the
// directory and frees the name.
func (c *creation) reserve(ctx context.Context) error {
	return c.e.reserveFor(c.sb, c.req.pool, &c.undo)
}

// provision makes the sandbox's files: its :overlay workspaces, mounted,
// and its rootfs, under a lease of the image store, with the image's
// environment and the CA certificates it trusts. The undo unmounts the
// workspaces and releases the lease.
func (c *creation) provision(ctx context.Context) error {
	e, sb := c.e, c.sb
	if err := e.makeWorkspaces(ctx, sb.ID, c.req.Mounts, c.volMounts, &c.undo); err != nil {
		return err
	}
	rootfs, err := e.images.Rootfs(ctx, c.img, sb.ID)
	c.undo.Add(func() {
		if err := e.images.Release(context.Background(), sb.ID); err != nil {
			log.G(ctx).WithError(err).Warn("release rootfs lease")
		}
	})
	if err != nil {
		return err
	}
	sb.Rootfs = rootfs
	// A rootless store keeps the image's owners as a list: the agent
	// sets them inside the sandbox before anything else runs there.
	if e.rootless {
		c.owners = e.images.OwnersFile(rootfs)
	}
	// Exec needs the image's environment and directory every time: keep
	// them in the record rather than reading the image store per exec.
	cfg := c.img.Config.Config
	sb.ImageEnv, sb.ImageWorkdir = cfg.Env, cfg.WorkingDir
	sb.ImageUser = cfg.User
	caMounts, caEnv, err := e.prepareCAs(sb, rootfs, c.cas)
	if err != nil {
		return err
	}
	c.caMounts = caMounts
	if len(caEnv) > 0 {
		// Under the sandbox's own --env, which may name another bundle.
		sb.Env = append(caEnv, sb.Env...)
	}
	return nil
}

// assemble writes the sandbox's bundle: its init (the agent, or Run's
// command with its pipes), its network, its mounts and limits, and its
// cgroup. The undo closes the command's pipes and takes down the network
// and the cgroup.
func (c *creation) assemble(ctx context.Context) error {
	e, sb, pr := c.e, c.sb, c.pr
	env := append(append([]string{}, c.img.Config.Config.Env...), "HOSTNAME="+sb.ShortID())
	c.init = specs.Process{Args: []string{wire.MountPath}, Env: env, Cwd: "/"}
	if c.cmd != nil {
		// A bad --user fails here, before anything runs.
		if err := c.cmd.prepare(e, sb); err != nil {
			return err
		}
		c.undo.Add(c.cmd.close)
		c.init = c.cmd.proc
		if c.owners != "" {
			c.init = withOwners(c.init)
		}
		sb.OneShot = true
	}

	if c.gatewayCA != nil {
		if err := os.WriteFile(gatewayCAPath(e.sandboxDir(sb.ID)), c.gatewayCA, 0o600); err != nil {
			return err
		}
	}
	netns, netMounts, err := e.setupNetwork(ctx, sb, pr.Allow, &c.undo)
	if err != nil {
		return err
	}

	spec := runsc.Spec(runsc.SpecConfig{
		Rootfs:   sb.Rootfs,
		Hostname: sb.ShortID(),
		Process:  c.init,
		Mounts: append([]specs.Mount{{
			Destination: wire.MountPath, Type: "bind", Source: e.opts.InitPath,
			Options: []string{"rbind", "ro"},
		}}, append(netMounts, c.caMounts...)...),
		NetworkNamespace: netns,
		UserNamespace:    e.rootless,
		HostUID:          hostID(e.inUserNS(sb.ID), os.Getuid()),
		HostGID:          hostID(e.inUserNS(sb.ID), os.Getgid()),
		CgroupsPath:      e.sandboxCgroup(sb),
		Annotations:      map[string]string{"dev.hutch.sandbox.id": sb.ID},
	})
	if c.owners != "" {
		spec.Mounts = append(spec.Mounts, specs.Mount{
			Destination: wire.OwnersPath, Type: "bind", Source: c.owners,
			Options: []string{"rbind", "ro"},
		})
	}
	if len(pr.Secrets) > 0 || c.req.pool != "" || c.tmpl != nil {
		// A pool's sandbox may be claimed with secrets; a template's
		// checkpoint serves creates with secrets and without.
		spec.Mounts = append(spec.Mounts, secretsMount())
	}
	mid, err := e.machineIDMount(sb.ID)
	if err != nil {
		return err
	}
	spec.Mounts = append(append(spec.Mounts, mid), c.volMounts...)
	if err := assembly.Apply(spec, assembly.SandboxOpts(pr)...); err != nil {
		return err
	}
	if err := e.rootlessProcessLimit(spec, pr); err != nil {
		return err
	}
	if err := e.createCgroup(ctx, sb, spec.Linux.Resources, &c.undo); err != nil {
		return err
	}
	c.bundle = filepath.Join(e.sandboxDir(sb.ID), "bundle")
	return runsc.WriteBundle(c.bundle, spec)
}

// launch starts the sandbox with runsc, detached (its init is the agent)
// or attached (Run's command), records its process, and once its init
// has started gives it the image's owners, its secrets and its ports'
// forwarder. The undo destroys the runtime: runsc's sandbox, its cgroup,
// network and workspace mounts, and the forwarder.
func (c *creation) launch(ctx context.Context) error {
	e, sb := c.e, c.sb
	r := e.runscFor(sb)
	c.undo.Add(func() {
		if err := e.destroyRuntime(context.Background(), sb); err != nil {
			log.G(ctx).WithError(err).Error("cleaning up a failed create")
		}
	})
	pidFile := filepath.Join(e.sandboxDir(sb.ID), "sandbox.pid")
	logf, err := os.OpenFile(filepath.Join(e.sandboxDir(sb.ID), "init.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	if c.cmd != nil {
		// runsc runs the command to its end from here; Run's wait reads
		// its status, so only runsc failing to start is an error now.
		// The command may end before its sandbox's PID is read: the
		// record then shows the sandbox stopped.
		if sb.Pid, err = c.cmd.start(ctx, r, sb.ID, c.bundle, pidFile, logf); err != nil {
			return fmt.Errorf("start sandbox: %w", err)
		}
		if sb.Pid != 0 {
			sb.PidStart, _ = assembly.ProcessStart(sb.Pid)
			sb.BootID = bootID()
		}
	} else if c.warm != nil && c.restoreWarm(ctx, pidFile, logf) {
		// Restored from the template's checkpoint, with its own
		// identity; its processes learn the create's environment.
		if len(c.pr.Env) > 0 {
			if err := e.writeEnv(ctx, sb, c.pr.Env); err != nil {
				return err
			}
		}
	} else {
		if err := r.RunDetached(ctx, sb.ID, c.bundle, runsc.CreateOpts{PidFile: pidFile, Stdout: logf, Stderr: logf}); err != nil {
			return fmt.Errorf("start sandbox: %w", err)
		}
		// runsc wrote the sandbox process's PID at create; a started
		// sandbox whose process is gone fails the liveness check below.
		if sb.Pid, err = readPidFile(pidFile); err != nil {
			return fmt.Errorf("sandbox %s: %w", sb.ShortID(), err)
		}
		if sb.PidStart, err = assembly.ProcessStart(sb.Pid); err != nil {
			return fmt.Errorf("sandbox %s exited right after start: %w", sb.ShortID(), err)
		}
		sb.BootID = bootID()
		if err := waitInit(ctx, logf.Name(), sb.Pid); err != nil {
			return fmt.Errorf("sandbox %s: %w", sb.ShortID(), err)
		}
		if c.owners != "" {
			if err := e.applyOwners(ctx, sb); err != nil {
				return err
			}
		}
	}
	if len(c.pr.Secrets) > 0 {
		if err := e.writeSecrets(ctx, sb, c.pr.Secrets); err != nil {
			return err
		}
	}
	if len(c.listeners) > 0 {
		// The forwarder reads the record; destroyRuntime, in the undo
		// stack already, stops it.
		if err := e.save(sb); err != nil {
			return err
		}
		if err := e.startForwarder(sb, c.listeners); err != nil {
			return err
		}
	}
	return nil
}

// finish saves the record as the started sandbox's, runs or records its
// setup and starts its lifetime watchdog (the undo's destroyRuntime stops
// it). A create whose context ended (its caller was interrupted) fails
// here, even when no step noticed, so that it leaves nothing.
func (c *creation) finish(ctx context.Context) error {
	e, sb := c.e, c.sb
	sb.CreatorPid = 0
	if err := e.save(sb); err != nil {
		return err
	}
	if err := e.finishCreate(ctx, sb, c.req, c.setupKey, c.setupHit); err != nil {
		return err
	}
	if c.tmpl != nil && !c.req.noWarm && c.warm == nil {
		// Cold: the template's command, as its checkpoint would have
		// had it running; the record says why.
		if sb.Template == nil {
			sb.Template = &TemplateStart{Reason: c.coldReason}
			if err := e.save(sb); err != nil {
				return err
			}
		}
		if err := e.startTemplate(ctx, sb, c.tmpl); err != nil {
			return fmt.Errorf("sandbox %s of template %s, booted cold (%s): %w", sb.ShortID(), c.img.Name, c.coldReason, err)
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ShortID(), context.Cause(ctx))
	}
	return nil
}

// ValidateCreate returns the error Create would return for req's flat
// checks (limits, network, names), without creating anything: callers run
// it before slow preparations such as building the default image.
func (e *Engine) ValidateCreate(req CreateRequest) error {
	_, err := e.validate(req)
	return err
}

func (e *Engine) validate(req CreateRequest) (policy.Request, error) {
	allow, err := policy.ParseAllowList(req.Allow)
	if err != nil {
		return policy.Request{}, err
	}
	secrets, err := loadSecrets(req.Secrets, req.SecretValues)
	if err != nil {
		return policy.Request{}, err
	}
	// A rootless request's limits are checked against what this host
	// lets its user enforce, not refused outright.
	unenforceable, why := e.unenforceable()
	pr, err := policy.Validate(policy.Request{
		CPUs: req.CPUs, Memory: req.Memory, Pids: req.Pids, Disk: req.Disk,
		Network: req.Network, Allow: allow, DNS: req.DNS, Env: req.Env, Workdir: req.Workdir,
		Rootless: e.rootless, Explicit: req.Explicit, Unenforceable: unenforceable, UnenforceableWhy: why,
		Secrets: secrets, Docker: req.Docker,
	})
	if err != nil {
		return pr, err
	}
	if err := e.checkRootlessNetwork(pr.Network); err != nil {
		return pr, err
	}
	if err := e.checkNetRate(req.NetRate, pr.Network); err != nil {
		return pr, err
	}
	if err := e.checkDocker(req.Docker); err != nil {
		return pr, err
	}
	if req.Name != "" {
		if err := checkName(req.Name); err != nil {
			return pr, err
		}
	}
	if err := e.checkLifetime(req.Timeout, req.OnTimeout); err != nil {
		return pr, err
	}
	if _, err := e.extraCAs(req.CACerts); err != nil {
		return pr, err
	}
	if len(req.Inject) > 0 {
		inject, err := policy.ParseInjectList(req.Inject, pr.Network, pr.Allow)
		if err != nil {
			return pr, err
		}
		if e.rootless {
			return pr, fmt.Errorf("--inject: a rootless sandbox's traffic leaves through slirp4netns, where no egress gateway runs yet; run as root: %w", errdefs.ErrInvalidArgument)
		}
		if err := e.checkSecretsStored(inject); err != nil {
			return pr, err
		}
	}
	if _, err := e.resolveMounts(req.Mounts); err != nil {
		return pr, err
	}
	return pr, nil
}

// reserve creates sb's directory and record, checking that its name is
// free. The record is there from the start so that a crashed create shows
// in List and rm can clean it up.
func (e *Engine) reserve(sb *record, undo *assembly.Undo) error {
	unlock, err := e.lockNames()
	if err != nil {
		return err
	}
	defer unlock()
	if err := e.takeName(sb.Name, sb.ID); err != nil {
		return err
	}
	undo.Add(func() { e.dropName(sb.Name, sb.ID) }) //nolint:errcheck // a stale entry is taken as free
	if err := os.Mkdir(e.sandboxDir(sb.ID), 0o700); err != nil {
		return err
	}
	undo.Add(func() { os.RemoveAll(e.sandboxDir(sb.ID)) })
	return e.save(sb)
}

// destroyRuntime removes everything runsc holds for sb: its processes,
// its runsc state and its cgroup. It is safe on a half-created sandbox and
// on one that is already gone.
func (e *Engine) destroyRuntime(ctx context.Context, sb *record) error {
	stopWatchdog(sb)
	stopFinisher(sb)
	r := e.runscFor(sb)
	var errs []error
	stopForwarder(sb)
	derr := r.Delete(ctx, sb.ID, true)
	// If runsc itself was killed mid-create, its sandbox and gofer may
	// remain without state runsc knows about, and may still be setting up
	// the cgroup: they must be gone before it is removed. A runsc delete
	// that succeeded has stopped the sandbox and gofer its state names
	// and waited for them; a runsc killed before it wrote that state
	// leaves none, and delete fails. So the scan of every host process
	// (about six per live sandbox) is only for a failed delete, or for
	// a sandbox whose create or fork did not finish (CreatorPid).
	if derr != nil || sb.CreatorPid != 0 {
		killOrphans(sb.ID)
	}
	if derr != nil {
		// A state runsc delete could not act on (a runsc killed while
		// writing it): with every process of the sandbox gone, once
		// more, then runsc's files go.
		if derr = r.Delete(ctx, sb.ID, true); derr != nil {
			log.G(ctx).WithError(derr).WithField("sandbox", sb.ShortID()).Warn("runsc delete failed; removing its state")
			derr = r.ForgetState(sb.ID)
		}
	}
	if derr != nil {
		errs = append(errs, derr)
	}
	if !e.rootless {
		if err := assembly.RemoveCgroup(cgroupPath(sb.ID)); err != nil {
			errs = append(errs, err)
		}
	} else if sb.Cgroup != "" {
		if err := assembly.RemoveDelegated(assembly.Cgroup2Mount, sb.Cgroup); err != nil {
			errs = append(errs, err)
		}
	}
	if err := e.teardownNetwork(ctx, sb); err != nil {
		errs = append(errs, err)
	}
	// After the gofer is gone: the :overlay workspaces' host mounts.
	if err := workspace.UnmountAll(e.sandboxDir(sb.ID)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// initStartTimeout bounds how long create waits for a sandbox's init to
// start: seconds on a loaded host, milliseconds on an idle one.
const initStartTimeout = 60 * time.Second

// waitInit waits until the init of the sandbox whose process is pid has
// written to its log, at logPath, that it has started. Until then its
// /proc/1/fd still reaches that log, a file on the host (the init closes
// it to the sandbox's processes once its runtime runs), so nothing may run
// in the sandbox before.
func waitInit(ctx context.Context, logPath string, pid int) error {
	deadline := time.Now().Add(initStartTimeout)
	buf := make([]byte, 64<<10)
	for d := 100 * time.Microsecond; ; d = min(2*d, time.Millisecond) {
		if f, err := os.Open(logPath); err == nil {
			n, _ := io.ReadFull(f, buf)
			f.Close()
			if wire.Started(buf[:n]) {
				return nil
			}
		}
		if !processAlive(pid) {
			return errors.New("the sandbox exited before its init started")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its init did not start within %s", initStartTimeout)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(d):
		}
	}
}

// readPidFile reads a PID runsc wrote.
func readPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %s: %q", path, b)
	}
	return pid, nil
}

// applyOwners has the agent give the files of sb's rootfs the owners its
// image gives them (a rootless sandbox's: wire.OwnersPath), before any
// other command runs in it.
func (e *Engine) applyOwners(ctx context.Context, sb *record) error {
	return e.agentAsRoot(ctx, sb, wire.CmdApplyOwners, nil, "setting the image's file owners")
}

// withOwners wraps proc, a rootless sandbox's init command, so that the
// agent sets the image's file owners first, as root, and then runs it as
// proc's user.
func withOwners(proc specs.Process) specs.Process {
	return agentFirst(proc, wire.CmdApplyOwners)
}
