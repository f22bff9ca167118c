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
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/serve/envdpb/filesystempb"
)

// remoteBackend runs the tools on a remote `hutch serve` through its Go
// client, as one of its tenants: sandboxes carry the server's owner in
// their OwnerLabel metadata, their lifetime is the server's timeout (they
// are removed when it ends), and ports are reached through the server.
type remoteBackend struct {
	s *Server
	c *client.Client

	// ctx bounds the output streams of background processes; close
	// cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex // guards the fields below
	// boxes are the data-plane handles of sandboxes by ID.
	boxes map[string]*remoteBox
	// output is the output lines of the background processes this
	// server started, by sandbox ID.
	output map[string][]string
}

// remoteBox is what the server knows of a remote sandbox.
type remoteBox struct {
	sb *client.Sandbox
	// user is the user its commands and files act as.
	user    string
	network string
	allow   []string
}

// remoteUser is the user the tools act as in a remote sandbox. The data
// plane acts as a user it is told, "user" by default, and cannot tell an
// image's USER: root can do in any image what the tools do on the engine
// (write_file creates missing parents anywhere, as there).
const remoteUser = "root"

// maxProcessLog is how many lines of background output are kept per
// sandbox.
const maxProcessLog = 5000

// logTime is the timestamp format of log lines.
const logTime = "2006-01-02T15:04:05.000000Z07:00"

func newRemoteBackend(s *Server, c *client.Client) *remoteBackend {
	b := &remoteBackend{s: s, c: c, boxes: map[string]*remoteBox{}, output: map[string][]string{}}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b
}

func (b *remoteBackend) close() { b.cancel() }

// err says what the server's answer err means for a model.
func (b *remoteBackend) err(err error) error {
	if err == nil {
		return nil
	}
	var ce *client.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case client.IsUnauthenticated(err):
		return fmt.Errorf("the hutch server at %s refused the API key (%v): check `hutch mcp --api-key` or $E2B_API_KEY: %w", b.c.APIURL, err, errdefs.ErrUnauthenticated)
	case errors.As(err, &ce):
		return fmt.Errorf("the hutch server at %s answered %d: %s: %w", b.c.APIURL, ce.Status, ce.Message, statusError(ce.Status))
	}
	var ue *url.Error
	var ne *net.OpError
	if errors.As(err, &ue) || errors.As(err, &ne) {
		return fmt.Errorf("cannot reach the hutch server at %s: %w: %w", b.c.APIURL, err, errdefs.ErrUnavailable)
	}
	if connect.CodeOf(err) == connect.CodeUnauthenticated {
		return fmt.Errorf("the hutch server at %s refused the call: %w: %w", b.c.APIURL, err, errdefs.ErrUnauthenticated)
	}
	return err
}

// statusError is the errdefs sentinel of an HTTP status.
func statusError(status int) error {
	switch status {
	case http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	case http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusConflict:
		return errdefs.ErrFailedPrecondition
	case http.StatusTooManyRequests:
		return errdefs.ErrResourceExhausted
	case http.StatusNotImplemented:
		return errdefs.ErrNotImplemented
	}
	return errdefs.ErrUnknown
}

// sandbox resolves ref to a sandbox of the tenant that the server
// manages.
func (b *remoteBackend) sandbox(ctx context.Context, ref string) (*client.Info, error) {
	if err := checkRef(ref); err != nil {
		return nil, err
	}
	in, err := b.c.Get(ctx, ref)
	if client.IsNotFound(err) || (err == nil && !b.s.manages(in.Metadata)) {
		return nil, unknownSandbox(ref)
	}
	if err != nil {
		return nil, b.err(err)
	}
	return in, nil
}

