package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/runsc"
)

// The files API works on a running sandbox's own view of its filesystem
// (its overlay upper layer, its /tmp), through the sandbox's agent run
// with `runsc exec` as root: the host never opens the sandbox's files.
// Paths are absolute or relative to the sandbox's working directory; a
// path with a ".." component is refused (errdefs.ErrInvalidArgument).
// Errors wrap errdefs sentinels: ErrNotFound, ErrAlreadyExists,
// ErrInvalidArgument (not a directory, is a directory, unsafe path),
// ErrPermissionDenied, ErrFailedPrecondition (directory not empty).

// FileInfo describes a file in a sandbox.
type FileInfo = wire.FileInfo

// FileEvent is a change Watch reports: Op is create, write, remove,
// rename or chmod.
type FileEvent struct {
	Path string
	Op   string
}

// checkSandboxPath refuses a sandbox path that is empty or has a ".."
// component.
func checkSandboxPath(p string) error {
	if len(p) > 4095 {
		return fmt.Errorf("sandbox path of %d bytes: longer than 4095 (PATH_MAX): %w", len(p), errdefs.ErrInvalidArgument)
	}
	if p == "" || strings.ContainsRune(p, 0) {
		return fmt.Errorf("sandbox path %q: %w", p, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return fmt.Errorf("sandbox path %q: \"..\" is not allowed: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// running resolves ref to a running sandbox.
func (e *Engine) running(ctx context.Context, ref string) (*record, error) {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return nil, err
	}
	if sb.State != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	return sb, nil
}

// agentError is a failure the agent reported: its message, and the kind
// its exit status says.
type agentError struct {
	msg  string
	kind error
}

func (a *agentError) Error() string { return a.msg }
func (a *agentError) Unwrap() error { return a.kind }

func agentStatusError(sb *record, code int, stderr string) error {
	return AgentError(sb.ShortID(), code, stderr)
}

// AgentPath is where the sandbox agent is in every sandbox and pod hutch
// runs, for placements that run it themselves (pods/exec).
const AgentPath = wire.MountPath

// AgentError is the error of an agent run in sandbox id that exited with
// code and wrote stderr: of the errdefs kind the status stands for (not
// found, exists, permission denied, ...), saying the agent's last line.
func AgentError(id string, code int, stderr string) error {
	kinds := map[int]error{
		wire.StatusNotExist: errdefs.ErrNotFound, wire.StatusExist: errdefs.ErrAlreadyExists,
		wire.StatusNotDir: errdefs.ErrInvalidArgument, wire.StatusIsDir: errdefs.ErrInvalidArgument,
		wire.StatusUnsafe: errdefs.ErrInvalidArgument, wire.StatusUsage: errdefs.ErrInvalidArgument,
		wire.StatusPermission: errdefs.ErrPermissionDenied, wire.StatusNotEmpty: errdefs.ErrFailedPrecondition,
	}
	kind, ok := kinds[code]
	if !ok {
		kind = errdefs.ErrUnknown
	}
	msg := strings.TrimSpace(stderr)
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		msg = msg[i+1:]
	}
	if msg == "" {
		msg = "sandbox agent exited with status " + strconv.Itoa(code)
	}
	return &agentError{msg: fmt.Sprintf("in sandbox %s: %s", id, msg), kind: kind}
}

// capBuffer keeps the first 4 KiB written to it.
type capBuffer struct{ bytes.Buffer }

func (c *capBuffer) Write(p []byte) (int, error) {
	if room := 4096 - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// agentProcess starts the sandbox agent with args in sb, as root. Its
// stderr goes to errBuf.
func (e *Engine) agentProcess(ctx context.Context, sb *record, args []string, stdin io.Reader, stdout io.Writer, errBuf *capBuffer) (*runsc.ExecProcess, error) {
	// As root whatever the image's user (the agent acts for the host),
	// unless ctx says whom the operation acts as (ActingAs).
	proc, err := e.process(sb, ExecRequest{Args: append([]string{wire.MountPath}, args...), User: agentUser(ctx)})
	if err != nil {
		return nil, err
	}
	return e.runscFor(sb).Exec(ctx, sb.ID, proc, runsc.ExecOpts{Stdin: stdin, Stdout: stdout, Stderr: errBuf})
}

// agentWait waits for an agent process and turns its status into an error.
func agentWait(ctx context.Context, sb *record, p *runsc.ExecProcess, errBuf *capBuffer) error {
	code, err := p.Wait()
	switch {
	case p.TimedOut():
		return ctx.Err()
	case err != nil:
		return err
	case code != 0:
		return agentStatusError(sb, code, errBuf.String())
	}
	return nil
}

// agentRun runs the sandbox agent with args in sandbox ref to completion.
func (e *Engine) agentRun(ctx context.Context, ref string, args []string, stdin io.Reader, stdout io.Writer) error {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return err
	}
	var errBuf capBuffer
	p, err := e.agentProcess(ctx, sb, args, stdin, stdout, &errBuf)
	if err != nil {
		return err
	}
	return agentWait(ctx, sb, p, &errBuf)
}

// ReadFile streams the file at path in sandbox ref to w.
func (e *Engine) ReadFile(ctx context.Context, ref, path string, w io.Writer) error {
	if err := checkSandboxPath(path); err != nil {
		return err
	}
	return e.agentRun(ctx, ref, []string{wire.ModeCat, path}, nil, w)
}

// WriteFileRequest is a file to write in a sandbox.
type WriteFileRequest struct {
	Path string
	// Data is streamed into the file, which is created or truncated.
	Data io.Reader
	// Mode is the file's permission bits (0644 if zero).
	Mode fs.FileMode
	// Parents creates the file's missing parent directories (0755).
	Parents bool
	// Owner, if set, owns the file and the parents created for it;
	// otherwise a new file is root's.
	Owner *Owner
	// Metadata, if not nil, replaces the file's user metadata
	// (FileInfo.Metadata): keys not in it are removed.
	Metadata map[string]string
}

// WriteFile writes req.Data to req.Path in sandbox ref.
func (e *Engine) WriteFile(ctx context.Context, ref string, req WriteFileRequest) error {
	_, err := e.WriteFileInfo(ctx, ref, req)
	return err
}

// WriteFileInfo is WriteFile, and describes the file written.
func (e *Engine) WriteFileInfo(ctx context.Context, ref string, req WriteFileRequest) (FileInfo, error) {
	var fi FileInfo
	if err := checkSandboxPath(req.Path); err != nil {
		return fi, err
	}
	mode := req.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	data := req.Data
	if data == nil {
		data = strings.NewReader("")
	}
	args, err := wire.WriteArgs(req.Path, uint32(mode), req.Parents, req.Owner.args(), req.Metadata)
	if err != nil {
		return fi, err
	}
	var out bytes.Buffer
	if err := e.agentRun(ctx, ref, args, data, &out); err != nil {
		return fi, err
	}
	err = json.Unmarshal(out.Bytes(), &fi)
	return fi, err
}

// Stat describes path in sandbox ref (a symlink itself, not its target).
func (e *Engine) Stat(ctx context.Context, ref, path string) (FileInfo, error) {
	var fi FileInfo
	if err := checkSandboxPath(path); err != nil {
		return fi, err
	}
	var out bytes.Buffer
	if err := e.agentRun(ctx, ref, []string{wire.ModeStat, path}, nil, &out); err != nil {
		return fi, err
	}
	err := json.Unmarshal(out.Bytes(), &fi)
	return fi, err
}

// ReadDir lists the directory at path in sandbox ref, sorted by name.
func (e *Engine) ReadDir(ctx context.Context, ref, path string) ([]FileInfo, error) {
	if err := checkSandboxPath(path); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := e.agentRun(ctx, ref, []string{wire.ModeLs, path}, nil, &out); err != nil {
		return nil, err
	}
	var fis []FileInfo
	err := json.Unmarshal(out.Bytes(), &fis)
	return fis, err
}

// RemoveFile removes path in sandbox ref; a non-empty directory only with
// recursive.
func (e *Engine) RemoveFile(ctx context.Context, ref, path string, recursive bool) error {
	if err := checkSandboxPath(path); err != nil {
		return err
	}
	args := []string{wire.ModeRm, path}
	if recursive {
		args = []string{wire.ModeRm, "-r", path}
	}
	return e.agentRun(ctx, ref, args, nil, nil)
}

// Mkdir creates the directory path in sandbox ref with mode (0755 if
// zero); with parents, also its missing parents, and an existing directory
// is no error.
func (e *Engine) Mkdir(ctx context.Context, ref, path string, mode fs.FileMode, parents bool) error {
	if err := checkSandboxPath(path); err != nil {
		return err
	}
	if mode.Perm() == 0 {
		mode = 0o755
	}
	args := []string{wire.ModeMkdir, path, strconv.FormatUint(uint64(mode.Perm()), 8)}
	if parents {
		args = append([]string{wire.ModeMkdir, "-p"}, args[1:]...)
	}
	return e.agentRun(ctx, ref, args, nil, nil)
}

// WatchRequest is what Watch observes.
type WatchRequest struct {
	Path string
	// Recursive watches the whole tree under Path, including
	// directories created later.
	Recursive bool
}

// Watch reports changes under req.Path in sandbox ref. It returns once the
// watch is in place: every change after that is sent on the channel, which
// is closed when ctx ends (or the sandbox stops). The caller must drain
// the channel until it is closed.
func (e *Engine) Watch(ctx context.Context, ref string, req WatchRequest) (<-chan FileEvent, error) {
	if err := checkSandboxPath(req.Path); err != nil {
		return nil, err
	}
	sb, err := e.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	args := []string{wire.ModeWatch, req.Path}
	if req.Recursive {
		args = []string{wire.ModeWatch, "-r", req.Path}
	}
	pr, pw := io.Pipe()
	var errBuf capBuffer
	p, err := e.agentProcess(ctx, sb, args, nil, pw, &errBuf)
	if err != nil {
		return nil, err
	}
	waited := make(chan error, 1)
	go func() {
		err := agentWait(ctx, sb, p, &errBuf)
		pw.Close()
		waited <- err
	}()
	sc := bufio.NewScanner(pr)
	var first wire.WatchEvent
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &first) != nil || first.Op != "ready" {
		pr.Close()
		if err := <-waited; err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("watch %s in sandbox %s: the agent did not start watching", req.Path, sb.ShortID())
	}
	ch := make(chan FileEvent, 64)
	go func() {
		defer close(ch)
		defer pr.Close()
		for sc.Scan() {
			var ev wire.WatchEvent
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			select {
			case ch <- FileEvent{Path: ev.Path, Op: ev.Op}:
			case <-ctx.Done():
				// The exec is being killed; drain until it is.
			}
		}
		<-waited
	}()
	return ch, nil
}
