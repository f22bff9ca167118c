package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/overlay"
	"hutch.dev/hutch/serve/envdpb/filesystempb/filesystempbconnect"
	"hutch.dev/hutch/serve/placement"
	"hutch.dev/hutch/serve/tenant"
)

// A tenant's own images (its snapshots) are named tenantRepo/TENANT/ID in
// the engine's store; its templateIDs are the ID alone. Images outside
// tenantRepo (base, busybox, what the host's operator built) are shared:
// every tenant may start from them and none may change them.
const tenantRepo = "tenants"

// hostPlacement places sandboxes on this host, through hutch's engine:
// the engine's records are the server's, its labels included.
type hostPlacement struct {
	eng *engine.Engine
	log *slog.Logger
	fs  *filesystemService

	// dialMu guards dialers: one agent session per sandbox for port
	// previews.
	dialMu  sync.Mutex
	dialers map[string]*engine.PortDialer
	// netRate limits what each sandbox with network sends (Config.NetRate).
	netRate int64
	// buildAllow and buildDNS are the network of template builds' steps
	// (Config.BuildAllow).
	buildAllow, buildDNS []string
}

var _ placement.Placement = (*hostPlacement)(nil)

// newHostPlacement places sandboxes with eng, each with a network link
// limited to netRate (0: no limit); its filesystem service keeps watches
// within limits.
func newHostPlacement(eng *engine.Engine, log *slog.Logger, limits WatchLimits, netRate int64) *hostPlacement {
	if log == nil {
		log = slog.Default()
	}
	return &hostPlacement{eng: eng, log: log, fs: newFilesystemService(eng, limits), dialers: map[string]*engine.PortDialer{}, netRate: netRate}
}

// Unsupported: the engine does every call; of a create's fields it
// refuses what hutch has no counterpart for.
func (h *hostPlacement) Unsupported(f placement.Feature, what string) error {
	switch f {
	case placement.FeatureMCP, placement.FeatureIAM:
		return fmt.Errorf("%s is not supported by hutch serve: %w", what, placement.ErrNotImplemented)
	case placement.FeatureMemorylessPause:
		return fmt.Errorf("%s (a filesystem-only pause) is not supported by hutch serve: pauses keep memory: %w", what, placement.ErrNotImplemented)
	}
	return nil
}

func (h *hostPlacement) Get(ctx context.Context, id string) (*engine.Sandbox, error) {
	return h.eng.Get(ctx, id)
}

func (h *hostPlacement) List(ctx context.Context, tenantName string) ([]*engine.Sandbox, error) {
	all, err := h.eng.List(ctx)
	if err != nil || tenantName == "" {
		return all, err
	}
	var out []*engine.Sandbox
	for _, sb := range all {
		if sb.Labels[placement.LabelTenant] == tenantName {
			out = append(out, sb)
		}
	}
	return out, nil
}

// hostCreate is a create the engine checked.
type hostCreate struct{ req engine.CreateRequest }

func (c hostCreate) Usage() tenant.Usage {
	return placement.UsageOf(c.req.CPUs, c.req.Memory, c.req.Disk)
}

// Prepare resolves the template to an image and the volume mounts to
// the tenant's volumes, and keeps what the server knows of the sandbox
// in its labels.
func (h *hostPlacement) Prepare(ctx context.Context, req placement.CreateRequest) (placement.Prepared, error) {
	image, err := h.templateImage(ctx, req.Tenant, req.TemplateID)
	if err != nil {
		return nil, err
	}
	onTimeout := engine.OnTimeoutRemove
	if req.AutoPause {
		onTimeout = engine.OnTimeoutPause
	}
	labels := map[string]string{placement.LabelTenant: req.Tenant, placement.LabelTemplate: req.TemplateID}
	for k, v := range req.Metadata {
		labels[placement.MetaPrefix+k] = v
	}
	if req.Private {
		labels[placement.LabelPrivate] = "true"
	}
	if onTimeout == engine.OnTimeoutPause {
		labels[placement.LabelAutoPause] = "true"
	}
	if req.AutoResume {
		labels[placement.LabelAutoResume] = "true"
	}
	var env []string
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+req.Env[k])
	}
	mounts, vlabel, err := h.volumeMounts(ctx, req.Tenant, req.VolumeMounts)
	if err != nil {
		return nil, err
	}
	if vlabel != "" {
		labels[placement.LabelVolumes] = vlabel
	}
	creq := engine.CreateRequest{
		Image: image, Network: req.Network, Allow: req.Allow, Env: env, Labels: labels,
		Timeout: req.Timeout, OnTimeout: onTimeout, Mounts: mounts,
	}
	if req.Timeout == 0 {
		creq.OnTimeout = ""
	}
	if req.Network != "none" {
		creq.NetRate = h.netRate
	}
	if err := h.eng.ValidateCreate(creq); err != nil {
		return nil, err
	}
	return hostCreate{creq}, nil
}

