package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"
)

// A plain exec (pipes, no terminal, not detached) does not run the runsc
// binary: it makes the two calls `runsc exec` would make on the sandbox's
// control socket, ExecuteAsync and WaitPID, itself. Starting runsc, loading
// its Go runtime and reading the container's state takes about as long as
// starting the process inside gVisor; see docs/decisions/0008-exec-over-
// the-control-socket.md. The messages below are those of the pinned runsc
// (runsc/boot/controller.go, pkg/sentry/control/proc.go); a test decodes
// them into runsc's own types.

// Methods of runsc's control server, as runsc/boot names them.
const (
	ctlExecuteAsync   = "containerManager.ExecuteAsync"
	ctlWaitPID        = "containerManager.WaitPID"
	ctlSignal         = "containerManager.Signal"
	ctlTarRootfsUpper = "Fs.TarRootfsUpperLayer"
	// ctlTarRootfsUpperInPieces is the same call under the name
	// tools/runsc/tarstream.patch adds: a sentry that has it exports
	// files in pieces (ExportsInPieces).
	ctlTarRootfsUpperInPieces = "Fs.TarRootfsUpperLayerInPieces"
)

// ctlTarArgs is control.TarRootfsUpperLayerOpts: the container and the
// file the tar goes to.
type ctlTarArgs struct {
	ContainerID string
	urpc.FilePayload
}

// ctlExecArgs is runsc's control.ExecArgs, with the fields `runsc exec`
// sets (argsFromProcess in runsc/cmd/exec.go); the rest stay unset there
// too.
type ctlExecArgs struct {
	urpc.FilePayload
	GuestFDs         []int
	Argv             []string `json:"argv"`
	Envv             []string `json:"envv"`
	WorkingDirectory string   `json:"wd"`
	KUID             uint32
	KGID             uint32
	ExtraKGIDs       []uint32
	NoNewPrivileges  bool
	Capabilities     *ctlCaps
	StdioIsPty       bool
	SupportTTYs      bool
	ContainerID      string
}

// ctlCaps is auth.TaskCapabilities: each set a bit mask of capabilities.
type ctlCaps struct {
	PermittedCaps   uint64
	InheritableCaps uint64
	EffectiveCaps   uint64
	BoundingCaps    uint64
	AmbientCaps     uint64
}

// ctlWaitPIDArgs is boot.WaitPIDArgs.
type ctlWaitPIDArgs struct {
	PID int32
	CID string
}

// ctlSignalArgs is boot.SignalArgs, delivering to one process (mode 0,
// DeliverToProcess).
type ctlSignalArgs struct {
	CID   string
	Signo int32
	PID   int32
	Mode  int
}

// ctlState is what a plain exec needs of runsc's state file for a
// container: its status and its sandbox's control socket and user.
type ctlState struct {
	Status  string `json:"status"`
	Sandbox struct {
		ControlSocketPath string `json:"controlSocketPath"`
		UID               int    `json:"uid"`
		GID               int    `json:"gid"`
	} `json:"sandbox"`
}

// ErrSandboxGone is returned by ExecProcess.Wait, with status 137, when
// the sandbox itself stopped (or was checkpointed) under the process.
var ErrSandboxGone = errors.New("the sandbox stopped under it")

// errNoControl means the control socket cannot be used for this exec; the
// caller runs `runsc exec`, which reports the reason in runsc's words.
var errNoControl = errors.New("control socket not usable")

// loadCtlState reads runsc's state for container id.
func (r *Runsc) loadCtlState(id string) (*ctlState, error) {
	var st ctlState
	if err := r.readState(id, &st); err != nil || st.Sandbox.ControlSocketPath == "" {
		return nil, errNoControl
	}
	// runsc exec accepts the same two states.
	if st.Status != "created" && st.Status != "running" {
		return nil, errNoControl
	}
	return &st, nil
}

// ctlCall makes one call on its own connection, as runsc does.
func ctlCall(socket, method string, arg, result any) error {
	return ctlCallContext(context.Background(), socket, method, arg, result)
}

// ctlCallContext is ctlCall that gives up when ctx ends (ctx's error).
func ctlCallContext(ctx context.Context, socket, method string, arg, result any) error {
	s, err := ctlConnect(socket)
	if err != nil {
		return err
	}
	c := urpc.NewClient(s)
	defer c.Close()
	return clientCall(ctx, c, method, arg, result)
}

// clientCall makes one call on c, giving up when ctx ends (ctx's error),
// which leaves c unfit for another.
func clientCall(ctx context.Context, c *urpc.Client, method string, arg, result any) error {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { c.Socket.Shutdown() }) //nolint:errcheck // the call fails with it
		defer stop()
	}
	if err := c.Call(method, arg, result); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
}

