package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/engine"
)

// engineBackend runs the tools on hutch's engine on this host: sandboxes
// carry the server's OwnerLabel, and ports are forwarded to 127.0.0.1.
type engineBackend struct {
	s   *Server
	eng *engine.Engine

	// ctx bounds the port forwards; close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex // guards forwards
	// forwards are the running port forwards by sandbox ID.
	forwards map[string][]forward
}

type forward struct {
	port   uint16
	url    string
	cancel context.CancelFunc
}

func newEngineBackend(s *Server, eng *engine.Engine) *engineBackend {
	b := &engineBackend{s: s, eng: eng, forwards: map[string][]forward{}}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b
}

func (b *engineBackend) close() { b.cancel() }

// sandbox resolves ref to a sandbox the server manages. Another's sandbox
// is reported as missing, as it is from this server's view.
func (b *engineBackend) sandbox(ctx context.Context, ref string) (*engine.Sandbox, error) {
	if err := checkRef(ref); err != nil {
		return nil, err
	}
	sb, err := b.eng.Get(ctx, ref)
	if errdefs.IsNotFound(err) || (err == nil && !b.s.manages(sb.Labels)) {
		return nil, unknownSandbox(ref)
	}
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// stopForwards ends the port forwards of sandbox id.
func (b *engineBackend) stopForwards(id string) {
	b.mu.Lock()
	fs := b.forwards[id]
	delete(b.forwards, id)
	b.mu.Unlock()
	for _, f := range fs {
		f.cancel()
	}
}

func (b *engineBackend) info(sb *engine.Sandbox) sandboxInfo {
	in := sandboxInfo{SandboxID: sb.ID, Name: sb.Name, Image: sb.Image, State: sb.State, Network: sb.Network, Allow: sb.Allow, Created: sb.Created}
	if sb.Deadline != nil && sb.State == engine.StateRunning {
		in.ExpiresAt = sb.Deadline.UTC().Format(time.RFC3339)
	}
	b.mu.Lock()
	for _, f := range b.forwards[sb.ID] {
		in.Ports = append(in.Ports, f.url)
	}
	b.mu.Unlock()
	return in
}

func (b *engineBackend) create(ctx context.Context, a createArgs) (sandboxInfo, error) {
	req, err := b.s.createRequest(a)
	if err != nil {
		return sandboxInfo{}, err
	}
	if err := b.eng.ValidateCreate(req); err != nil {
		return sandboxInfo{}, err
	}
	sb, err := b.eng.Create(ctx, req)
	if err != nil {
		return sandboxInfo{}, err
	}
	b.s.log.Info("created sandbox", "id", sb.ID, "image", sb.Image, "network", sb.Network)
	return b.info(sb), nil
}

func (b *engineBackend) list(ctx context.Context) ([]sandboxInfo, error) {
	all, err := b.eng.List(ctx)
	if err != nil {
		return nil, err
	}
	out := []sandboxInfo{}
	for _, sb := range all {
		if b.s.manages(sb.Labels) {
			out = append(out, b.info(sb))
		}
	}
	return out, nil
}

func (b *engineBackend) remove(ctx context.Context, ref string) error {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return err
	}
	b.stopForwards(sb.ID)
	if err := b.eng.Remove(ctx, sb.ID, true); err != nil {
		return err
	}
	b.s.log.Info("removed sandbox", "id", sb.ID)
	return nil
}

func (b *engineBackend) pause(ctx context.Context, ref string) (sandboxInfo, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return sandboxInfo{}, err
	}
	b.stopForwards(sb.ID)
	if sb, err = b.eng.Pause(ctx, sb.ID); err != nil {
		return sandboxInfo{}, err
	}
	return b.info(sb), nil
}

func (b *engineBackend) resume(ctx context.Context, ref string) (sandboxInfo, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return sandboxInfo{}, err
	}
	if sb, err = b.eng.Resume(ctx, sb.ID); err != nil {
		return sandboxInfo{}, err
	}
	return b.info(sb), nil
}

func (b *engineBackend) snapshot(ctx context.Context, ref, name string) (snapshotResult, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return snapshotResult{}, err
	}
	img, err := b.eng.Snapshot(ctx, sb.ID, engine.SnapshotRequest{Name: name})
	if err != nil {
		return snapshotResult{}, err
	}
	return snapshotResult{Image: img.Name, Digest: img.Digest.String()}, nil
}