// Create makes the sandbox; one that matches a warm pool is taken from
// it (docs/usage.md).
func (h *hostPlacement) Create(ctx context.Context, p placement.Prepared) (*engine.Sandbox, error) {
	c, ok := p.(hostCreate)
	if !ok {
		return nil, fmt.Errorf("create: not prepared by this backend: %w", errdefs.ErrInvalidArgument)
	}
	return h.eng.Create(ctx, c.req)
}

func (h *hostPlacement) Remove(ctx context.Context, id string) error {
	return h.eng.Remove(ctx, id, true)
}

func (h *hostPlacement) Pause(ctx context.Context, sb *engine.Sandbox) error {
	_, err := h.eng.Pause(ctx, sb.ID)
	return err
}

func (h *hostPlacement) Resume(ctx context.Context, id string) (*engine.Sandbox, error) {
	return h.eng.Resume(ctx, id)
}

func (h *hostPlacement) SetTimeout(ctx context.Context, id string, d time.Duration) (*engine.Sandbox, error) {
	return h.eng.SetTimeout(ctx, id, d, "")
}

// SetTokenGeneration keeps the generation in the engine's record, among
// the sandbox's labels.
func (h *hostPlacement) SetTokenGeneration(ctx context.Context, id string, gen uint64) (*engine.Sandbox, error) {
	return h.eng.SetLabels(ctx, id, map[string]string{placement.LabelTokenGeneration: strconv.FormatUint(gen, 10)})
}

// Fork forks in the engine, then gives each fork its lifetime. A fork
// inherits the parent's labels, tenant and metadata included; its tokens
// are its own (they derive from its ID).
func (h *hostPlacement) Fork(ctx context.Context, parent *engine.Sandbox, count int, timeout time.Duration) ([]placement.Forked, error) {
	kids, err := h.eng.Fork(ctx, parent.ID, engine.ForkRequest{Count: count})
	if err != nil {
		return nil, err
	}
	return h.lifetimes(ctx, kids, timeout), nil
}

// lifetimes gives each fork in kids its lifetime.
func (h *hostPlacement) lifetimes(ctx context.Context, kids []*engine.Sandbox, timeout time.Duration) []placement.Forked {
	out := make([]placement.Forked, 0, len(kids))
	for _, kid := range kids {
		onTimeout := engine.OnTimeoutRemove
		if kid.Labels[placement.LabelAutoPause] == "true" {
			onTimeout = engine.OnTimeoutPause
		}
		kid, err := h.eng.SetTimeout(ctx, kid.ID, timeout, onTimeout)
		out = append(out, placement.Forked{Sandbox: kid, Err: err})
	}
	return out
}

func (h *hostPlacement) UpdateNetwork(ctx context.Context, id, mode string, allow []string) error {
	_, err := h.eng.Update(ctx, id, engine.UpdateRequest{Network: &mode, Allow: &allow})
	return err
}

func (h *hostPlacement) Stats(ctx context.Context, id string) (*engine.Stats, error) {
	return h.eng.Stats(ctx, id)
}

func (h *hostPlacement) Logs(ctx context.Context, id string, w io.Writer) error {
	return h.eng.Logs(ctx, id, engine.LogsRequest{Out: w})
}

// tenantImage is the engine's name of tenant's own image id.
func tenantImage(tenantName, id string) string {
	return tenantRepo + "/" + tenantName + "/" + id
}

