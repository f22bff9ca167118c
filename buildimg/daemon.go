package buildimg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/buildimg/ociworker"
)

// DefaultIdle is how long the daemon stays up after its last build.
const DefaultIdle = 5 * time.Minute

// Daemon is the buildkitd that hutch runs for itself under one state
// directory. Its zero value is not usable: Dir and the binaries must be set.
type Daemon struct {
	// Dir holds the daemon's socket, state and locks (see the package doc).
	Dir string
	// Buildkitd is the buildkitd binary.
	Buildkitd string
	// Supervisor is the hutch-buildkitd binary, which runs Supervise.
	Supervisor string
	// Runtime is hutch-buildkit-runtime, buildkitd's OCI worker binary.
	Runtime string
	// Runsc is the runsc binary the runtime runs steps with.
	Runsc string
	// Platform is gVisor's platform for build steps; empty: runsc's default.
	Platform string
	// Idle is how long the daemon outlives its last build; 0: DefaultIdle.
	Idle time.Duration
	// Allow is the daemon's build allow list (policy.ParseAllow rules):
	// with any, each RUN step gets a network of its own in mode allow
	// with these rules (stepnet.go); without, steps have none. Root
	// only.
	Allow []string
	// DNS are the upstream servers the steps' resolvers forward to;
	// none: the host's.
	DNS []string
	// CABundle is a file of the CA certificates steps with a network
	// trust, put over the image's bundle; empty: the image's own.
	CABundle string
}

// socketName is the daemon's socket in Dir. buildkitd, run in Dir, listens
// on it by this relative name, so that no Dir is too deep for a socket
// address.
const socketName = "buildkitd.sock"

func (d *Daemon) path(name string) string { return filepath.Join(d.Dir, name) }
func (d *Daemon) socket() string          { return d.path(socketName) }

// Addr is the daemon's address as BuildKit's client takes it. A client
// dials it with Dial: a deep Dir makes it too long to dial by its name.
func (d *Daemon) Addr() string { return "unix://" + d.socket() }

// Dial connects to the daemon's socket; a BuildKit client takes it as
// its dialer (client.WithContextDialer).
func (d *Daemon) Dial(ctx context.Context, _ string) (net.Conn, error) {
	return ociworker.DialUnix(ctx, d.socket())
}

func (d *Daemon) idle() time.Duration {
	if d.Idle > 0 {
		return d.Idle
	}
	return DefaultIdle
}

// Acquire makes sure the daemon runs, starting it if needed, and keeps it
// from stopping until release is called: callers hold it for the length of
// one build. Without root, starting needs the user's subordinate IDs and
// newuidmap (RootlessMissing).
func (d *Daemon) Acquire(ctx context.Context) (release func(), err error) {
	if err := d.Check(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.Dir, 0o700); err != nil {
		return nil, err
	}
	start, err := flock(d.path("lock"), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer start.Close()
	// Shared while building; the supervisor stops the daemon only when it
	// gets this exclusively, so a build never loses its daemon to the idle
	// timer, and a stop in progress finishes before the check below.
	use, err := flock(d.path("use.lock"), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	if !d.answers() {
		if err := d.start(ctx); err != nil {
			use.Close()
			return nil, err
		}
	}
	return func() {
		now := time.Now()
		if err := os.Chtimes(d.path("last-used"), now, now); errors.Is(err, os.ErrNotExist) {
			_ = os.WriteFile(d.path("last-used"), nil, 0o600)
		}
		use.Close()
	}, nil
}

// Check says what is missing for the daemon to start: its binaries, and
// without root what RootlessMissing names.
func (d *Daemon) Check() error {
	for _, b := range []string{d.Buildkitd, d.Supervisor, d.Runtime, d.Runsc} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s missing (run `make`): %w", b, errdefs.ErrNotFound)
		}
	}
	if os.Geteuid() != 0 {
		return checkRootless()
	}
	return nil
}

// answers reports whether something accepts connections on the socket.
func (d *Daemon) answers() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := d.Dial(ctx, "")
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// start runs the supervisor in its own session and waits for the daemon's
// socket. The caller holds the start lock.
func (d *Daemon) start(ctx context.Context) error {
	logf, err := os.OpenFile(d.path("buildkitd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	off, _ := logf.Seek(0, 2)
	args := []string{"--dir", d.Dir, "--buildkitd", d.Buildkitd, "--runtime", d.Runtime,
		"--runsc", d.Runsc, "--idle", d.idle().String()}
	if d.Platform != "" {
		args = append(args, "--platform", d.Platform)
	}
	for _, a := range d.Allow {
		args = append(args, "--allow", a)
	}
	for _, a := range d.DNS {
		args = append(args, "--dns", a)
	}
	if d.CABundle != "" {
		args = append(args, "--ca-bundle", d.CABundle)
	}
	cmd := exec.Command(d.Supervisor, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start buildkitd: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fail := func(why string) error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		b, _ := os.ReadFile(d.path("buildkitd.log"))
		if int64(len(b)) > off {
			b = b[off:]
		}
		return fmt.Errorf("buildkitd %s: %s (log: %s)", why, lastLine(string(b)), d.path("buildkitd.log"))
	}
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fail("start interrupted")
		case <-exited:
			return fail("exited while starting")
		case <-deadline.C:
			return fail("did not open its socket")
		case <-tick.C:
			if d.answers() {
				return nil
			}
		}
	}
}

