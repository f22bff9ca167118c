// Package runsc is hutch's gVisor driver: the only code that execs runsc.
//
// It owns the typed wrapper over a pinned runsc binary (one method per runsc
// subcommand, each call's options rendering their own flags), the OCI spec
// that hutch hands to runsc, and the stdio plumbing between a caller and a
// sandboxed process (pipes or a pty, never the caller's own descriptors).
//
// It must not know about images, policy or the hutch state layout: it runs the
// bundle it is given. Callers (the hutch engine, the containerd shim) decide
// what goes into the bundle.
package runsc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"gvisor.dev/gvisor/pkg/urpc"
)

// Runsc runs one pinned runsc binary with a fixed set of global flags. The
// same global flags must be used for every call on one sandbox (create, exec,
// checkpoint, ...), so callers keep a Runsc per sandbox, or one per
// configuration.
type Runsc struct {
	// Path is the runsc binary.
	Path string
	// Wrapper, if set, is the program and arguments runsc is run
	// through: every command is Wrapper, then Path and its arguments
	// (e.g. nsenter into a user namespace, for a rootless sandbox with a
	// network).
	Wrapper []string
	// Root is runsc's state directory (--root).
	Root string
	// Platform is the gVisor platform (--platform); empty means runsc's
	// default (systrap).
	Platform string
	// Network is the --network mode: "none", "sandbox" or "host".
	Network string
	// Overlay is the --overlay2 value, e.g. "root:dir=/path,size=10g".
	Overlay string
	// GoferNetNS is --gofer-network-namespace: "new" gives every gofer an
	// empty network namespace of its own, gone with the gofer; runsc's
	// default ("null") bind-mounts one shared namespace into Root.
	GoferNetNS string
	// IgnoreCgroups passes --ignore-cgroups (rootless: no cgroup access).
	IgnoreCgroups bool
	// LogPath, if set, is runsc's own log (--log, --log-format=text).
	LogPath string
	// DebugLogDir, if set, turns on --debug and writes per-command debug
	// logs there (--debug-log=DIR/).
	DebugLogDir string
	// OCISeccomp passes --oci-seccomp: the spec's seccomp profile is
	// applied inside gVisor, to the init and every exec'd process.
	OCISeccomp bool
	// AllowSUID passes --allow-suid: setuid and setgid bits of files in
	// the sandbox take effect (sudo), inside the sandbox only.
	AllowSUID bool
	// NetRaw passes --net-raw: raw and packet sockets work in gVisor's
	// netstack for processes with CAP_NET_RAW (iptables, a Docker
	// sandbox's bridge); without it runsc removes CAP_NET_RAW.
	NetRaw bool
	// ExtraFlags are appended to the global flags verbatim.
	ExtraFlags []string
}

// globalArgs renders r's global flags.
func (r *Runsc) globalArgs() []string {
	args := []string{"--root", r.Root}
	if r.Platform != "" {
		args = append(args, "--platform="+r.Platform)
	}
	if r.Network != "" {
		args = append(args, "--network="+r.Network)
	}
	if r.Overlay != "" {
		args = append(args, "--overlay2="+r.Overlay)
	}
	if r.GoferNetNS != "" {
		args = append(args, "--gofer-network-namespace="+r.GoferNetNS)
	}
	if r.IgnoreCgroups {
		args = append(args, "--ignore-cgroups")
	}
	if r.OCISeccomp {
		args = append(args, "--oci-seccomp")
	}
	if r.AllowSUID {
		args = append(args, "--allow-suid")
	}
	if r.NetRaw {
		args = append(args, "--net-raw")
	}
	if r.LogPath != "" {
		args = append(args, "--log="+r.LogPath, "--log-format=text")
	}
	if r.DebugLogDir != "" {
		args = append(args, "--debug", "--debug-log="+r.DebugLogDir+"/")
	}
	return append(args, r.ExtraFlags...)
}

func (r *Runsc) command(ctx context.Context, sub string, args ...string) *exec.Cmd {
	full := append(r.globalArgs(), sub)
	full = append(full, args...)
	name := r.Path
	if len(r.Wrapper) > 0 {
		name, full = r.Wrapper[0], append(append(append([]string{}, r.Wrapper[1:]...), r.Path), full...)
	}
	cmd := exec.CommandContext(ctx, name, full...)
	// A runsc helper must never be killed with us by a terminal's SIGINT
	// to the process group: hutch decides what to do with signals.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = runscEnv(os.Environ())
	return cmd
}

