package engine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// Exit statuses Exec reports besides the command's own.
const (
	// ExitNotExecutable: the command exists but cannot be executed.
	ExitNotExecutable = 126
	// ExitNotFound: no such command.
	ExitNotFound = 127
	// ExitTimeout: the command ran past ExecRequest.Timeout and was
	// killed (as GNU timeout reports it).
	ExitTimeout = 124
)

// ErrTimeout is returned with ExitTimeout.
var ErrTimeout = errors.New("timed out")

// ExecRequest is a command to run in a sandbox.
type ExecRequest struct {
	Args []string
	// Env is added to the sandbox's environment.
	Env []string
	// Workdir overrides the sandbox's working directory.
	Workdir string
	// User is "uid[:gid]" or a user name from the image's /etc/passwd.
	User string
	// Stdin, if set, feeds the command's stdin; nil gives it /dev/null.
	Stdin io.Reader
	// Stdout and Stderr receive its output as it is produced.
	Stdout, Stderr io.Writer
	// Timeout, if positive, kills the command after that long.
	Timeout time.Duration
	// Detach starts the command as a child of the sandbox's init and
	// returns without waiting for it, writing its PID inside the sandbox
	// to Stdout; its output goes to the sandbox's log (Logs).
	Detach bool
	// Signals, if set, delivers each signal received to the command.
	Signals <-chan os.Signal
	// Started, if set, is called once the command runs and Signals is
	// being read: a signal sent on a buffered Signals from then on reaches
	// the command unless it has ended.
	Started func()

	// TTY runs the command on a pty of the sandbox's own devpts (its
	// /dev/pts/N), as the leader of a session with it as controlling
	// terminal: Stdin is what is typed, Stdout gets the terminal's output
	// (Stderr only hutch's own errors). Size is its size at start (zero:
	// the pty's default), Resize its changes. A ^C, ^\ or ^Z in Stdin
	// reaches the foreground job as on any terminal.
	TTY    bool
	Size   WinSize
	Resize <-chan WinSize
}

// Exec runs req in sandbox ref and returns the command's exit status: its
// own, 128+N if killed by signal N, ExitNotFound or ExitNotExecutable if it
// could not start, ExitTimeout (with ErrTimeout) if it timed out. A non-nil
// error with status -1 is hutch's own failure. It is Start and Command.Wait,
// except that with req.Detach it returns once the command runs in the
// background.
func (e *Engine) Exec(ctx context.Context, ref string, req ExecRequest) (int, error) {
	if req.Detach {
		sb, proc, err := e.prepareExec(ctx, ref, req)
		if err != nil {
			return -1, err
		}
		if sb.OneShot {
			// Its init is its command, not hutch-init, which starts
			// background processes.
			return -1, fmt.Errorf("sandbox %s runs one command (run --rm) and takes no background commands (exec -d): %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
		}
		// A child of the init survives pause and resume; a process of
		// runsc exec would not.
		return e.spawn(ctx, sb, proc, req.Stdout)
	}
	p, err := e.Start(ctx, ref, req)
	if err != nil {
		return -1, err
	}
	return p.Wait()
}

// prepareExec checks req and renders it as the OCI process to run in the
// running sandbox ref.
func (e *Engine) prepareExec(ctx context.Context, ref string, req ExecRequest) (*record, specs.Process, error) {
	if len(req.Args) == 0 {
		return nil, specs.Process{}, fmt.Errorf("exec: no command given: %w", errdefs.ErrInvalidArgument)
	}
	for _, kv := range req.Env {
		if err := policy.CheckEnv(kv); err != nil {
			return nil, specs.Process{}, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
		}
	}
	if req.Workdir != "" && !strings.HasPrefix(req.Workdir, "/") {
		return nil, specs.Process{}, fmt.Errorf("--workdir %q: must be an absolute path: %w", req.Workdir, errdefs.ErrInvalidArgument)
	}
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, specs.Process{}, err
	}
	if sb.State != StateRunning {
		if sb.OOMKilled {
			return nil, specs.Process{}, fmt.Errorf("%w: %w", oomError(sb), errdefs.ErrFailedPrecondition)
		}
		return nil, specs.Process{}, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	proc, err := e.process(sb, req)
	if err != nil {
		return nil, specs.Process{}, err
	}
	if req.TTY {
		// Before the secrets' wrapper, which drops to the user: the
		// agent then opens the terminal as the user, who owns it.
		proc = ptyProcess(proc, req.Size)
	}
	if len(sb.Secrets) > 0 {
		proc = withSecrets(proc)
	}
	return sb, proc, nil
}

// stoppedUnder reports a command whose sandbox stopped while it ran: 137,
// with the reason (out of memory) when there is one. The sandbox's
// process may take a moment to go after the command's end is seen.
func (e *Engine) stoppedUnder(sb *record, cmd string) (int, error) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		now, err := e.load(sb.ID)
		if err != nil || now.State != StateRunning {
			if err == nil && now.OOMKilled {
				return ExitOOMKilled, oomError(now)
			}
			break
		}
	}
	// Killed with its sandbox, as by SIGKILL.
	return 128 + int(unix.SIGKILL), fmt.Errorf("sandbox %s stopped while %s ran", sb.ShortID(), cmd)
}