// templateImage resolves a create's templateID for tenant: the tenant's
// own image of that name, else a shared one.
func (h *hostPlacement) templateImage(ctx context.Context, tenantName, id string) (string, error) {
	own := tenantImage(tenantName, id)
	if _, err := h.eng.Images().Get(ctx, own); err == nil {
		return own, nil
	}
	norm, err := overlay.ParseName(id)
	if err != nil {
		return "", err
	}
	// The default and test images are made on first use.
	if norm == engine.DefaultImage || norm == engine.TestImage {
		return norm, nil
	}
	if _, err := h.eng.Images().Get(ctx, norm); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return "", fmt.Errorf("template %q not found: %w", id, errdefs.ErrNotFound)
		}
		return "", err
	}
	return norm, nil
}

func (h *hostPlacement) CheckSnapshotName(tenantName, name string) error { return nil }

func (h *hostPlacement) HasSnapshot(ctx context.Context, tenantName, name string) (bool, error) {
	_, err := h.eng.Images().Get(ctx, tenantImage(tenantName, name))
	return err == nil, nil
}

// Snapshot makes the sandbox an image of the tenant's.
func (h *hostPlacement) Snapshot(ctx context.Context, id, tenantName, name string) error {
	_, err := h.eng.Snapshot(ctx, id, engine.SnapshotRequest{Name: tenantImage(tenantName, name)})
	return err
}

// tenantImages are tenant's own images by templateID.
func (h *hostPlacement) tenantImages(ctx context.Context, tenantName string) (map[string]overlay.Image, error) {
	all, err := h.eng.Images().List(ctx)
	if err != nil {
		return nil, err
	}
	prefix := tenantImage(tenantName, "")
	out := map[string]overlay.Image{}
	for _, img := range all {
		if id, ok := strings.CutPrefix(img.Name, prefix); ok {
			out[strings.TrimSuffix(id, ":"+overlay.DefaultTag)] = img
		}
	}
	return out, nil
}

// SnapshotsUsage counts the tenant's own images; each takes the disk of
// the layer its snapshot added, its last (the ones below are its
// template's: shared, or another snapshot's, counted there). The store
// keeps a layer once, however many images hold it.
func (h *hostPlacement) SnapshotsUsage(ctx context.Context, tenantName string) (tenant.Usage, error) {
	imgs, err := h.tenantImages(ctx, tenantName)
	if err != nil {
		return tenant.Usage{}, err
	}
	var u tenant.Usage
	seen := map[string]bool{}
	for _, img := range imgs {
		u.Snapshots++
		if n := len(img.Layers); n > 0 && !seen[img.Layers[n-1].Digest.String()] {
			seen[img.Layers[n-1].Digest.String()] = true
			u.Disk += img.Layers[n-1].Size
		}
	}
	return u, nil
}

func (h *hostPlacement) ListSnapshots(ctx context.Context, tenantName, sandboxID, name string) ([]string, error) {
	imgs, err := h.tenantImages(ctx, tenantName)
	if err != nil {
		return nil, err
	}
	var out []string
	for id, img := range imgs {
		if name != "" && id != name {
			continue
		}
		if img.Config.Config.Labels[labelBuild] != "" {
			continue // a template built from code, not a snapshot
		}
		if sandboxID != "" && !snapshotOf(img, sandboxID) {
			continue
		}
		out = append(out, id)
	}
	return out, nil
}

// snapshotOf tells whether img is a snapshot of sandbox id: the engine
// records "hutch snapshot SHORTID" as its last history entry.
func snapshotOf(img overlay.Image, id string) bool {
	h := img.Config.History
	if len(h) == 0 || len(id) < 12 {
		return false
	}
	return strings.HasSuffix(h[len(h)-1].CreatedBy, " "+id[:12])
}