// runscEnvVars are the variables of hutch's environment that runsc reads
// (the pinned gVisor's runsc/config, runsc/container and
// runsc/gvisorbinaries); runsc, its gofer and the sandbox process get
// these and nothing else, so that no secret in hutch's environment reaches a
// process the sandbox could compromise.
var runscEnvVars = []string{
	"PATH",
	"USER",
	"XDG_RUNTIME_DIR",
	"GVISOR_SIDECAR_BINARIES_DIR",
	"GVISOR_ENFORCE_RELEASE",
}

// runscEnv keeps of environ only the variables in runscEnvVars.
func runscEnv(environ []string) []string {
	var env []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(runscEnvVars, name) {
			env = append(env, kv)
		}
	}
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	return env
}

// Error is a failed runsc call: the subcommand, its exit status and what
// runsc printed on stderr.
type Error struct {
	Sub    string
	Status int
	Stderr string
	Err    error
	kind   error // see kindOf
}

func (e *Error) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		msg = e.Err.Error()
	}
	// A failure the sentry recovered from carries the goroutine's stack
	// after its message (a panic while a checkpoint is encoded, say).
	if i := strings.Index(msg, ":\ngoroutine "); i >= 0 {
		msg = msg[:i]
	}
	// runsc prefixes some messages with a timestamped log header; keep the
	// last line, which carries the error.
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		msg = strings.TrimSpace(msg[i+1:])
	}
	return fmt.Sprintf("runsc %s: %s", e.Sub, msg)
}

// Unwrap gives the command's own failure and, when runsc's message says
// what kind of failure it was (see kindOf), the errdefs-wrapping sentinel
// for it.
func (e *Error) Unwrap() []error {
	if e.kind != nil {
		return []error{e.Err, e.kind}
	}
	return []error{e.Err}
}

// ErrProcessGone: the process a runsc kill was aimed at is no longer there
// (it exited as the kill was sent, or its sandbox is no longer running).
// It wraps errdefs.ErrNotFound, as a kill of an exited process answers in
// containerd's runc shim.
var ErrProcessGone = fmt.Errorf("process already exited: %w", errdefs.ErrNotFound)

// kindOf tells what kind of failure runsc's stderr describes for
// subcommand sub, or nil. runsc reports every failure as exit status 1
// and a message, so its well-known messages are read here, and only here:
// ESRCH from gVisor's kernel ("signaling process in container C PID 0: no
// such process", "no such process with PID N") and runsc's own "sandbox is
// not running", for a kill that came after the process or its sandbox
// ended.
func kindOf(sub, stderr string) error {
	if sub == "kill" && (strings.Contains(stderr, "no such process") || strings.Contains(stderr, "sandbox is not running")) {
		return ErrProcessGone
	}
	return nil
}

// run runs a short runsc command to completion. Its stdout is returned.
// Stderr goes to a temporary file rather than a pipe: runsc create leaves
// daemons behind that inherit stderr, and a pipe would never see EOF.
func (r *Runsc) run(ctx context.Context, sub string, args ...string) ([]byte, error) {
	cmd := r.command(ctx, sub, args...)
	errf, err := os.CreateTemp("", "hutch-runsc-stderr-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(errf.Name())
	defer errf.Close()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = errf
	if err := cmd.Run(); err != nil {
		return out.Bytes(), r.wrapErr(sub, err, errf)
	}
	return out.Bytes(), nil
}

func (r *Runsc) wrapErr(sub string, err error, errf *os.File) error {
	var stderr []byte
	if errf != nil {
		stderr, _ = os.ReadFile(errf.Name())
	}
	e := &Error{Sub: sub, Status: -1, Stderr: string(stderr), Err: err, kind: kindOf(sub, string(stderr))}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		e.Status = ee.ExitCode()
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("runsc binary %q: %w: %w", r.Path, errdefs.ErrNotFound, err)
	}
	return e
}

// Exists reports whether runsc has state for container id. It reads runsc's
// state directory rather than parsing runsc's error text.
func (r *Runsc) Exists(id string) bool {
	return r.statePath(id) != ""
}