// whyNotStarted asks the sandbox's agent, with the same environment,
// directory and user, why proc's command could not start.
func (e *Engine) whyNotStarted(ctx context.Context, sb *record, proc specs.Process) int {
	probe := proc
	probe.Args = []string{wire.MountPath, wire.ModeLookPath, proc.Args[0]}
	p, err := e.runscFor(sb).Exec(ctx, sb.ID, probe, runsc.ExecOpts{})
	if err != nil {
		return ExitNotExecutable
	}
	code, err := p.Wait()
	switch {
	case err != nil:
		// Even the probe could not start: the directory or user is bad.
		return ExitNotExecutable
	case code == wire.StatusNotFound:
		return ExitNotFound
	}
	return ExitNotExecutable
}

// process renders req as the OCI process to exec in sb.
func (e *Engine) process(sb *record, req ExecRequest) (specs.Process, error) {
	env := wire.MergeEnv(sb.ImageEnv, []string{"HOSTNAME=" + sb.ShortID()}, sb.Env, req.Env)
	cwd := firstNonEmpty(req.Workdir, sb.Workdir, sb.ImageWorkdir, "/")
	// Without --user, the image's USER, as docker runs it.
	user, err := e.resolveUser(sb, firstNonEmpty(req.User, sb.ImageUser))
	if err != nil {
		return specs.Process{}, err
	}
	home := "/root"
	if user.UID != 0 {
		home = "/"
	}
	if h := e.homeOf(sb, user.UID); h != "" {
		home = h
	}
	env = wire.MergeEnv([]string{"HOME=" + home}, env)
	if sb.Docker && user.UID != 0 {
		// The groups /etc/group gives the user, as docker exec does:
		// the image's user reaches the daemon's socket as a member of
		// its group.
		user.AdditionalGids = e.memberOf(sb, user.UID)
	}
	caps := capsFor(sb)
	pc := &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	if user.UID != 0 {
		pc = &specs.LinuxCapabilities{Bounding: caps}
	}
	return specs.Process{Args: req.Args, Env: env, Cwd: cwd, User: user, Capabilities: pc}, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// resolveUser turns "uid[:gid]" or "name[:group]" into IDs, looking names
// up in the image's /etc/passwd and /etc/group.
func (e *Engine) resolveUser(sb *record, u string) (specs.User, error) {
	if u == "" {
		return specs.User{}, nil
	}
	name, group, hasGroup := strings.Cut(u, ":")
	var out specs.User
	if uid, err := strconv.ParseUint(name, 10, 32); err == nil {
		out.UID, out.GID = uint32(uid), uint32(uid)
		if ent := e.passwdEntry(sb, "", out.UID); ent != nil {
			out.GID = ent.gid
		}
	} else {
		ent := e.passwdEntry(sb, name, 0)
		if ent == nil {
			return out, fmt.Errorf("--user %q: no such user in the image's /etc/passwd: %w", u, errdefs.ErrInvalidArgument)
		}
		out.UID, out.GID = ent.uid, ent.gid
	}
	if hasGroup {
		if gid, err := strconv.ParseUint(group, 10, 32); err == nil {
			out.GID = uint32(gid)
		} else if gid, ok := e.groupID(sb, group); ok {
			out.GID = gid
		} else {
			return out, fmt.Errorf("--user %q: no such group in the image's /etc/group: %w", u, errdefs.ErrInvalidArgument)
		}
	}
	return out, nil
}

type passwd struct {
	name     string
	uid, gid uint32
	home     string
}

// passwdEntry finds a user by name (or, with name empty, by uid) in the
// sandbox's base image.
func (e *Engine) passwdEntry(sb *record, name string, uid uint32) *passwd {
	var found *passwd
	e.scanRootfsFile(sb, "etc/passwd", func(f []string) bool {
		if len(f) < 6 {
			return false
		}
		u, err1 := strconv.ParseUint(f[2], 10, 32)
		g, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return false
		}
		if (name != "" && f[0] == name) || (name == "" && uint32(u) == uid) {
			found = &passwd{name: f[0], uid: uint32(u), gid: uint32(g), home: f[5]}
			return true
		}
		return false
	})
	return found
}