// ctlConnect connects to the control socket at path. A path too long for
// a socket address (a deep --root) is reached as runsc reaches it: through
// /proc's name for a descriptor of the socket file.
func ctlConnect(path string) (*unet.Socket, error) {
	if len(path) < linux.UnixPathMax {
		return unet.Connect(path, false)
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return unet.Connect("/proc/self/fd/"+strconv.Itoa(fd), false)
}

// capMask turns capability names into a mask; CAP_NET_RAW is left out, as
// runsc leaves it out without --net-raw.
func capMask(names []string) (uint64, error) {
	var m uint64
	for _, n := range names {
		c, ok := linux.CapabilityFromString(n)
		if !ok {
			return 0, fmt.Errorf("unknown capability %q", n)
		}
		if c == linux.CAP_NET_RAW {
			continue
		}
		m |= 1 << uint(c)
	}
	return m, nil
}

func ctlCapsOf(lc *specs.LinuxCapabilities) (*ctlCaps, error) {
	var c ctlCaps
	var err error
	for _, s := range []struct {
		dst   *uint64
		names []string
	}{
		{&c.PermittedCaps, lc.Permitted}, {&c.InheritableCaps, lc.Inheritable},
		{&c.EffectiveCaps, lc.Effective}, {&c.BoundingCaps, lc.Bounding},
		{&c.AmbientCaps, lc.Ambient},
	} {
		if *s.dst, err = capMask(s.names); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// ctlProc is the state of a process started over the control socket.
type ctlProc struct {
	socket string
	pid    int32

	exited  chan struct{} // closed when WaitPID has returned
	status  uint32        // its wait status, once exited
	waitErr error         // WaitPID's failure, once exited
	pipes   *Pipes
}

// ctlExec starts p in container id over the control socket. errNoControl
// means it did not try (the caller falls back to runsc exec); ErrNotStarted
// means the sandbox could not start the process.
func (r *Runsc) ctlExec(e *ExecProcess, p specs.Process, o ExecOpts) (retErr error) {
	if p.Capabilities == nil {
		return errNoControl
	}
	caps, err := ctlCapsOf(p.Capabilities)
	if err != nil {
		return errNoControl
	}
	st, err := r.loadCtlState(e.id)
	if err != nil {
		return err
	}
	pipes, err := NewPipes(o.Stdin, o.Stdout, o.Stderr)
	if err != nil {
		return err
	}
	pipes.Interactive = o.Interactive
	defer func() {
		if retErr != nil {
			pipes.Close()
		}
	}()
	// runsc gives the stdio to the sandbox's user (configureStdios); as
	// there, a refusal is not an error.
	if os.Geteuid() == 0 {
		for _, f := range pipes.Child {
			f.Chown(st.Sandbox.UID, st.Sandbox.GID) //nolint:errcheck // as runsc: best effort
		}
	}

	gids := make([]uint32, len(p.User.AdditionalGids))
	copy(gids, p.User.AdditionalGids)
	args := &ctlExecArgs{
		FilePayload:      urpc.FilePayload{Files: pipes.Child[:]},
		GuestFDs:         []int{0, 1, 2},
		Argv:             p.Args,
		Envv:             p.Env,
		WorkingDirectory: p.Cwd,
		KUID:             p.User.UID,
		KGID:             p.User.GID,
		ExtraKGIDs:       gids,
		NoNewPrivileges:  p.NoNewPrivileges,
		Capabilities:     caps,
		SupportTTYs:      true,
		ContainerID:      e.id,
	}
	var pid int32
	err = ctlCall(st.Sandbox.ControlSocketPath, ctlExecuteAsync, args, &pid)
	pipes.CloseChild()
	if err != nil {
		var re urpc.RemoteError
		if errors.As(err, &re) {
			return fmt.Errorf("%s: %w", re.Message, ErrNotStarted)
		}
		// Not connected, or the sandbox went away mid-call: runsc exec
		// says which.
		return errNoControl
	}

	cp := &ctlProc{socket: st.Sandbox.ControlSocketPath, pid: pid, exited: make(chan struct{}), pipes: pipes}
	e.ctl = cp
	pipes.Start()
	go func() {
		var ws uint32
		err := ctlCall(cp.socket, ctlWaitPID, &ctlWaitPIDArgs{PID: pid, CID: e.id}, &ws)
		cp.status, cp.waitErr = ws, err
		close(cp.exited)
	}()
	return nil
}

// signal delivers sig to the process.
func (cp *ctlProc) signal(cid string, sig syscall.Signal) error {
	return ctlCall(cp.socket, ctlSignal, &ctlSignalArgs{CID: cid, Signo: int32(sig), PID: cp.pid}, nil)
}

// wait returns the process's exit status once it has exited and its output
// has been read (for at most drain more, when a child of it keeps the
// output open).
func (cp *ctlProc) wait(drain time.Duration) (int, error) {
	<-cp.exited
	// A background child of the process may still hold the output: stop
	// reading it after drain, as runsc exec's caller would.
	cp.pipes.Finish(drain)
	if cp.waitErr != nil {
		// It was killed with the sandbox.
		return 128 + int(syscall.SIGKILL), ErrSandboxGone
	}
	ws := unix.WaitStatus(cp.status)
	if ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ws.ExitStatus(), nil
}