// running resolves ref to a running sandbox and its data-plane handle.
// A paused one is an error, as on the engine, though the server would
// resume it.
func (b *remoteBackend) running(ctx context.Context, ref string) (*client.Info, *remoteBox, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if in.State != "running" {
		return nil, nil, fmt.Errorf("sandbox %s is %s: resume it with resume_sandbox first: %w", in.SandboxID, in.State, errdefs.ErrFailedPrecondition)
	}
	b.mu.Lock()
	box := b.boxes[in.SandboxID]
	b.mu.Unlock()
	if box == nil {
		// A sandbox of a server before this one: connecting gives its
		// access token, leaving its lifetime as it is.
		keep := max(time.Until(in.EndAt).Round(time.Second), time.Second)
		sb, err := b.c.Connect(ctx, in.SandboxID, keep)
		if err != nil {
			return nil, nil, b.err(err)
		}
		box = &remoteBox{sb: sb, user: remoteUser}
		b.mu.Lock()
		b.boxes[in.SandboxID] = box
		b.mu.Unlock()
	}
	return in, box, nil
}

func (b *remoteBackend) info(in *client.Info) sandboxInfo {
	out := sandboxInfo{SandboxID: in.SandboxID, Image: in.TemplateID, State: in.State, Created: in.StartedAt}
	if in.State == "running" && !in.EndAt.IsZero() {
		out.ExpiresAt = in.EndAt.UTC().Format(time.RFC3339)
	}
	b.mu.Lock()
	if box := b.boxes[in.SandboxID]; box != nil {
		out.Network, out.Allow = box.network, box.allow
	}
	b.mu.Unlock()
	return out
}

// remoteCreate renders a for the server. The server's templates set a
// sandbox's size, and it has no names.
func (b *remoteBackend) remoteCreate(a createArgs) (client.CreateRequest, error) {
	for name, set := range map[string]bool{"cpus": a.CPUs != 0, "memory_mb": a.MemoryMB != 0, "name": a.Name != ""} {
		if set {
			return client.CreateRequest{}, fmt.Errorf("%s is not supported by this server's sandboxes (it runs them on the remote hutch server at %s, whose templates set their size and which names them by ID): leave it out: %w", name, b.c.APIURL, errdefs.ErrNotImplemented)
		}
	}
	req := client.CreateRequest{
		TemplateID: a.Image,
		Metadata:   map[string]string{OwnerLabel: b.s.cfg.Owner},
		EnvVars:    a.Env,
		Timeout:    int(b.s.cfg.DefaultLifetime / time.Second),
	}
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	if a.LifetimeSecond > 0 {
		req.Timeout = int(a.LifetimeSecond)
	}
	open := a.Network == "open"
	req.AllowInternetAccess = &open
	if a.Network == "allow" {
		req.Network = &client.Network{AllowOut: a.Allow, DenyOut: []string{"0.0.0.0/0"}}
	}
	return req, nil
}

func (b *remoteBackend) create(ctx context.Context, a createArgs) (sandboxInfo, error) {
	req, err := b.remoteCreate(a)
	if err != nil {
		return sandboxInfo{}, err
	}
	sb, err := b.c.Create(ctx, req)
	if err != nil {
		return sandboxInfo{}, b.err(err)
	}
	network := a.Network
	if network == "" {
		network = "none"
	}
	b.mu.Lock()
	b.boxes[sb.ID] = &remoteBox{sb: sb, user: remoteUser, network: network, allow: a.Allow}
	b.mu.Unlock()
	b.s.log.Info("created sandbox", "id", sb.ID, "template", req.TemplateID, "network", network, "server", b.c.APIURL)
	in, err := b.c.Get(ctx, sb.ID)
	if err != nil {
		return sandboxInfo{}, b.err(err)
	}
	return b.info(in), nil
}

func (b *remoteBackend) list(ctx context.Context) ([]sandboxInfo, error) {
	o := client.ListOptions{}
	if !b.s.cfg.AllSandboxes {
		o.Metadata = map[string]string{OwnerLabel: b.s.cfg.Owner}
	}
	all, err := b.c.List(ctx, o)
	if err != nil {
		return nil, b.err(err)
	}
	out := []sandboxInfo{}
	for i := range all {
		if b.s.manages(all[i].Metadata) {
			out = append(out, b.info(&all[i]))
		}
	}
	slices.SortFunc(out, func(x, y sandboxInfo) int { return x.Created.Compare(y.Created) })
	return out, nil
}

