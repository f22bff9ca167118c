package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// The image labels that make an image a template: a command started in
// every sandbox made from it, and the check that says it is ready. A
// template's sandboxes are restored from a memory checkpoint taken once
// the check passed (docs/templates.md).
const (
	// LabelStart is the start command, run with /bin/sh -c as the
	// image's user.
	LabelStart = "dev.hutch.template.start"
	// LabelReady is the ready check (ParseReadyCheck); without it the
	// template is ready once the start command has run for a second.
	LabelReady = "dev.hutch.template.ready"
	// LabelReadyTimeout bounds the wait for the ready check (a Go
	// duration); default DefaultReadyTimeout.
	LabelReadyTimeout = "dev.hutch.template.ready-timeout"
)

// DefaultReadyTimeout is how long a template's ready check may take to
// pass when its image does not say.
const DefaultReadyTimeout = 2 * time.Minute

// ReadyCheck is how a template's readiness is checked, from the host, in
// its sandbox.
type ReadyCheck struct {
	// Kind is "cmd" (Arg, a shell command, exits 0), "port" (something
	// listens on 127.0.0.1:Arg), "url" (Arg answers 2xx over HTTP),
	// "file" (the path Arg exists) or "time" (Wait has passed).
	Kind string
	Arg  string
	Wait time.Duration
}

func (c ReadyCheck) String() string {
	if c.Kind == "time" {
		return "time:" + c.Wait.String()
	}
	return c.Kind + ":" + c.Arg
}

// ParseReadyCheck parses a ready check: port:PORT, url:http://127.0.0.1:PORT/PATH,
// file:PATH, time:DURATION, cmd:COMMAND, or a plain shell command.
func ParseReadyCheck(s string) (ReadyCheck, error) {
	bad := func(why string) (ReadyCheck, error) {
		return ReadyCheck{}, fmt.Errorf("ready check %q: %s (want port:PORT, url:http://127.0.0.1:PORT/PATH, file:PATH, time:DURATION, or a shell command): %w", s, why, errdefs.ErrInvalidArgument)
	}
	if strings.TrimSpace(s) == "" {
		return bad("empty")
	}
	kind, arg, ok := strings.Cut(s, ":")
	if !ok {
		return ReadyCheck{Kind: "cmd", Arg: s}, nil
	}
	switch kind {
	case "port":
		if p, err := strconv.Atoi(arg); err != nil || p < 1 || p > 65535 {
			return bad("not a port number from 1 to 65535")
		}
	case "url":
		u, err := url.Parse(arg)
		if err != nil || u.Scheme != "http" || u.Port() == "" {
			return bad("not an http:// URL with a port")
		}
		if h := u.Hostname(); h != "127.0.0.1" && h != "localhost" {
			return bad("the URL's host must be 127.0.0.1 or localhost, the sandbox's own")
		}
	case "file":
		if !strings.HasPrefix(arg, "/") {
			return bad("not an absolute path")
		}
	case "time":
		d, err := time.ParseDuration(arg)
		if err != nil || d <= 0 {
			return bad("not a positive duration such as 2s")
		}
		return ReadyCheck{Kind: kind, Wait: d}, nil
	case "cmd":
		if strings.TrimSpace(arg) == "" {
			return bad("empty command")
		}
	default:
		// A command with a colon in it, e.g. "curl -sf http://...".
		return ReadyCheck{Kind: "cmd", Arg: s}, nil
	}
	return ReadyCheck{Kind: kind, Arg: arg}, nil
}

// Template is what an image's labels make of it.
type Template struct {
	Start   string
	Ready   ReadyCheck
	Timeout time.Duration
}

