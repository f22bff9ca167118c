package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"

	"hutch.dev/hutch/client"
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

func (b *remoteBackend) code(ctx context.Context, ref string) (*client.Code, func(), error) {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	return box.sb.Code(), func() {}, nil
}