// forget drops what the server keeps of sandbox id.
func (b *remoteBackend) forget(id string) {
	b.mu.Lock()
	delete(b.boxes, id)
	delete(b.output, id)
	b.mu.Unlock()
}

func (b *remoteBackend) remove(ctx context.Context, ref string) error {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return err
	}
	if err := b.c.Kill(ctx, in.SandboxID); err != nil && !client.IsNotFound(err) {
		return b.err(err)
	}
	b.forget(in.SandboxID)
	b.s.log.Info("removed sandbox", "id", in.SandboxID)
	return nil
}

func (b *remoteBackend) pause(ctx context.Context, ref string) (sandboxInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return sandboxInfo{}, err
	}
	if err := b.c.Pause(ctx, in.SandboxID); err != nil {
		return sandboxInfo{}, b.err(err)
	}
	if in, err = b.c.Get(ctx, in.SandboxID); err != nil {
		return sandboxInfo{}, b.err(err)
	}
	return b.info(in), nil
}

func (b *remoteBackend) resume(ctx context.Context, ref string) (sandboxInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return sandboxInfo{}, err
	}
	sb, err := b.c.Connect(ctx, in.SandboxID, b.s.cfg.DefaultLifetime)
	if err != nil {
		return sandboxInfo{}, b.err(err)
	}
	b.mu.Lock()
	if box := b.boxes[sb.ID]; box != nil {
		box.sb = sb
	} else {
		b.boxes[sb.ID] = &remoteBox{sb: sb, user: remoteUser}
	}
	b.mu.Unlock()
	if in, err = b.c.Get(ctx, in.SandboxID); err != nil {
		return sandboxInfo{}, b.err(err)
	}
	return b.info(in), nil
}

func (b *remoteBackend) snapshot(ctx context.Context, ref, name string) (snapshotResult, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return snapshotResult{}, err
	}
	id, err := b.c.Snapshot(ctx, in.SandboxID, name)
	if err != nil {
		return snapshotResult{}, b.err(err)
	}
	return snapshotResult{Image: id}, nil
}

// exitTimedOut is the exit code of a command killed at its timeout.
const exitTimedOut = 124

func (b *remoteBackend) exec(ctx context.Context, ref string, x execSpec) (execOutcome, error) {
	in, box, err := b.running(ctx, ref)
	if err != nil {
		return execOutcome{}, err
	}
	out, errOut := newCapture(b.s.cfg.MaxOutput), newCapture(b.s.cfg.MaxOutput)
	req := client.ExecRequest{Cmd: x.Args[0], Args: x.Args[1:], Envs: x.Env, Cwd: x.Workdir, User: box.user, Stdout: out, Stderr: errOut}
	if x.Stdin != "" {
		req.Stdin = strings.NewReader(x.Stdin)
	}
	res := execOutcome{where: fmt.Sprintf("sandbox %s (image %s)", in.SandboxID, in.TemplateID)}
	// The stream lives past the timeout, to see the end of the kill.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd, err := box.sb.Start(sctx, req)
	if err != nil {
		return res, b.err(err)
	}
	timer := time.NewTimer(x.Timeout)
	defer timer.Stop()
	select {
	case <-cmd.Done():
	case <-timer.C:
		res.TimedOut = true
		kctx, kcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer kcancel()
		if err := cmd.Kill(kctx); err != nil {
			b.s.log.Info("killing a timed-out command", "sandbox", in.SandboxID, "pid", cmd.Pid, "err", err)
		}
		select {
		case <-cmd.Done():
		case <-kctx.Done():
		}
	case <-ctx.Done():
		kctx, kcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer kcancel()
		cmd.Kill(kctx) //nolint:errcheck // best effort: the call is gone
		return res, toolError(ctx.Err())
	}
	if res.TimedOut {
		res.ExitCode = exitTimedOut
	} else {
		r, err := cmd.Wait(ctx)
		if err != nil {
			return res, b.err(err)
		}
		res.ExitCode = r.ExitCode
	}
	res.Stdout, res.Stderr = out.String(), errOut.String()
	res.CutBytes = out.Cut() + errOut.Cut()
	res.missing = res.ExitCode == 127 && res.Stdout == "" && (res.Stderr == "" || res.Stderr == x.Args[0]+": command not found\n")
	return res, nil
}