// exec runs x in the sandbox and captures its output. hutch's own failure
// is an error.
func (b *engineBackend) exec(ctx context.Context, ref string, x execSpec) (execOutcome, error) {
	env, err := envList(x.Env)
	if err != nil {
		return execOutcome{}, err
	}
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return execOutcome{}, err
	}
	out, errOut := newCapture(b.s.cfg.MaxOutput), newCapture(b.s.cfg.MaxOutput)
	req := engine.ExecRequest{Args: x.Args, Env: env, Workdir: x.Workdir, Timeout: x.Timeout, Stdout: out, Stderr: errOut}
	if x.Stdin != "" {
		req.Stdin = strings.NewReader(x.Stdin)
	}
	code, err := b.eng.Exec(ctx, sb.ID, req)
	res := execOutcome{runResult: runResult{ExitCode: code}, where: fmt.Sprintf("sandbox %s (image %s)", sb.ShortID(), sb.Image)}
	switch {
	case errors.Is(err, engine.ErrTimeout):
		if ctx.Err() != nil {
			return res, toolError(ctx.Err())
		}
		res.TimedOut = true
	case err != nil && code < 0:
		return res, err
	case err != nil:
		// The command did not start, or its sandbox ended under it:
		// what the engine says goes to stderr with the status.
		fmt.Fprintf(errOut, "%v\n", err)
	}
	res.Stdout, res.Stderr = out.String(), errOut.String()
	res.CutBytes = out.Cut() + errOut.Cut()
	res.missing = code == engine.ExitNotFound && res.Stdout == "" && res.Stderr == ""
	return res, nil
}

func (b *engineBackend) start(ctx context.Context, ref string, x execSpec) (int, error) {
	env, err := envList(x.Env)
	if err != nil {
		return 0, err
	}
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return 0, err
	}
	var out bytes.Buffer
	code, err := b.eng.Exec(ctx, sb.ID, engine.ExecRequest{Args: x.Args, Env: env, Workdir: x.Workdir, Detach: true, Stdout: &out})
	if err != nil {
		return 0, err
	}
	if code != 0 {
		return 0, fmt.Errorf("could not start the command (status %d): %w", code, errdefs.ErrUnknown)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		return 0, fmt.Errorf("started, but its PID %q is unreadable: %w", out.String(), errdefs.ErrUnknown)
	}
	return pid, nil
}

func (b *engineBackend) logs(ctx context.Context, ref string) (string, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := b.eng.Logs(ctx, sb.ID, engine.LogsRequest{Out: &buf}); err != nil {
		return "", err
	}
	return buf.String(), nil
}

func (b *engineBackend) readFile(ctx context.Context, ref, path string, w io.Writer) error {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return err
	}
	fi, err := b.eng.Stat(ctx, sb.ID, path)
	if err != nil {
		return err
	}
	if fi.IsDir {
		return isDirError(path)
	}
	return b.eng.ReadFile(ctx, sb.ID, path, w)
}

func (b *engineBackend) writeFile(ctx context.Context, ref, path string, data []byte, mode fs.FileMode) error {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return err
	}
	owner, err := b.fileOwner(ctx, sb)
	if err != nil {
		return err
	}
	return b.eng.WriteFile(ctx, sb.ID, engine.WriteFileRequest{Path: path, Data: bytes.NewReader(data), Mode: mode, Parents: true, Owner: owner})
}

// fileOwner is the owner of the files write_file creates in sb: the user
// its commands run as (the image's USER), so that they can change them;
// nil for root.
func (b *engineBackend) fileOwner(ctx context.Context, sb *engine.Sandbox) (*engine.Owner, error) {
	name := sb.ImageUser
	if name == "" || name == "root" || name == "0" || name == "0:0" {
		return nil, nil
	}
	uid, gid, numeric := strings.Cut(name, ":")
	if u, err := strconv.ParseUint(uid, 10, 32); err == nil {
		o := &engine.Owner{UID: uint32(u)}
		if numeric {
			g, err := strconv.ParseUint(gid, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("image user %q: bad group: %w", name, errdefs.ErrInvalidArgument)
			}
			o.GID = uint32(g)
		} else {
			o.GID = o.UID
		}
		return o, nil
	}
	u, err := b.eng.LookupUser(ctx, sb.ID, uid)
	if err != nil {
		return nil, err
	}
	return &engine.Owner{UID: u.UID, GID: u.GID}, nil
}

func (b *engineBackend) listDir(ctx context.Context, ref, path string) ([]fileEntry, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	fis, err := b.eng.ReadDir(ctx, sb.ID, path)
	if err != nil {
		return nil, err
	}
	out := []fileEntry{}
	for _, fi := range fis {
		out = append(out, entryOf(fi))
	}
	return out, nil
}