// statePath is runsc's state file for container id, or "" if it has none.
func (r *Runsc) statePath(id string) string {
	m, _ := filepath.Glob(filepath.Join(r.Root, globEscape(id)+"_sandbox:*.state"))
	if len(m) == 0 {
		return ""
	}
	return m[0]
}

// readState decodes runsc's state file for container id into v.
func (r *Runsc) readState(id string, v any) error {
	p := r.statePath(id)
	if p == "" {
		return fmt.Errorf("runsc container %q: %w", id, errdefs.ErrNotFound)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("runsc state of %s: %w", id, err)
	}
	return nil
}

func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// CreateOpts are the options of Create.
type CreateOpts struct {
	// PidFile receives the sandbox process's host PID.
	PidFile string
	// ConsoleSocket is a unix socket path that receives the pty master
	// when the spec asks for a terminal.
	ConsoleSocket string
	// Stdio of the container's init. nil means /dev/null. They must be
	// real files (pipes, /dev/null, a log file): runsc hands them to the
	// sandbox, which outlives this call.
	Stdin, Stdout, Stderr *os.File
}

// Create creates container id from the bundle at bundle, without starting
// its init.
func (r *Runsc) Create(ctx context.Context, id, bundle string, o CreateOpts) error {
	args := []string{"--bundle", bundle}
	if o.PidFile != "" {
		args = append(args, "--pid-file", o.PidFile)
	}
	if o.ConsoleSocket != "" {
		args = append(args, "--console-socket", o.ConsoleSocket)
	}
	return r.runDetaching(ctx, "create", append(args, id), o.Stdin, o.Stdout, o.Stderr)
}

// RunDetached creates container id from the bundle and starts its init in
// one runsc call (`runsc run --detach`), returning once it runs: the same
// as Create then Start, with one runsc process fewer.
func (r *Runsc) RunDetached(ctx context.Context, id, bundle string, o CreateOpts) error {
	args := []string{"--detach", "--bundle", bundle}
	if o.PidFile != "" {
		args = append(args, "--pid-file", o.PidFile)
	}
	if o.ConsoleSocket != "" {
		args = append(args, "--console-socket", o.ConsoleSocket)
	}
	return r.runDetaching(ctx, "run", append(args, id), o.Stdin, o.Stdout, o.Stderr)
}

// runDetaching runs a runsc command that leaves a sandbox behind (create,
// restore): the sandbox inherits the given stdio as its init's (nil means
// /dev/null). runsc's own error goes to the same stderr, so it is read
// back from a file (the caller's, from where it stood, or a temporary one)
// rather than a pipe, which the sandbox would hold open forever.
func (r *Runsc) runDetaching(ctx context.Context, sub string, args []string, stdin, stdout, stderr *os.File) error {
	cmd := r.command(ctx, sub, args...)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd.Stdin, cmd.Stdout = orFile(stdin, devnull), orFile(stdout, devnull)
	errf := stderr
	if errf == nil {
		if errf, err = os.CreateTemp("", "hutch-runsc-"+sub+"-"); err != nil {
			return err
		}
		defer os.Remove(errf.Name())
		defer errf.Close()
	}
	from, _ := errf.Seek(0, io.SeekEnd)
	cmd.Stderr = errf
	if err := cmd.Run(); err != nil {
		e := r.wrapErr(sub, err, nil)
		var re *Error
		if errors.As(e, &re) {
			if b, rerr := os.ReadFile(errf.Name()); rerr == nil && int64(len(b)) >= from {
				re.Stderr = string(b[from:])
			}
		}
		return e
	}
	return nil
}

func orFile(f, def *os.File) *os.File {
	if f != nil {
		return f
	}
	return def
}

// Start starts the init of a created container.
func (r *Runsc) Start(ctx context.Context, id string) error {
	_, err := r.run(ctx, "start", id)
	return err
}

// KillOpts are the options of Kill.
type KillOpts struct {
	// All signals every process in the container.
	All bool
	// Pid signals one process, by its PID inside the sandbox.
	Pid int
}

// Kill sends sig to the container's init (or as o says).
func (r *Runsc) Kill(ctx context.Context, id string, sig syscall.Signal, o KillOpts) error {
	var args []string
	if o.All {
		args = append(args, "--all")
	}
	if o.Pid != 0 {
		args = append(args, "--pid", strconv.Itoa(o.Pid))
	}
	args = append(args, id, strconv.Itoa(int(sig)))
	_, err := r.run(ctx, "kill", args...)
	return err
}