// ListTemplates are the tenant's own images and the shared ones. A
// template that builds made is one entry whatever its tags (E2B lists a
// template once): its latest build, else its most recently tagged.
func (h *hostPlacement) ListTemplates(ctx context.Context, tenantName string) ([]placement.Template, error) {
	all, err := h.eng.Images().List(ctx)
	if err != nil {
		return nil, err
	}
	own := tenantImage(tenantName, "")
	var out []placement.Template
	// built are the entries of templates builds made, by name: the
	// entry's index in out, whether it is the latest tag, and when its
	// tag was assigned.
	type entry struct {
		i      int
		latest bool
		tagged time.Time
	}
	built := map[string]entry{}
	for _, img := range all {
		id := img.Name
		public := true
		if rest, ok := strings.CutPrefix(img.Name, own); ok {
			id, public = rest, false
		} else if strings.HasPrefix(img.Name, tenantRepo+"/") {
			continue
		}
		id = strings.TrimSuffix(id, ":"+overlay.DefaultTag)
		t := placement.Template{ID: id, BuildID: img.Digest.Encoded()[:12], Public: public, Created: img.Created}
		if public || img.Config.Config.Labels[labelBuild] == "" {
			out = append(out, t)
			continue
		}
		name, tag, _ := strings.Cut(id, ":")
		t.ID, t.BuildID = name, buildIDOf(img)
		e, ok := built[name]
		switch {
		case !ok:
			built[name] = entry{i: len(out), latest: tag == "", tagged: img.Tagged}
			out = append(out, t)
		case e.latest:
		case tag == "" || img.Tagged.After(e.tagged):
			out[e.i] = t
			built[name] = entry{i: e.i, latest: tag == "", tagged: img.Tagged}
		}
	}
	return out, nil
}

// DeleteTemplate removes one of the tenant's own images (a snapshot);
// shared images cannot be removed through the API.
func (h *hostPlacement) DeleteTemplate(ctx context.Context, tenantName, id string) error {
	name := tenantImage(tenantName, id)
	if _, err := h.eng.Images().Get(ctx, name); err != nil {
		return fmt.Errorf("template %q not found: %w", id, errdefs.ErrNotFound)
	}
	return h.eng.RemoveImage(ctx, name)
}

// DialPort connects with the backend's one dialer for the sandbox, made
// on first use.
func (h *hostPlacement) DialPort(ctx context.Context, id string, port uint16) (net.Conn, error) {
	h.dialMu.Lock()
	d, ok := h.dialers[id]
	if !ok {
		var err error
		if d, err = h.eng.PortDialer(ctx, id); err != nil {
			h.dialMu.Unlock()
			return nil, err
		}
		h.dialers[id] = d
	}
	h.dialMu.Unlock()
	c, err := d.Dial(port)
	if err != nil {
		// The sandbox may have been paused and resumed (a new
		// control socket, a new agent): drop the dialer so the next
		// request makes another.
		h.dialMu.Lock()
		if h.dialers[id] == d {
			delete(h.dialers, id)
		}
		h.dialMu.Unlock()
		d.Close()
	}
	return c, err
}

func (h *hostPlacement) Processes() placement.Processes { return hostProcesses(h.eng) }

// hostProcesses runs envd's commands with eng: supervised, in the
// sandbox's users' names.
func hostProcesses(eng *engine.Engine) placement.Processes {
	return placement.Processes{
		Start: func(ctx context.Context, id string, req engine.ExecRequest) (placement.Command, error) {
			return eng.Start(ctx, id, req)
		},
		Supervise: func(ctx context.Context, id string) (placement.Supervisor, error) {
			sv, err := eng.Supervisor(ctx, id)
			if err != nil {
				return nil, err
			}
			return engineSupervisor{sv}, nil
		},
		Stat: func(ctx context.Context, id, path string) error {
			_, err := eng.Stat(ctx, id, path)
			return err
		},
		Home: func(ctx context.Context, id, user string) (string, error) {
			u, err := eng.LookupUser(ctx, id, user)
			return u.Home, err
		},
	}
}

func (h *hostPlacement) Filesystem() filesystempbconnect.FilesystemHandler { return h.fs }

// Files acts as the user the request names, else as its own user; an
// unknown user is errdefs.ErrUnauthenticated, as envd answers.
func (h *hostPlacement) Files(ctx context.Context, id string, u placement.FileUser) (placement.Files, error) {
	name := u.Named
	if name == "" {
		name = u.Default
	}
	a, err := lookupActor(ctx, h.eng, id, name)
	if err != nil {
		return nil, err
	}
	return hostFiles{eng: h.eng, a: a}, nil
}

// hostFiles are a sandbox's files as an actor reaches them, with the
// actor's permissions; what it writes is the actor's.
type hostFiles struct {
	eng *engine.Engine
	a   actor
}