func (b *engineBackend) removeFile(ctx context.Context, ref, path string, recursive bool) error {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return err
	}
	return b.eng.RemoveFile(ctx, sb.ID, path, recursive)
}

func (b *engineBackend) upload(ctx context.Context, ref string, src *os.File, name, path string) error {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return err
	}
	return b.eng.CopyToSandboxFrom(ctx, sb.ID, src, name, path)
}

func (b *engineBackend) download(ctx context.Context, ref, path string, dst hostTarget) error {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return err
	}
	return b.eng.CopyFromSandboxAt(ctx, sb.ID, path, dst.dir, dst.rename)
}

func (b *engineBackend) expose(ctx context.Context, ref string, port, hostPort int) (exposeResult, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return exposeResult{}, err
	}
	if sb.State != engine.StateRunning {
		return exposeResult{}, fmt.Errorf("sandbox %s is %s: only a running sandbox's port can be exposed: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	ls, err := engine.ListenPorts([]engine.PortMapping{{HostIP: "127.0.0.1", HostPort: uint16(hostPort), Port: uint16(port)}})
	if err != nil {
		return exposeResult{}, err
	}
	bound := ls[0].Listener.Addr().(*net.TCPAddr).Port
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(bound))
	fctx, cancel := context.WithCancel(b.ctx)
	b.mu.Lock()
	b.forwards[sb.ID] = append(b.forwards[sb.ID], forward{port: uint16(port), url: url, cancel: cancel})
	b.mu.Unlock()
	go func() {
		defer cancel()
		err := b.eng.Forward(fctx, sb.ID, ls)
		b.s.log.Info("port forward ended", "sandbox", sb.ID, "port", port, "url", url, "err", err)
		b.mu.Lock()
		defer b.mu.Unlock()
		fs := b.forwards[sb.ID]
		for i := range fs {
			if fs[i].url == url {
				b.forwards[sb.ID] = slices.Delete(fs, i, i+1)
				break
			}
		}
		if len(b.forwards[sb.ID]) == 0 {
			delete(b.forwards, sb.ID)
		}
	}()
	return exposeResult{URL: url, HostPort: bound, Port: port}, nil
}

func engineCheckpoint(c engine.CheckpointInfo) checkpointInfo {
	return checkpointInfo{CheckpointID: c.ID, Parent: c.Parent, Message: c.Message, Created: c.Created, SizeBytes: c.Size(), Current: c.Current}
}

func (b *engineBackend) checkpoint(ctx context.Context, ref, message string, keep int) (checkpointInfo, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return checkpointInfo{}, err
	}
	c, err := b.eng.Checkpoint(ctx, sb.ID, engine.CheckpointRequest{Message: message, Keep: keep})
	if err != nil {
		return checkpointInfo{}, err
	}
	return engineCheckpoint(c), nil
}

func (b *engineBackend) checkpoints(ctx context.Context, ref string) ([]checkpointInfo, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	cks, err := b.eng.Checkpoints(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	out := make([]checkpointInfo, 0, len(cks))
	for _, c := range cks {
		out = append(out, engineCheckpoint(c))
	}
	return out, nil
}

func (b *engineBackend) restore(ctx context.Context, ref, ck string) (sandboxInfo, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return sandboxInfo{}, err
	}
	b.stopForwards(sb.ID)
	if sb, err = b.eng.Restore(ctx, sb.ID, ck); err != nil {
		return sandboxInfo{}, err
	}
	return b.info(sb), nil
}

func (b *engineBackend) diffCheckpoints(ctx context.Context, ref, from, to string) ([]changeInfo, error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if to == "" {
		to = engine.CheckpointLive
	}
	chs, err := b.eng.DiffCheckpoints(ctx, sb.ID, from, to)
	if err != nil {
		return nil, err
	}
	out := make([]changeInfo, 0, len(chs))
	for _, c := range chs {
		out = append(out, changeInfo{Kind: c.Kind, Path: c.Path, From: c.From, Type: c.Type})
	}
	return out, nil
}

func (b *engineBackend) code(ctx context.Context, ref string) (*client.Code, func(), error) {
	sb, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	dctx, cancel := context.WithCancel(b.ctx)
	d, err := b.eng.PortDialer(dctx, sb.ID)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	tr := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			c, err := d.Dial(client.CodePort)
			if err != nil {
				return nil, &dialError{err}
			}
			return c, nil
		},
	}
	return &client.Code{BaseURL: "http://sandbox", HTTP: &http.Client{Transport: tr}}, func() {
		tr.CloseIdleConnections()
		d.Close()
		cancel()
	}, nil
}