// TemplateOf is the template img's labels describe, or nil if it has no
// start command.
func TemplateOf(img overlay.Image) (*Template, error) {
	labels := img.Config.Config.Labels
	start := labels[LabelStart]
	if start == "" {
		if labels[LabelReady] != "" {
			return nil, fmt.Errorf("image %s: label %s without %s: a template's ready check needs its start command: %w", img.Name, LabelReady, LabelStart, errdefs.ErrInvalidArgument)
		}
		return nil, nil
	}
	t := &Template{Start: start, Ready: ReadyCheck{Kind: "time", Wait: time.Second}, Timeout: DefaultReadyTimeout}
	if r := labels[LabelReady]; r != "" {
		var err error
		if t.Ready, err = ParseReadyCheck(r); err != nil {
			return nil, fmt.Errorf("image %s: label %s: %w", img.Name, LabelReady, err)
		}
	}
	if s := labels[LabelReadyTimeout]; s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("image %s: label %s %q: want a positive duration such as 90s: %w", img.Name, LabelReadyTimeout, s, errdefs.ErrInvalidArgument)
		}
		t.Timeout = d
	}
	return t, nil
}

// templateRecord is a template's stored checkpoint: R/templates/<image
// digest>-<variant>.json. A variant is the runtime's network mode, which
// a restore cannot change: "none" (loopback only) or "linked" (a network
// link, whatever its policy).
type templateRecord struct {
	Image       string        `json:"image"`
	ImageDigest digest.Digest `json:"imageDigest"`
	Variant     string        `json:"variant"`
	Checkpoint  digest.Digest `json:"checkpoint"`
	Built       time.Time     `json:"built"`
	// BuildTime is how long the start command took to be ready.
	BuildTime time.Duration `json:"buildTime"`
}

func templateVariant(linked bool) string {
	if linked {
		return "linked"
	}
	return "none"
}

func (e *Engine) templatesDir() string { return filepath.Join(e.opts.Root, "templates") }

func (e *Engine) templatePath(d digest.Digest, variant string) string {
	return filepath.Join(e.templatesDir(), d.Encoded()+"-"+variant+".json")
}

// TemplateStart says how a sandbox of a template began: restored from
// its checkpoint, or booted cold with the start command, and why.
type TemplateStart struct {
	// Warm: restored from the template's checkpoint.
	Warm bool `json:"warm"`
	// Checkpoint is the template checkpoint it was restored from.
	Checkpoint string `json:"checkpoint,omitempty"`
	// Reason says why a sandbox of a template booted cold.
	Reason string `json:"reason,omitempty"`
	// Built: the template's checkpoint was built by this create.
	Built bool `json:"built,omitempty"`
}

// warmTemplate is the checkpoint a create restores, looked up (or built)
// for its image and variant.
type warmTemplate struct {
	rec templateRecord
	ck  overlay.Checkpoint
	// built: by this create.
	built bool
}