// Delete deletes the container. With force a running container is killed
// first. Deleting a container runsc has no state for succeeds.
func (r *Runsc) Delete(ctx context.Context, id string, force bool) error {
	if !r.Exists(id) {
		return r.removeStaleLocks(id)
	}
	args := []string{}
	if force {
		args = append(args, "--force")
	}
	_, err := r.run(ctx, "delete", append(args, id)...)
	if err != nil && !r.Exists(id) {
		return r.removeStaleLocks(id)
	}
	return err
}

// ForgetState removes runsc's state and lock files for container id,
// for a sandbox none of whose processes is left but whose state runsc
// delete could not act on (a runsc killed while creating it). A missing
// file is not an error.
func (r *Runsc) ForgetState(id string) error {
	m, _ := filepath.Glob(filepath.Join(r.Root, globEscape(id)+"_sandbox:*.state"))
	var errs []error
	for _, f := range m {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, r.removeStaleLocks(id))...)
}

// removeStaleLocks removes the lock files runsc keeps beside a container's
// state, for a container that has no state: a runsc killed during create
// leaves its lock behind.
func (r *Runsc) removeStaleLocks(id string) error {
	m, _ := filepath.Glob(filepath.Join(r.Root, globEscape(id)+"_sandbox:*.lock"))
	var errs []error
	for _, f := range m {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// State is the OCI state runsc reports for a container.
type State struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Status  string    `json:"status"`
	Bundle  string    `json:"bundle"`
	Created time.Time `json:"created"`
}

// Status values of State.Status.
const (
	StatusCreating = "creating"
	StatusCreated  = "created"
	StatusRunning  = "running"
	StatusPaused   = "paused"
	StatusStopped  = "stopped"
)

// State returns runsc's view of the container. A container runsc has no
// state for is reported as errdefs.ErrNotFound.
func (r *Runsc) State(ctx context.Context, id string) (State, error) {
	if !r.Exists(id) {
		return State{}, fmt.Errorf("runsc container %q: %w", id, errdefs.ErrNotFound)
	}
	out, err := r.run(ctx, "state", id)
	if err != nil {
		return State{}, err
	}
	var s State
	if err := json.Unmarshal(out, &s); err != nil {
		return State{}, fmt.Errorf("runsc state %s: %w", id, err)
	}
	return s, nil
}

// Process is a process inside a sandbox, as `runsc ps` reports it.
type Process struct {
	UID   uint32 `json:"uid"`
	PID   int    `json:"pid"`
	PPID  int    `json:"ppid"`
	TTY   string `json:"tty"`
	STime string `json:"stime"`
	Time  string `json:"time"`
	Cmd   string `json:"cmd"`
}

// Ps lists the container's processes. runsc's JSON form has PIDs only, so
// this reads its table: UID PID PPID PGID C TTY STIME TIME CMD.
func (r *Runsc) Ps(ctx context.Context, id string) ([]Process, error) {
	out, err := r.run(ctx, "ps", id)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var ps []Process
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < 9 {
			return nil, fmt.Errorf("runsc ps %s: unexpected line %q", id, l)
		}
		uid, err1 := strconv.ParseUint(f[0], 10, 32)
		pid, err2 := strconv.Atoi(f[1])
		ppid, err3 := strconv.Atoi(f[2])
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("runsc ps %s: line %q: %w", id, l, err)
		}
		ps = append(ps, Process{
			UID: uint32(uid), PID: pid, PPID: ppid, TTY: f[5], STime: f[6], Time: f[7],
			Cmd: strings.Join(f[8:], " "),
		})
	}
	return ps, nil
}

// WaitStatus is the exit status `runsc wait` reports.
type WaitStatus struct {
	ID         string `json:"id"`
	ExitStatus int    `json:"exitStatus"`
}

// Wait waits for the container's init (or, with pid != 0, the process with
// that PID inside the sandbox) to exit and returns its wait status.
func (r *Runsc) Wait(ctx context.Context, id string, pid int) (WaitStatus, error) {
	args := []string{}
	if pid != 0 {
		args = append(args, "--pid", strconv.Itoa(pid))
	}
	out, err := r.run(ctx, "wait", append(args, id)...)
	if err != nil {
		return WaitStatus{}, err
	}
	var ws WaitStatus
	if err := json.Unmarshal(out, &ws); err != nil {
		return WaitStatus{}, fmt.Errorf("runsc wait %s: %w", id, err)
	}
	return ws, nil
}