func (e *Engine) homeOf(sb *record, uid uint32) string {
	if p := e.passwdEntry(sb, "", uid); p != nil {
		return p.home
	}
	return ""
}

func (e *Engine) groupID(sb *record, name string) (uint32, bool) {
	var gid uint32
	ok := false
	e.scanRootfsFile(sb, "etc/group", func(f []string) bool {
		if len(f) >= 3 && f[0] == name {
			if g, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				gid, ok = uint32(g), true
				return true
			}
		}
		return false
	})
	return gid, ok
}

// memberOf is the groups whose member list in the image's /etc/group
// names the user of uid.
func (e *Engine) memberOf(sb *record, uid uint32) []uint32 {
	ent := e.passwdEntry(sb, "", uid)
	if ent == nil {
		return nil
	}
	var gids []uint32
	e.scanRootfsFile(sb, "etc/group", func(f []string) bool {
		if len(f) >= 4 && slices.Contains(strings.Split(f[3], ","), ent.name) {
			if g, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(g) != ent.gid {
				gids = append(gids, uint32(g))
			}
		}
		return false
	})
	return gids
}

// maxRootfsFile bounds how much of a file of the image scanRootfsFile
// reads.
const maxRootfsFile = 4 << 20

// scanRootfsFile calls fn with the colon-separated fields of each line of
// rel in the sandbox's rootfs until fn returns true. The file belongs to
// the sandbox: it is read only if it is a regular file (a FIFO would block,
// a device node would be a host device), never opened in a way that
// blocks, and read up to maxRootfsFile bytes.
func (e *Engine) scanRootfsFile(sb *record, rel string, fn func([]string) bool) {
	if sb.Rootfs == "" {
		return
	}
	// Resolve as if the rootfs were /: an image may hold symlinks such as
	// /etc -> /host/etc that must not lead to the host's files.
	dir, err := unix.Open(sb.Rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(dir)
	// An O_PATH descriptor opens nothing: its type is checked before the
	// same inode is opened for reading.
	pfd, err := unix.Openat2(dir, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	s := bufio.NewScanner(io.LimitReader(f, maxRootfsFile))
	for s.Scan() {
		if fn(strings.Split(s.Text(), ":")) {
			return
		}
	}
}