// procWriter turns a background process's output into log lines
// "TIMESTAMP PID TEXT" of its sandbox.
type procWriter struct {
	b     *remoteBackend
	id    string
	ready chan struct{} // closed once pid is set
	pid   int
	mu    sync.Mutex // guards part
	part  []byte
}

func (w *procWriter) Write(p []byte) (int, error) {
	<-w.ready
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.part[:i]))
		w.part = w.part[i+1:]
	}
	return len(p), nil
}

// flush logs an unfinished last line.
func (w *procWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.part) > 0 {
		w.line(string(w.part))
		w.part = nil
	}
}

func (w *procWriter) line(text string) {
	l := time.Now().UTC().Format(logTime) + " " + strconv.Itoa(w.pid) + " " + text
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	log := append(w.b.output[w.id], l)
	if len(log) > maxProcessLog {
		log = log[len(log)-maxProcessLog:]
	}
	w.b.output[w.id] = log
}

func (b *remoteBackend) start(ctx context.Context, ref string, x execSpec) (int, error) {
	in, box, err := b.running(ctx, ref)
	if err != nil {
		return 0, err
	}
	w := &procWriter{b: b, id: in.SandboxID, ready: make(chan struct{})}
	// Its output is read for as long as this server runs: the stream
	// outlives the call.
	cmd, err := box.sb.Start(b.ctx, client.ExecRequest{Cmd: x.Args[0], Args: x.Args[1:], Envs: x.Env, Cwd: x.Workdir, User: box.user, Stdout: w, Stderr: w})
	if err != nil {
		return 0, b.err(err)
	}
	w.pid = cmd.Pid
	close(w.ready)
	go func() {
		<-cmd.Done()
		w.flush()
	}()
	return cmd.Pid, nil
}

func (b *remoteBackend) logs(ctx context.Context, ref string) (string, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return "", err
	}
	server, err := b.c.Logs(ctx, in.SandboxID, maxProcessLog)
	if err != nil {
		return "", b.err(err)
	}
	var lines []string
	for _, l := range server {
		if l.Timestamp.IsZero() {
			lines = append(lines, l.Line)
			continue
		}
		lines = append(lines, l.Timestamp.UTC().Format(logTime)+" "+l.Line)
	}
	b.mu.Lock()
	lines = append(lines, b.output[in.SandboxID]...)
	b.mu.Unlock()
	// Both kinds start with a timestamp of one width: they sort as text.
	slices.SortStableFunc(lines, func(x, y string) int {
		tx, _, _ := strings.Cut(x, " ")
		ty, _, _ := strings.Cut(y, " ")
		return strings.Compare(tx, ty)
	})
	if len(lines) == 0 {
		return "", nil
	}
	return strings.Join(lines, "\n") + "\n", nil
}

// stat describes path in the sandbox.
func (b *remoteBackend) stat(ctx context.Context, box *remoteBox, p string) (*filesystempb.EntryInfo, error) {
	res, err := box.sb.Filesystem(box.user).Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: p}))
	if err != nil {
		return nil, b.err(err)
	}
	return res.Msg.GetEntry(), nil
}

func (b *remoteBackend) readFile(ctx context.Context, ref, p string, w io.Writer) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	e, err := b.stat(ctx, box, p)
	if err != nil {
		return err
	}
	if e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY {
		return isDirError(p)
	}
	return b.err(box.sb.ReadFile(ctx, p, w, box.user))
}