// CheckpointOpts are the options of Checkpoint.
type CheckpointOpts struct {
	// LeaveRunning keeps the sandbox running after the checkpoint.
	LeaveRunning bool
}

// Checkpoint saves the sandbox's memory and filesystem state into dir.
// Unless o.LeaveRunning, the sandbox exits afterwards.
func (r *Runsc) Checkpoint(ctx context.Context, id, dir string, o CheckpointOpts) error {
	args := []string{"--image-path", dir}
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	}
	_, err := r.run(ctx, "checkpoint", append(args, id)...)
	return err
}

// RestoreOpts are the options of Restore.
type RestoreOpts struct {
	// Detach returns once the sandbox runs instead of waiting for it.
	Detach bool
	// PidFile receives the sandbox process's host PID.
	PidFile string
	// Stdio of the restored init; nil means /dev/null.
	Stdin, Stdout, Stderr *os.File
}

// Restore starts container id from bundle with the state saved in dir.
func (r *Runsc) Restore(ctx context.Context, id, bundle, dir string, o RestoreOpts) error {
	args := []string{"--bundle", bundle, "--image-path", dir}
	if o.Detach {
		args = append(args, "--detach")
	}
	if o.PidFile != "" {
		args = append(args, "--pid-file", o.PidFile)
	}
	return r.runDetaching(ctx, "restore", append(args, id), o.Stdin, o.Stdout, o.Stderr)
}

// TarRootfsUpper writes the container's root filesystem changes (gVisor's
// overlay upper layer) as a tar to file.
func (r *Runsc) TarRootfsUpper(ctx context.Context, id, file string) error {
	_, err := r.run(ctx, "tar", "rootfs-upper", "--file", file, id)
	return err
}

// HasControl reports whether container id's sandbox can be reached over
// its control socket (TarRootfsUpperTo); when not, TarRootfsUpper runs
// runsc, which says why.
func (r *Runsc) HasControl(id string) bool {
	_, err := r.loadCtlState(id)
	return err == nil
}

// TarRootfsUpperTo is TarRootfsUpper writing to w (the write end of a
// pipe, say), without the runsc binary: it makes the one call `runsc tar
// rootfs-upper` makes, on the sandbox's control socket (as a plain exec
// does, ctlexec.go), and returns once the sandbox has written the whole
// tar to w, or failed. It does not close w. Canceling ctx ends the wait;
// the sandbox stops writing once w's reader is gone.
func (r *Runsc) TarRootfsUpperTo(ctx context.Context, id string, w *os.File) error {
	st, err := r.loadCtlState(id)
	if err != nil {
		return err
	}
	s, err := ctlConnect(st.Sandbox.ControlSocketPath)
	if err != nil {
		return fmt.Errorf("%w: %v", errNoControl, err)
	}
	c := urpc.NewClient(s)
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { s.Shutdown() }) //nolint:errcheck // the call fails, which is the point
	defer stop()
	args := &ctlTarArgs{ContainerID: id, FilePayload: urpc.FilePayload{Files: []*os.File{w}}}
	if err := c.Call(ctlTarRootfsUpper, args, nil); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("serializing rootfs upper layer to tar: %w", err)
	}
	return nil
}

// ExportsInPieces reports whether the sandbox of container id exports its
// upper layer's files in pieces, so that a file's apparent size costs its
// sentry no memory (tools/runsc/tarstream.patch): it asks the sandbox for
// the call under the name that patch adds, with no file to write to,
// which such a sandbox refuses and any other does not know. A sandbox
// whose control socket cannot be used does not.
func (r *Runsc) ExportsInPieces(id string) bool {
	st, err := r.loadCtlState(id)
	if err != nil {
		return false
	}
	err = ctlCall(st.Sandbox.ControlSocketPath, ctlTarRootfsUpperInPieces, &ctlTarArgs{ContainerID: id}, nil)
	var re urpc.RemoteError
	return errors.As(err, &re) && re.Message != urpc.ErrUnknownMethod.Error()
}

// Version returns the first line of `runsc --version`.
func (r *Runsc) Version(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, r.Path, "--version").Output()
	if err != nil {
		return "", r.wrapErr("--version", err, nil)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line), nil
}