func (f hostFiles) Home(context.Context) (string, error) { return f.a.user.Home, nil }

func (f hostFiles) Read(ctx context.Context, path string, w io.Writer) error {
	return f.eng.ReadFile(f.a.acting(ctx), f.a.sandboxID, path, w)
}

// Write writes the file as the actor. Its missing parents are made as
// envd makes them: by root, then given to the actor, so that a user may
// upload into a directory that does not exist yet wherever it lies (as
// E2B's default user may); what exists already is left as it is, and
// the file itself is written with the actor's permissions.
func (f hostFiles) Write(ctx context.Context, p string, data io.Reader, meta map[string]string) (map[string]string, error) {
	if dir := path.Dir(p); dir != "/" {
		if _, err := f.eng.Stat(ctx, f.a.sandboxID, dir); errors.Is(err, errdefs.ErrNotFound) {
			err = f.eng.MakeDir(ctx, f.a.sandboxID, engine.MkdirRequest{Path: dir, Mode: 0o755, Parents: true, Owner: f.a.owner()})
			if err != nil && !errors.Is(err, errdefs.ErrAlreadyExists) {
				return nil, err
			}
		}
	}
	if meta == nil {
		meta = map[string]string{}
	}
	fi, err := f.eng.WriteFileInfo(f.a.acting(ctx), f.a.sandboxID, engine.WriteFileRequest{Path: p, Data: data, Parents: true, Owner: f.a.owner(), Metadata: meta})
	return fi.Metadata, err
}

func (f hostFiles) NamesDownloads() bool { return true }

// Forget closes the sandbox's port dialer.
func (h *hostPlacement) Forget(id string) {
	h.dialMu.Lock()
	if d, ok := h.dialers[id]; ok {
		d.Close()
		delete(h.dialers, id)
	}
	h.dialMu.Unlock()
}

// sweepInterval is how often the server removes its dead sandboxes.
const sweepInterval = 30 * time.Second

func (h *hostPlacement) SweepInterval() time.Duration { return sweepInterval }

// Recover removes the server's sandboxes that a killed server left
// half-created and those that stopped (an E2B sandbox that is neither
// running nor paused is gone). Running and paused sandboxes are adopted
// as they are: everything the server knows of them is in the engine's
// records.
//
// A sandbox is removed only if it looks dead twice, recheck apart: a
// sandbox that a pause (of the server's or of its lifetime watchdog) is
// checkpointing looks stopped for a moment.
func (h *hostPlacement) Recover(ctx context.Context, recheck time.Duration, forget func(id string)) (removed int, err error) {
	seen, err := h.deadSandboxes(ctx)
	if err != nil || len(seen) == 0 {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(recheck):
	}
	now, err := h.deadSandboxes(ctx)
	if err != nil {
		return 0, err
	}
	for _, sb := range now {
		if _, ok := seen[sb.ID]; !ok {
			continue
		}
		forget(sb.ID)
		if err := h.eng.Remove(ctx, sb.ID, true); err != nil {
			h.log.Warn("remove dead sandbox", "sandbox", sb.ID, "err", err)
			continue
		}
		removed++
		h.log.Info("removed dead sandbox", "sandbox", sb.ID, "tenant", sb.Labels[placement.LabelTenant], "state", sb.State)
	}
	return removed, nil
}

// deadSandboxes are the server's sandboxes that are dead now, by ID.
func (h *hostPlacement) deadSandboxes(ctx context.Context) (map[string]*engine.Sandbox, error) {
	all, err := h.eng.List(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]*engine.Sandbox{}
	for _, sb := range all {
		if sb.Labels[placement.LabelTenant] != "" && dead(sb) {
			out[sb.ID] = sb
		}
	}
	return out, nil
}

// dead reports whether sb is of no more use: stopped, or left half-made
// by a create or fork whose process died.
func dead(sb *engine.Sandbox) bool {
	return sb.State == engine.StateStopped || sb.Abandoned()
}

// Close ends the filesystem service's watchers and the port dialers.
func (h *hostPlacement) Close() error {
	h.fs.Close()
	h.dialMu.Lock()
	for id, d := range h.dialers {
		d.Close()
		delete(h.dialers, id)
	}
	h.dialMu.Unlock()
	return nil
}