func (b *remoteBackend) writeFile(ctx context.Context, ref, p string, data []byte, mode fs.FileMode) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	if err := box.sb.WriteFile(ctx, p, bytes.NewReader(data), box.user); err != nil {
		return b.err(err)
	}
	if mode == 0o644 {
		return nil
	}
	r, err := box.sb.Start(ctx, client.ExecRequest{Cmd: "chmod", Args: []string{fmt.Sprintf("%o", mode), p}, User: box.user})
	if err == nil {
		var res *client.Result
		if res, err = r.Wait(ctx); err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("chmod %o %s: exit status %d: %s: %w", mode, p, res.ExitCode, strings.TrimSpace(res.Stderr), errdefs.ErrUnknown)
		}
	}
	return b.err(err)
}

func (b *remoteBackend) listDir(ctx context.Context, ref, p string) ([]fileEntry, error) {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	res, err := box.sb.Filesystem(box.user).ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: p, Depth: 1}))
	if err != nil {
		return nil, b.err(err)
	}
	out := []fileEntry{}
	for _, e := range res.Msg.GetEntries() {
		out = append(out, remoteEntry(e))
	}
	slices.SortFunc(out, func(x, y fileEntry) int { return strings.Compare(x.Name, y.Name) })
	return out, nil
}

func remoteEntry(e *filesystempb.EntryInfo) fileEntry {
	f := fileEntry{Name: e.GetName(), Size: e.GetSize(), Mode: fmt.Sprintf("%04o", e.GetMode()&0o777), Link: e.GetSymlinkTarget()}
	if t := e.GetModifiedTime(); t != nil {
		f.ModTime = t.AsTime().UTC()
	}
	switch e.GetType() {
	case filesystempb.FileType_FILE_TYPE_DIRECTORY:
		f.Type = "dir"
	case filesystempb.FileType_FILE_TYPE_SYMLINK:
		f.Type = "symlink"
	case filesystempb.FileType_FILE_TYPE_FILE:
		f.Type = "file"
	default:
		f.Type = "other"
	}
	return f
}

func (b *remoteBackend) removeFile(ctx context.Context, ref, p string, recursive bool) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	e, err := b.stat(ctx, box, p)
	if err != nil {
		return err
	}
	fsc := box.sb.Filesystem(box.user)
	if e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY && !recursive {
		l, err := fsc.ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: p, Depth: 1}))
		if err != nil {
			return b.err(err)
		}
		if len(l.Msg.GetEntries()) > 0 {
			return fmt.Errorf("directory %s is not empty: pass recursive true to remove it and everything in it: %w", p, errdefs.ErrFailedPrecondition)
		}
	}
	_, err = fsc.Remove(ctx, connect.NewRequest(&filesystempb.RemoveRequest{Path: p}))
	return b.err(err)
}

// noDirs is the error for a directory transfer, which the server's file
// API does not do.
func noDirs(p string) error {
	return fmt.Errorf("%s is a directory: with a remote hutch server files are copied one at a time (archive a directory with tar in the sandbox, or on the host, first): %w", p, errdefs.ErrNotImplemented)
}

func (b *remoteBackend) upload(ctx context.Context, ref string, src *os.File, name, p string) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return noDirs(src.Name())
	}
	if e, err := b.stat(ctx, box, p); err == nil && e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY {
		p = path.Join(p, name)
	}
	return b.err(box.sb.WriteFile(ctx, p, src, box.user))
}

func (b *remoteBackend) download(ctx context.Context, ref, p string, dst hostTarget) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	e, err := b.stat(ctx, box, p)
	if err != nil {
		return err
	}
	if e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY {
		return noDirs(p)
	}
	name := dst.rename
	if name == "" {
		name = path.Base(p)
	}
	f, err := createIn(dst.dir, name)
	if err != nil {
		return err
	}
	if err := box.sb.ReadFile(ctx, p, f, box.user); err != nil {
		f.Close()
		return b.err(err)
	}
	return f.Close()
}

// createIn creates the file name in the open directory dir, as
// archive.Extract does a file entry: what is at name is replaced, a
// symlink removed rather than written through, a directory refused.
func createIn(dir *os.File, name string) (*os.File, error) {
	full := filepath.Join(dir.Name(), name)
	create := func() (int, error) {
		return unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	}
	fd, err := create()
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err = unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				err = unix.EISDIR
			} else if err = unix.Unlinkat(int(dir.Fd()), name, 0); err == nil {
				fd, err = create()
			}
		}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "create", Path: full, Err: err}
	}
	return os.NewFile(uintptr(fd), full), nil
}