// templateFor is the warm checkpoint of img's template for a sandbox of
// variant, built now if it has none yet (or its image changed); nil if
// img is no template. Concurrent creates build it once.
func (e *Engine) templateFor(ctx context.Context, img overlay.Image, tmpl *Template, variant string) (*warmTemplate, error) {
	path := e.templatePath(img.Digest, variant)
	if w, err := e.openTemplate(ctx, path); err == nil {
		return w, nil
	}
	if err := os.MkdirAll(e.templatesDir(), 0o700); err != nil {
		return nil, err
	}
	// One build at a time, of any template: they are rare, and a lock
	// per template would leave its file behind.
	unlock, err := lockFile(filepath.Join(e.templatesDir(), "build.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if w, err := e.openTemplate(ctx, path); err == nil {
		return w, nil // built by another create meanwhile
	}
	rec, err := e.buildTemplate(ctx, img, tmpl, variant)
	if err != nil {
		return nil, err
	}
	w, err := e.openTemplate(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("template %s: the checkpoint just built: %w", img.Name, err)
	}
	w.built = true
	w.rec = rec
	// The checkpoints of the image's earlier versions serve no create.
	e.pruneTemplates(ctx, img)
	return w, nil
}

// openTemplate reads the template record at path and opens its
// checkpoint, verified.
func (e *Engine) openTemplate(ctx context.Context, path string) (*warmTemplate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	w := &warmTemplate{}
	if err := json.Unmarshal(b, &w.rec); err != nil {
		return nil, fmt.Errorf("template record %s: %w", path, err)
	}
	if w.ck, err = e.images.OpenCheckpoint(ctx, w.rec.Checkpoint); err != nil {
		return nil, err
	}
	return w, nil
}

// BuildTemplate builds the warm checkpoints of image ref's template for
// sandboxes without network and with one, replacing those of earlier
// versions of the image. It fails with the ready check's output when the
// check does not pass in time, and then leaves nothing.
func (e *Engine) BuildTemplate(ctx context.Context, ref string) ([]TemplateStart, error) {
	img, err := e.Image(ctx, ref)
	if err != nil {
		return nil, err
	}
	tmpl, err := TemplateOf(img)
	if err != nil {
		return nil, err
	}
	if tmpl == nil {
		return nil, fmt.Errorf("image %s is no template: it has no %s label (hutch image build --start-cmd): %w", ref, LabelStart, errdefs.ErrInvalidArgument)
	}
	if wantsDocker(img) {
		// Its sandboxes boot cold: the build proves that its start
		// command gets ready.
		if err := e.tryTemplate(ctx, img, tmpl); err != nil {
			return nil, err
		}
		return []TemplateStart{{Reason: dockerColdReason}}, nil
	}
	var out []TemplateStart
	for _, variant := range []string{"none", "linked"} {
		w, err := e.templateFor(ctx, img, tmpl, variant)
		if err != nil {
			return nil, err
		}
		out = append(out, TemplateStart{Warm: true, Checkpoint: w.rec.Checkpoint.String(), Built: w.built})
	}
	e.pruneTemplates(ctx, img)
	return out, nil
}

// buildTemplate boots a sandbox of img, starts the template's command,
// waits for its ready check, and stores a checkpoint of that moment. The
// sandbox is removed whatever happens.
func (e *Engine) buildTemplate(ctx context.Context, img overlay.Image, tmpl *Template, variant string) (templateRecord, error) {
	start := time.Now()
	req := CreateRequest{
		Image: img.Name, Network: policy.NetNone,
		Labels: map[string]string{"dev.hutch.template-build": img.Name},
		noWarm: true,
	}
	if variant == "linked" {
		// A link, with a policy that lets nothing out: the start
		// command runs without network, like the build's RUN steps
		// after the last one.
		req.Network = policy.NetAllow
	}
	sb, err := e.create(ctx, req, nil)
	if err != nil {
		return templateRecord{}, fmt.Errorf("template %s: boot: %w", img.Name, err)
	}
	defer func() {
		if err := e.Remove(context.Background(), sb.ID, true); err != nil {
			log.G(ctx).WithError(err).Warn("remove a template's build sandbox")
		}
	}()
	if err := e.startTemplate(ctx, sb, tmpl); err != nil {
		return templateRecord{}, fmt.Errorf("template %s: %w", img.Name, err)
	}
	ready := time.Since(start)
	ck, err := e.checkpoint(ctx, sb)
	if err != nil {
		return templateRecord{}, fmt.Errorf("template %s: %w", img.Name, err)
	}
	if err := e.images.SealCheckpoint(ctx, ck.Digest); err != nil {
		e.images.RemoveCheckpoint(context.Background(), ck.Digest) //nolint:errcheck // best effort
		return templateRecord{}, err
	}
	rec := templateRecord{Image: img.Name, ImageDigest: img.Digest, Variant: variant, Checkpoint: ck.Digest, Built: time.Now().UTC(), BuildTime: ready}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err == nil {
		err = writeFileAtomic(e.templatePath(img.Digest, variant), b, 0o600)
	}
	if err != nil {
		e.images.RemoveCheckpoint(context.Background(), ck.Digest) //nolint:errcheck // best effort
		return templateRecord{}, err
	}
	log.G(ctx).WithField("image", img.Name).WithField("variant", variant).WithField("ms", ready.Milliseconds()).Info("built a template's checkpoint")
	return rec, nil
}

// tryTemplate boots a sandbox of img, starts the template's command and
// waits for its ready check; the sandbox is removed whatever happens.
func (e *Engine) tryTemplate(ctx context.Context, img overlay.Image, tmpl *Template) error {
	sb, err := e.create(ctx, CreateRequest{
		Image: img.Name, Network: policy.NetNone,
		Labels: map[string]string{"dev.hutch.template-build": img.Name},
		noWarm: true,
	}, nil)
	if err != nil {
		return fmt.Errorf("template %s: boot: %w", img.Name, err)
	}
	defer func() {
		if err := e.Remove(context.Background(), sb.ID, true); err != nil {
			log.G(ctx).WithError(err).Warn("remove a template's trial sandbox")
		}
	}()
	if err := e.startTemplate(ctx, sb, tmpl); err != nil {
		return fmt.Errorf("template %s: %w", img.Name, err)
	}
	return nil
}

// startTemplate starts tmpl's command in sb, detached, as the image's
// user (a Docker sandbox's as root: its daemon's), and waits until its
// ready check passes.
func (e *Engine) startTemplate(ctx context.Context, sb *record, tmpl *Template) error {
	var pid bytes.Buffer
	req := ExecRequest{Args: []string{"/bin/sh", "-c", tmpl.Start}, Detach: true, Stdout: &pid}
	if sb.Docker {
		// As root from the start: gVisor counts a process against the
		// process limit (RLIMIT_NPROC) of the user that started its
		// oldest ancestor, so a daemon started through sudo by the
		// image's user would charge every inner container's process
		// to that user and a fork bomb in one would stop the user's
		// own commands.
		req.User = "0"
	}
	if _, err := e.Exec(ctx, sb.ID, req); err != nil {
		return fmt.Errorf("start command: %w", err)
	}
	return WaitReady(ctx, engineProbe{e, sb}, tmpl)
}

// ReadyProbe runs a template's ready check in one sandbox, wherever it
// is placed.
type ReadyProbe interface {
	// Run runs args in the sandbox as its default user, for at most
	// 10 seconds, and returns its status and output.
	Run(ctx context.Context, args []string) (code int, out string, err error)
	// Dial connects to the sandbox's 127.0.0.1:port.
	Dial(ctx context.Context, port uint16) (net.Conn, error)
	// Log is the start command's output so far.
	Log(ctx context.Context) string
}

// engineProbe is the probe of a sandbox of this engine.
type engineProbe struct {
	e  *Engine
	sb *record
}

func (p engineProbe) Run(ctx context.Context, args []string) (int, string, error) {
	var out bytes.Buffer
	code, err := p.e.Exec(ctx, p.sb.ID, ExecRequest{Args: args, Stdout: &out, Stderr: &out, Timeout: 10 * time.Second})
	if err != nil && code < 0 {
		return code, out.String(), err
	}
	return code, out.String(), nil
}

func (p engineProbe) Dial(ctx context.Context, port uint16) (net.Conn, error) {
	d, err := p.e.PortDialer(ctx, p.sb.ID)
	if err != nil {
		return nil, err
	}
	c, err := d.Dial(port)
	if err != nil {
		d.Close()
		return nil, err
	}
	return closeBoth{c, d}, nil
}

// closeBoth is a connection whose Close also closes its dialer.
type closeBoth struct {
	net.Conn
	d *PortDialer
}

func (c closeBoth) Close() error {
	err := c.Conn.Close()
	c.d.Close()
	return err
}

func (p engineProbe) Log(ctx context.Context) string {
	var logs bytes.Buffer
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	p.e.Logs(lctx, p.sb.ID, LogsRequest{Out: &logs}) //nolint:errcheck // what there is
	return logs.String()
}

// WaitReady polls tmpl's ready check through p until it passes or its
// timeout ends; the error then holds the check's last output and the end
// of the start command's output.
func WaitReady(ctx context.Context, p ReadyProbe, tmpl *Template) error {
	c := tmpl.Ready
	if c.Kind == "time" {
		select {
		case <-time.After(c.Wait):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	deadline := time.Now().Add(tmpl.Timeout)
	var last string
	for attempt := 0; ; attempt++ {
		ok, out := CheckReady(ctx, p, c)
		if ok {
			return nil
		}
		last = out
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(min(50*time.Millisecond*time.Duration(1+attempt/10), 500*time.Millisecond))
	}
	tail := p.Log(ctx)
	if len(tail) > 4096 {
		tail = "..." + tail[len(tail)-4096:]
	}
	return fmt.Errorf("the ready check %s did not pass within %s: %w\nits last output:\n%s\nthe start command's output:\n%s",
		c, tmpl.Timeout, errdefs.ErrFailedPrecondition, strings.TrimSpace(last), strings.TrimSpace(tail))
}

// CheckReady runs check c once through p.
func CheckReady(ctx context.Context, p ReadyProbe, c ReadyCheck) (bool, string) {
	switch c.Kind {
	case "port", "url":
		port := c.Arg
		if c.Kind == "url" {
			u, _ := url.Parse(c.Arg)
			port = u.Port()
		}
		n, _ := strconv.Atoi(port)
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := p.Dial(dctx, uint16(n))
		if err != nil {
			return false, err.Error()
		}
		defer conn.Close()
		if c.Kind == "port" {
			return true, ""
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a failed read says it
		req, _ := http.NewRequest("GET", c.Arg, nil)
		req.Header.Set("Connection", "close")
		if err := req.Write(conn); err != nil {
			return false, err.Error()
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 300, resp.Status + "\n" + string(body)
	}
	args := []string{"/bin/sh", "-c", c.Arg}
	if c.Kind == "file" {
		args = []string{"/bin/sh", "-c", `test -e "$1" || { echo "$1: no such file" >&2; exit 1; }`, "sh", c.Arg}
	}
	code, out, err := p.Run(ctx, args)
	if err != nil {
		return false, err.Error()
	}
	return code == 0, fmt.Sprintf("exit status %d\n%s", code, out)
}

// RemoveImage removes image name, and the checkpoints of its template.
func (e *Engine) RemoveImage(ctx context.Context, name string) error {
	if err := e.images.Remove(ctx, name); err != nil {
		return err
	}
	e.pruneTemplates(ctx, overlay.Image{Name: name})
	return nil
}

// pruneTemplates removes the checkpoints of img's name built from other
// versions of it (all of them, for an image without a digest).
func (e *Engine) pruneTemplates(ctx context.Context, img overlay.Image) {
	ents, err := os.ReadDir(e.templatesDir())
	if err != nil {
		return
	}
	for _, ent := range ents {
		if !strings.HasSuffix(ent.Name(), ".json") || img.Digest != "" && strings.HasPrefix(ent.Name(), img.Digest.Encoded()+"-") {
			continue
		}
		path := filepath.Join(e.templatesDir(), ent.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var rec templateRecord
		if json.Unmarshal(b, &rec) != nil || rec.Image != img.Name {
			continue
		}
		if err := e.images.RemoveCheckpoint(ctx, rec.Checkpoint); err != nil && !errors.Is(err, fs.ErrNotExist) && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).Warn("remove an old template checkpoint")
			continue
		}
		os.Remove(path)
	}
}

// machineIDFile is a sandbox's machine ID, in its state directory,
// bind-mounted read-only as its /etc/machine-id: each sandbox has its own,
// whether it booted or was restored from a template's checkpoint, which
// reads the file of the sandbox it is restored as.
const machineIDFile = "machine-id"

// machineIDMount writes a new random machine ID (as systemd's
// machine-id-setup makes one) to sandbox id's state directory and returns
// the mount that shows it as /etc/machine-id.
func (e *Engine) machineIDMount(id string) (specs.Mount, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return specs.Mount{}, err
	}
	path := filepath.Join(e.sandboxDir(id), machineIDFile)
	if err := writeFileAtomic(path, []byte(hex.EncodeToString(b)+"\n"), 0o444); err != nil {
		return specs.Mount{}, err
	}
	return specs.Mount{Destination: "/etc/machine-id", Type: "bind", Source: path, Options: []string{"rbind", "ro"}}, nil
}

// template looks up the template of img for the create, if img is one:
// the checkpoint launch restores (built now if it has none yet), or why
// the sandbox boots cold with the start command instead. A template
// whose checkpoint cannot be built fails the create.
func (c *creation) template(ctx context.Context, img overlay.Image) error {
	if c.cmd != nil {
		return nil // run --rm: the command is the sandbox's init
	}
	tmpl, err := TemplateOf(img)
	if err != nil || tmpl == nil {
		return err
	}
	c.tmpl = tmpl
	if c.req.noWarm {
		return nil
	}
	switch {
	case len(c.req.Setup) > 0:
		c.coldReason = "setup commands change the image after its template's checkpoint"
	case len(c.req.Mounts) > 0:
		c.coldReason = "volumes and host directories are not in the template's checkpoint"
	case len(c.req.CACerts) > 0:
		c.coldReason = "CA certificates of the create's own are not in the template's checkpoint"
	case len(c.req.Inject) > 0:
		c.coldReason = "the egress gateway's CA of the sandbox's own is not in the template's checkpoint"
	case c.e.rootless:
		c.coldReason = "rootless sandboxes boot their templates cold"
	case c.pr.Docker:
		c.coldReason = dockerColdReason
	}
	if c.coldReason != "" {
		return nil
	}
	start := time.Now()
	c.warm, err = c.e.templateFor(ctx, img, tmpl, templateVariant(c.pr.Network != policy.NetNone))
	phase(ctx, "template: checkpoint opened", start)
	return err
}

// restoreWarm restores the template's checkpoint as the new sandbox,
// from the bundle assemble wrote: its own hostname, machine ID, network
// and mounts, its ID and so its tokens. A
// restore that fails is undone and reported false, with coldReason set,
// for launch to boot the sandbox cold.
func (c *creation) restoreWarm(ctx context.Context, pidFile string, logf *os.File) bool {
	e, sb := c.e, c.sb
	start := time.Now()
	err := e.runscFor(sb).Restore(ctx, sb.ID, c.bundle, c.warm.ck.Dir, runsc.RestoreOpts{
		Detach: true, PidFile: pidFile, Stdout: logf, Stderr: logf,
	})
	start = phase(ctx, "template: runsc restore", start)
	if err == nil {
		err = e.recordProcess(sb, pidFile)
	}
	if err != nil {
		log.G(ctx).WithError(err).Warn("template restore failed: booting cold with the start command")
		r := e.runscFor(sb)
		if derr := r.Delete(context.Background(), sb.ID, true); derr != nil && r.Exists(sb.ID) {
			log.G(ctx).WithError(derr).Warn("remove the failed restore")
		}
		sb.Pid, sb.PidStart = 0, 0
		msg := err.Error()
		if len(msg) > 400 {
			msg = msg[:400] + "..."
		}
		c.warm, c.coldReason = nil, "the restore failed: "+msg
		sb.Template = &TemplateStart{Reason: c.coldReason}
		return false
	}
	sb.Template = &TemplateStart{Warm: true, Checkpoint: c.warm.rec.Checkpoint.String(), Built: c.warm.built}
	return true
}