// Stop stops the daemon if it runs and waits for it to be gone. Builds in
// progress fail.
func (d *Daemon) Stop(ctx context.Context) error {
	pid, err := d.supervisorPid()
	if err != nil {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil
	}
	for alive(pid) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// SupervisorPid is the PID of the running supervisor, or 0.
func (d *Daemon) SupervisorPid() int {
	pid, _ := d.supervisorPid()
	return pid
}

func (d *Daemon) supervisorPid() (int, error) {
	b, err := os.ReadFile(d.path("supervisor.pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !alive(pid) {
		return 0, fmt.Errorf("no supervisor: %w", errdefs.ErrNotFound)
	}
	return pid, nil
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	// A zombie is gone for our purposes.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// Supervise runs buildkitd for d until it has been idle for d.Idle, or
// until SIGTERM or SIGINT, then stops it and cleans up after it: its
// socket, and any build step's sandbox it left behind. It is the body of
// the hutch-buildkitd binary. Run by an unprivileged user, it runs buildkitd
// as root of a user namespace of its own (see rootless.go).
func Supervise(ctx context.Context, d Daemon) error {
	rootless := os.Geteuid() != 0
	if err := os.MkdirAll(d.Dir, 0o700); err != nil {
		return err
	}
	if pid, err := d.supervisorPid(); err == nil && pid != os.Getpid() {
		return fmt.Errorf("a supervisor already runs (pid %d): %w", pid, errdefs.ErrAlreadyExists)
	}
	if err := os.WriteFile(d.path("supervisor.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(d.path("supervisor.pid"))
	worker := ociworker.Config{Runsc: d.Runsc, Root: d.path("runsc"), Platform: d.Platform, Rootless: rootless}
	var nets *stepNets
	if len(d.Allow) > 0 {
		if rootless {
			return fmt.Errorf("build steps with network (an allow list) need root: %w", errdefs.ErrInvalidArgument)
		}
		var err error
		if nets, err = newStepNets(ctx, d.path("steps"), d.Allow, d.DNS); err != nil {
			return err
		}
		defer nets.teardownAll(context.WithoutCancel(ctx))
		if err := nets.listen(ctx, d.path(netSocketName)); err != nil {
			return err
		}
		defer os.Remove(d.path(netSocketName))
		worker.Net, worker.CABundle = d.path(netSocketName), d.CABundle
	}
	if rootless {
		// The daemon's PID namespace ended every step's sandbox with
		// it; what is left is runsc's state, owned by the user.
		_ = os.RemoveAll(worker.Root)
	}
	if err := os.MkdirAll(worker.Root, 0o700); err != nil {
		return err
	}
	if !rootless {
		worker.Cleanup(ctx)
	}
	_ = os.Remove(d.socket())
	defer os.Remove(d.socket())

	args := []string{d.Buildkitd,
		"--root", d.path("state"),
		"--addr", "unix://" + socketName,
		"--group", "0",
		"--containerd-worker=false",
		"--oci-worker=true",
		"--oci-worker-binary", d.Runtime,
		"--oci-worker-net=host",
	}
	var cmd *exec.Cmd
	start := func() error { return cmd.Start() }
	if rootless {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		// BuildKit's own rootless mode: no cgroups or /sys in the
		// steps' specs; its trace socket under Dir, not /run.
		args = append(args, "--rootless", "--otel-socket-path", d.path("otel-grpc.sock"))
		if cmd, start, err = rootlessCommand(self, args); err != nil {
			return err
		}
	} else {
		cmd = exec.Command(args[0], args[1:]...)
		// No network: the daemon resolves images only from hutch's
		// store, and build steps run with gVisor's --network=none,
		// or in a step network of their own (stepnet.go). Its own mount namespace (private: Go remounts /
		// with MS_PRIVATE for CLONE_NEWNS in Unshareflags): the
		// snapshot mounts of its steps never show on the host and
		// vanish with it, even when it is killed.
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:   syscall.CLONE_NEWNET,
			Unshareflags: syscall.CLONE_NEWNS,
			Pdeathsig:    syscall.SIGKILL,
		}
	}
	cmd.Env = append(os.Environ(), worker.Env()...)
	cmd.Dir = d.Dir // where its socket's relative name is
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := start(); err != nil {
		return fmt.Errorf("start buildkitd: %w", err)
	}
	started := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()

	stop := func(why string) error {
		log.G(ctx).WithField("reason", why).Info("stopping buildkitd")
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if !rootless {
			worker.Cleanup(ctx)
		}
		return nil
	}
	for {
		select {
		case err := <-exited:
			if !rootless {
				worker.Cleanup(ctx)
			}
			return fmt.Errorf("buildkitd exited: %v", err)
		case s := <-sigs:
			return stop(s.String())
		case <-ctx.Done():
			return stop("context done")
		case <-tick.C:
			last := started
			if fi, err := os.Stat(d.path("last-used")); err == nil && fi.ModTime().After(last) {
				last = fi.ModTime()
			}
			if time.Since(last) < d.idle() {
				continue
			}
			use, err := flock(d.path("use.lock"), unix.LOCK_EX|unix.LOCK_NB)
			if errors.Is(err, unix.EWOULDBLOCK) {
				continue // a build is running
			}
			if err != nil {
				// The state directory is gone or broken: nobody can
				// use this daemon any more.
				return stop(err.Error())
			}
			err = stop("idle")
			// The socket goes before the lock: a waiting client then
			// sees the daemon gone and starts a new one.
			_ = os.Remove(d.socket())
			use.Close()
			return err
		}
	}
}

// flock opens path and takes a flock(2) of kind how on it.
func flock(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