func (b *remoteBackend) expose(ctx context.Context, ref string, port, hostPort int) (exposeResult, error) {
	if hostPort != 0 {
		return exposeResult{}, fmt.Errorf("host_port: a remote hutch server serves the port at its own address: leave host_port out: %w", errdefs.ErrInvalidArgument)
	}
	in, box, err := b.running(ctx, ref)
	if err != nil {
		return exposeResult{}, err
	}
	api, err := url.Parse(b.c.APIURL)
	if err != nil {
		return exposeResult{}, fmt.Errorf("server URL %q: %w", b.c.APIURL, err)
	}
	data := b.c.SandboxURL
	if data == "" {
		data = b.c.APIURL
	}
	headers := map[string]string{"E2b-Sandbox-Id": in.SandboxID, "E2b-Sandbox-Port": strconv.Itoa(port)}
	res := exposeResult{Port: port}
	if box.sb.Domain == "" {
		res.URL = strings.TrimRight(data, "/")
		res.Headers = headers
		res.Note = "The server names no domain for sandbox hosts: a request to url reaches the port only with the headers given."
		return res, nil
	}
	host := strconv.Itoa(port) + "-" + in.SandboxID + "." + box.sb.Domain
	if p := api.Port(); p != "" {
		host = net.JoinHostPort(host, p)
	}
	res.URL = api.Scheme + "://" + host
	res.Headers = headers
	res.Note = fmt.Sprintf("url works where *.%s resolves to the hutch server; elsewhere, send the request to %s with the headers given.", box.sb.Domain, strings.TrimRight(data, "/"))
	return res, nil
}

func remoteCheckpoint(c client.Checkpoint) checkpointInfo {
	return checkpointInfo{CheckpointID: c.CheckpointID, Parent: c.ParentID, Message: c.Message, Created: c.CreatedAt, SizeBytes: c.SizeBytes, Current: c.Current}
}

func (b *remoteBackend) checkpoint(ctx context.Context, ref, message string, keep int) (checkpointInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return checkpointInfo{}, err
	}
	c, err := b.c.Checkpoint(ctx, in.SandboxID, message, keep)
	if err != nil {
		return checkpointInfo{}, b.err(err)
	}
	return remoteCheckpoint(*c), nil
}

func (b *remoteBackend) checkpoints(ctx context.Context, ref string) ([]checkpointInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	cks, err := b.c.Checkpoints(ctx, in.SandboxID)
	if err != nil {
		return nil, b.err(err)
	}
	out := make([]checkpointInfo, 0, len(cks))
	for _, c := range cks {
		out = append(out, remoteCheckpoint(c))
	}
	return out, nil
}

func (b *remoteBackend) restore(ctx context.Context, ref, ck string) (sandboxInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return sandboxInfo{}, err
	}
	if _, err := b.c.Restore(ctx, in.SandboxID, ck); err != nil {
		return sandboxInfo{}, b.err(err)
	}
	if in, err = b.c.Get(ctx, in.SandboxID); err != nil {
		return sandboxInfo{}, b.err(err)
	}
	return b.info(in), nil
}

func (b *remoteBackend) diffCheckpoints(ctx context.Context, ref, from, to string) ([]changeInfo, error) {
	in, err := b.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if to == "" {
		to = client.CheckpointLive
	}
	chs, err := b.c.DiffCheckpoints(ctx, in.SandboxID, from, to)
	if err != nil {
		return nil, b.err(err)
	}
	out := make([]changeInfo, 0, len(chs))
	for _, c := range chs {
		out = append(out, changeInfo{Kind: c.Kind, Path: c.Path, From: c.From, Type: c.Type})
	}
	return out, nil
}

func (b *remoteBackend) code(ctx context.Context, ref string) (*client.Code, func(), error) {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	return box.sb.Code(), func() {}, nil
}
