package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/filesystempb"
)

// Limits of the watches: WatchDir streams and polling watchers
// (CreateWatcher, GetWatcherEvents). Each holds a process of the agent in
// its sandbox and one on the host.
const (
	// maxWatchers bounds the watches open at once, across tenants; each
	// tenant and each sandbox has its own bound below it (WatchLimits).
	maxWatchers = 1024
	// DefaultTenantWatchers and DefaultSandboxWatchers are the bounds of
	// one tenant's and one sandbox's watches open at once.
	DefaultTenantWatchers  = 128
	DefaultSandboxWatchers = 16
	// maxWatcherEvents bounds the events a watcher keeps between polls;
	// later ones are dropped until the next poll.
	maxWatcherEvents = 10000
	// watcherLinger is how long an ended watcher nobody polls is kept.
	watcherLinger = 10 * time.Minute
)

// keepaliveHeader is the header in which E2B's SDKs ask a streaming call
// for a keepalive message every so many seconds.
const keepaliveHeader = "Keepalive-Ping-Interval"

// WatchLimits bound the watches (WatchDir streams and polling watchers)
// open at once: one tenant's and one sandbox's, so that no tenant can take
// the server's every watch (maxWatchers) from the others. Zero: the
// defaults.
type WatchLimits struct {
	Tenant, Sandbox int
}

// filesystemService is envd's Filesystem service over the engine's files
// API: paths are resolved for the acting user (relative ones against the
// user's home directory), and what it creates belongs to that user.
type filesystemService struct {
	eng    *engine.Engine
	limits WatchLimits

	// mu guards watchers and the counts of the watches open: all of
	// them, by tenant and by sandbox.
	mu        sync.Mutex
	watchers  map[string]*watcher
	open      int
	byTenant  map[string]int
	bySandbox map[string]int
}

// newFilesystemService serves the files of eng's sandboxes.
func newFilesystemService(eng *engine.Engine, limits WatchLimits) *filesystemService {
	if limits.Tenant <= 0 {
		limits.Tenant = DefaultTenantWatchers
	}
	if limits.Sandbox <= 0 {
		limits.Sandbox = DefaultSandboxWatchers
	}
	return &filesystemService{eng: eng, limits: limits, watchers: map[string]*watcher{},
		byTenant: map[string]int{}, bySandbox: map[string]int{}}
}

// takeWatchLocked counts a new watch of t, unless the server, t's tenant
// or t's sandbox has all the watches it may hold open
// (ErrResourceExhausted).
func (s *filesystemService) takeWatchLocked(t target) error {
	s.sweepLocked(time.Now())
	switch {
	case s.open >= maxWatchers:
		return fmt.Errorf("%d watches are open, the most this server keeps: %w", maxWatchers, errdefs.ErrResourceExhausted)
	case s.byTenant[t.Tenant] >= s.limits.Tenant:
		return fmt.Errorf("the tenant has %d watches open (WatchDir streams and watchers), the most it may: remove one first: %w", s.byTenant[t.Tenant], errdefs.ErrResourceExhausted)
	case s.bySandbox[t.SandboxID] >= s.limits.Sandbox:
		return fmt.Errorf("sandbox %s has %d watches open (WatchDir streams and watchers), the most one sandbox may: remove one first: %w", t.SandboxID, s.bySandbox[t.SandboxID], errdefs.ErrResourceExhausted)
	}
	s.open++
	s.byTenant[t.Tenant]++
	s.bySandbox[t.SandboxID]++
	return nil
}

// giveWatchLocked uncounts a watch of t.
func (s *filesystemService) giveWatchLocked(t target) {
	s.open--
	if s.byTenant[t.Tenant]--; s.byTenant[t.Tenant] <= 0 {
		delete(s.byTenant, t.Tenant)
	}
	if s.bySandbox[t.SandboxID]--; s.bySandbox[t.SandboxID] <= 0 {
		delete(s.bySandbox, t.SandboxID)
	}
}

// dropLocked forgets watcher id, which no longer counts.
func (s *filesystemService) dropLocked(id string) {
	if w, ok := s.watchers[id]; ok {
		delete(s.watchers, id)
		s.giveWatchLocked(w.target)
	}
}

// actor is the user a request acts as, in its sandbox.
type actor struct {
	sandboxID string
	user      engine.User
}

func (a actor) owner() *engine.Owner { return &engine.Owner{UID: a.user.UID, GID: a.user.GID} }

// acting is ctx for a file operation that acts as a's user: with its
// permissions, not root's.
func (a actor) acting(ctx context.Context) context.Context {
	return engine.ActingAs(ctx, *a.owner())
}

// actorOf resolves name to a user of the request's sandbox. An unknown
// user is errdefs.ErrUnauthenticated, as envd answers.
func (s *filesystemService) actorOf(ctx context.Context, name string) (actor, error) {
	return lookupActor(ctx, s.eng, targetOf(ctx).SandboxID, name)
}

// lookupActor resolves name to a user of sandbox id. An unknown user is
// errdefs.ErrUnauthenticated, as envd answers.
func lookupActor(ctx context.Context, eng *engine.Engine, id, name string) (actor, error) {
	u, err := eng.LookupUser(ctx, id, name)
	var unknown *engine.UnknownUserError
	if errors.As(err, &unknown) {
		return actor{}, fmt.Errorf("invalid user %q: %w", name, errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return actor{}, err
	}
	return actor{sandboxID: id, user: u}, nil
}

// resolvePath turns a path of a request into an absolute path in the
// sandbox: "~" and a leading "~/" are home, a relative path is relative
// to home, and an empty one is home itself. A ".." component or a NUL is
// refused (errdefs.ErrInvalidArgument), whatever it would resolve to.
// maxPath is the longest path a request may name (Linux's PATH_MAX,
// less its NUL).
const maxPath = 4095

func resolvePath(p, home string) (string, error) {
	if len(p) > maxPath {
		return "", fmt.Errorf("path of %d bytes: longer than %d: %w", len(p), maxPath, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q: contains a NUL byte: %w", p, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", fmt.Errorf("path %q: \"..\" is not allowed: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	rel := p
	switch {
	case path.IsAbs(p):
		return path.Clean(p), nil
	case p == "~" || strings.HasPrefix(p, "~/"):
		rel = p[1:]
	case strings.HasPrefix(p, "~"):
		return "", fmt.Errorf("path %q: only ~ (the acting user's home) can be expanded: %w", p, errdefs.ErrInvalidArgument)
	}
	if !path.IsAbs(home) {
		return "", fmt.Errorf("path %q: relative, and the user's home %q is not absolute: %w", p, home, errdefs.ErrInvalidArgument)
	}
	return path.Join(home, rel), nil
}

// resolve is resolvePath for the actor.
func (a actor) resolve(p string) (string, error) { return resolvePath(p, a.user.Home) }

// entryInfo is envd's description of a file.
func entryInfo(fi engine.FileInfo) *filesystempb.EntryInfo {
	e := &filesystempb.EntryInfo{
		Name:         fi.Name,
		Path:         fi.Path,
		Size:         fi.Size,
		Mode:         uint32(fi.Mode.Perm()),
		Permissions:  fi.Mode.String(),
		Owner:        fi.Owner,
		Group:        fi.Group,
		ModifiedTime: timestamppb.New(fi.ModTime),
		Metadata:     fi.Metadata,
	}
	if e.Owner == "" {
		e.Owner = strconv.FormatUint(uint64(fi.UID), 10)
	}
	if e.Group == "" {
		e.Group = strconv.FormatUint(uint64(fi.GID), 10)
	}
	switch {
	case fi.IsDir:
		e.Type = filesystempb.FileType_FILE_TYPE_DIRECTORY
	case fi.Mode&fs.ModeSymlink != 0:
		e.Type = filesystempb.FileType_FILE_TYPE_SYMLINK
		target := fi.Link
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(fi.Path), target)
		}
		e.SymlinkTarget = &target
	case fi.Mode.IsRegular():
		e.Type = filesystempb.FileType_FILE_TYPE_FILE
	}
	return e
}

// stat describes p (resolved) in the actor's sandbox.
func (s *filesystemService) stat(ctx context.Context, a actor, p string) (*filesystempb.EntryInfo, error) {
	fi, err := s.eng.Stat(a.acting(ctx), a.sandboxID, p)
	if err != nil {
		return nil, err
	}
	return entryInfo(fi), nil
}

// Stat describes a file, directory or symlink (not its target).
func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystempb.StatRequest]) (*connect.Response[filesystempb.StatResponse], error) {
	a, err := s.actorOf(ctx, requestUser(req.Header()))
	if err != nil {
		return nil, connectError(err)
	}
	p, err := a.resolve(req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	e, err := s.stat(ctx, a, p)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystempb.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its missing parents, owned by the
// acting user. An existing directory is AlreadyExists (E2B's SDKs then
// answer false); an existing non-directory is InvalidArgument.
func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystempb.MakeDirRequest]) (*connect.Response[filesystempb.MakeDirResponse], error) {
	a, err := s.actorOf(ctx, requestUser(req.Header()))
	if err != nil {
		return nil, connectError(err)
	}
	p, err := a.resolve(req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	switch fi, err := s.eng.Stat(a.acting(ctx), a.sandboxID, p); {
	case err == nil && fi.IsDir:
		return nil, connectError(fmt.Errorf("directory %s already exists: %w", p, errdefs.ErrAlreadyExists))
	case err == nil:
		return nil, connectError(fmt.Errorf("path %s already exists and is not a directory: %w", p, errdefs.ErrInvalidArgument))
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, connectError(err)
	}
	if err := s.eng.MakeDir(a.acting(ctx), a.sandboxID, engine.MkdirRequest{Path: p, Parents: true, Owner: a.owner()}); err != nil {
		return nil, connectError(err)
	}
	e, err := s.stat(ctx, a, p)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystempb.MakeDirResponse{Entry: e}), nil
}

// Move renames a file or directory, creating the destination's missing
// parents for the acting user.
func (s *filesystemService) Move(ctx context.Context, req *connect.Request[filesystempb.MoveRequest]) (*connect.Response[filesystempb.MoveResponse], error) {
	a, err := s.actorOf(ctx, requestUser(req.Header()))
	if err != nil {
		return nil, connectError(err)
	}
	src, err := a.resolve(req.Msg.GetSource())
	if err != nil {
		return nil, connectError(err)
	}
	dst, err := a.resolve(req.Msg.GetDestination())
	if err != nil {
		return nil, connectError(err)
	}
	if err := s.eng.Move(a.acting(ctx), a.sandboxID, engine.MoveRequest{Source: src, Destination: dst, Owner: a.owner()}); err != nil {
		return nil, connectError(err)
	}
	e, err := s.stat(ctx, a, dst)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystempb.MoveResponse{Entry: e}), nil
}

// maxListDepth bounds ListDir's depth; the engine bounds the listing's
// size (engine.MaxListing).
const maxListDepth = 32

// ListDir lists a directory down to the requested depth (1 if unset, at
// most maxListDepth).
func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystempb.ListDirRequest]) (*connect.Response[filesystempb.ListDirResponse], error) {
	a, err := s.actorOf(ctx, requestUser(req.Header()))
	if err != nil {
		return nil, connectError(err)
	}
	p, err := a.resolve(req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	depth := max(int(req.Msg.GetDepth()), 1)
	if depth > maxListDepth {
		return nil, connectError(fmt.Errorf("depth %d: at most %d: list deeper trees from a subdirectory: %w", req.Msg.GetDepth(), maxListDepth, errdefs.ErrInvalidArgument))
	}
	fis, err := s.eng.ListDir(a.acting(ctx), a.sandboxID, p, depth)
	if err != nil {
		return nil, connectError(err)
	}
	out := &filesystempb.ListDirResponse{Entries: make([]*filesystempb.EntryInfo, 0, len(fis))}
	for _, fi := range fis {
		out.Entries = append(out.Entries, entryInfo(fi))
	}
	return connect.NewResponse(out), nil
}

// Remove removes a file or a directory tree. Like envd, removing what is
// not there is no error.
func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystempb.RemoveRequest]) (*connect.Response[filesystempb.RemoveResponse], error) {
	a, err := s.actorOf(ctx, requestUser(req.Header()))
	if err != nil {
		return nil, connectError(err)
	}
	p, err := a.resolve(req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	if p == "/" {
		return nil, connectError(fmt.Errorf("path %q: refusing to remove the root directory: %w", req.Msg.GetPath(), errdefs.ErrInvalidArgument))
	}
	if err := s.eng.RemoveFile(a.acting(ctx), a.sandboxID, p, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystempb.RemoveResponse{}), nil
}

// eventType maps the engine's change names to envd's event types.
var eventType = map[string]filesystempb.EventType{
	"create": filesystempb.EventType_EVENT_TYPE_CREATE,
	"write":  filesystempb.EventType_EVENT_TYPE_WRITE,
	"remove": filesystempb.EventType_EVENT_TYPE_REMOVE,
	"rename": filesystempb.EventType_EVENT_TYPE_RENAME,
	"chmod":  filesystempb.EventType_EVENT_TYPE_CHMOD,
}

// watchSpec is what a watch observes, from WatchDir or CreateWatcher.
type watchSpec struct {
	dir          string
	recursive    bool
	includeEntry bool
}

// startWatch checks that spec.dir is a directory of the actor's sandbox
// and watches it until ctx ends.
func (s *filesystemService) startWatch(ctx context.Context, a actor, spec watchSpec) (<-chan engine.FileEvent, error) {
	fi, err := s.eng.Stat(a.acting(ctx), a.sandboxID, spec.dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir {
		return nil, fmt.Errorf("path %s is not a directory: %w", spec.dir, errdefs.ErrInvalidArgument)
	}
	return s.eng.Watch(a.acting(ctx), a.sandboxID, engine.WatchRequest{Path: spec.dir, Recursive: spec.recursive})
}

// event turns a change into envd's event: its name is relative to the
// watched directory. ok is false for a change envd does not report.
func (s *filesystemService) event(ctx context.Context, a actor, spec watchSpec, ev engine.FileEvent) (*filesystempb.FilesystemEvent, bool) {
	typ, ok := eventType[ev.Op]
	if !ok {
		return nil, false
	}
	name := ev.Path
	if rel, ok := strings.CutPrefix(ev.Path, strings.TrimSuffix(spec.dir, "/")+"/"); ok {
		name = rel
	} else if ev.Path == spec.dir {
		name = "."
	}
	out := &filesystempb.FilesystemEvent{Name: name, Type: typ}
	if spec.includeEntry && typ != filesystempb.EventType_EVENT_TYPE_REMOVE && typ != filesystempb.EventType_EVENT_TYPE_RENAME {
		if e, err := s.stat(ctx, a, ev.Path); err == nil {
			out.Entry = e
		}
	}
	return out, true
}

// keepaliveInterval is the interval a client asked for in h, or 0.
func keepaliveInterval(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// WatchDir streams a start event, then the changes under a directory
// (recursively if asked) until the client goes away or the sandbox stops.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystempb.WatchDirRequest], stream *connect.ServerStream[filesystempb.WatchDirResponse]) error {
	a, err := s.actorOf(ctx, requestUser(req.Header()))
	if err != nil {
		return connectError(err)
	}
	dir, err := a.resolve(req.Msg.GetPath())
	if err != nil {
		return connectError(err)
	}
	spec := watchSpec{dir: dir, recursive: req.Msg.GetRecursive(), includeEntry: req.Msg.GetIncludeEntry()}
	tg := targetOf(ctx)
	s.mu.Lock()
	err = s.takeWatchLocked(tg)
	s.mu.Unlock()
	if err != nil {
		return connectError(err)
	}
	defer func() {
		s.mu.Lock()
		s.giveWatchLocked(tg)
		s.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := s.startWatch(ctx, a, spec)
	if err != nil {
		return connectError(err)
	}
	// The engine's channel must be drained until it is closed.
	defer func() {
		cancel()
		for range events {
		}
	}()
	start := &filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Start{Start: &filesystempb.WatchDirResponse_StartEvent{}}}
	if err := stream.Send(start); err != nil {
		return err
	}
	var tick <-chan time.Time
	if d := keepaliveInterval(req.Header().Get(keepaliveHeader)); d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return connect.NewError(connect.CodeUnavailable, fmt.Errorf("watch of %s ended: the sandbox stopped", dir))
			}
			fe, ok := s.event(ctx, a, spec, ev)
			if !ok {
				continue
			}
			if err := stream.Send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
				return err
			}
		case <-tick:
			if err := stream.Send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Keepalive{Keepalive: &filesystempb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// watcher is a polling watch: the events since the last poll.
type watcher struct {
	target target
	cancel context.CancelFunc

	// mu guards the fields below.
	mu       sync.Mutex
	events   []*filesystempb.FilesystemEvent
	dropped  int
	ended    bool
	lastPoll time.Time
}

// collect buffers the watch's events until the channel closes.
func (w *watcher) collect(id string, events <-chan engine.FileEvent, convert func(engine.FileEvent) (*filesystempb.FilesystemEvent, bool)) {
	for ev := range events {
		fe, ok := convert(ev)
		if !ok {
			continue
		}
		w.mu.Lock()
		if len(w.events) < maxWatcherEvents {
			w.events = append(w.events, fe)
		} else {
			w.dropped++
		}
		w.mu.Unlock()
	}
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
	slog.Debug("filesystem watcher ended", "watcher", id, "sandbox", w.target.SandboxID)
}

// sweepLocked forgets ended watchers nobody has polled for a while.
func (s *filesystemService) sweepLocked(now time.Time) {
	for id, w := range s.watchers {
		w.mu.Lock()
		stale := w.ended && now.Sub(w.lastPoll) > watcherLinger
		w.mu.Unlock()
		if stale {
			s.dropLocked(id)
		}
	}
}

// CreateWatcher starts a watch whose events are fetched with
// GetWatcherEvents until RemoveWatcher.
func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystempb.CreateWatcherRequest]) (*connect.Response[filesystempb.CreateWatcherResponse], error) {
	a, err := s.actorOf(ctx, requestUser(req.Header()))
	if err != nil {
		return nil, connectError(err)
	}
	dir, err := a.resolve(req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	spec := watchSpec{dir: dir, recursive: req.Msg.GetRecursive(), includeEntry: req.Msg.GetIncludeEntry()}

	tg := targetOf(ctx)
	s.mu.Lock()
	err = s.takeWatchLocked(tg)
	s.mu.Unlock()
	if err != nil {
		return nil, connectError(err)
	}

	// The watch outlives this request: it ends with RemoveWatcher.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	events, err := s.startWatch(wctx, a, spec)
	if err != nil {
		cancel()
		s.mu.Lock()
		s.giveWatchLocked(tg)
		s.mu.Unlock()
		return nil, connectError(err)
	}
	var raw [12]byte
	rand.Read(raw[:]) //nolint:errcheck // never fails
	id := hex.EncodeToString(raw[:])
	w := &watcher{target: tg, cancel: cancel, lastPoll: time.Now()}
	s.mu.Lock()
	s.watchers[id] = w
	s.mu.Unlock()
	go w.collect(id, events, func(ev engine.FileEvent) (*filesystempb.FilesystemEvent, bool) {
		return s.event(wctx, a, spec, ev)
	})
	return connect.NewResponse(&filesystempb.CreateWatcherResponse{WatcherId: id}), nil
}

// watcherOf finds the request's sandbox's watcher id: another sandbox's
// is NotFound, like an unknown one.
func (s *filesystemService) watcherOf(ctx context.Context, id string) (*watcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.watchers[id]
	if !ok || w.target != targetOf(ctx) {
		return nil, fmt.Errorf("watcher %q: %w", id, errdefs.ErrNotFound)
	}
	return w, nil
}

// GetWatcherEvents returns the events since the last call. Once the watch
// has ended (the sandbox stopped), the last events are returned and the
// watcher is gone.
func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystempb.GetWatcherEventsRequest]) (*connect.Response[filesystempb.GetWatcherEventsResponse], error) {
	id := req.Msg.GetWatcherId()
	w, err := s.watcherOf(ctx, id)
	if err != nil {
		return nil, connectError(err)
	}
	w.mu.Lock()
	events, dropped, ended := w.events, w.dropped, w.ended
	w.events, w.dropped, w.lastPoll = nil, 0, time.Now()
	w.mu.Unlock()
	if dropped > 0 {
		slog.Warn("filesystem watcher dropped events between polls", "watcher", id, "sandbox", w.target.SandboxID, "dropped", dropped, "kept", maxWatcherEvents)
	}
	if ended {
		s.mu.Lock()
		s.dropLocked(id)
		s.mu.Unlock()
	}
	if events == nil {
		events = []*filesystempb.FilesystemEvent{}
	}
	return connect.NewResponse(&filesystempb.GetWatcherEventsResponse{Events: events}), nil
}

// RemoveWatcher stops a watcher and forgets it.
func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystempb.RemoveWatcherRequest]) (*connect.Response[filesystempb.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	w, err := s.watcherOf(ctx, id)
	if err != nil {
		return nil, connectError(err)
	}
	s.mu.Lock()
	s.dropLocked(id)
	s.mu.Unlock()
	w.cancel()
	return connect.NewResponse(&filesystempb.RemoveWatcherResponse{}), nil
}

// Close stops every polling watcher.
func (s *filesystemService) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, w := range s.watchers {
		w.cancel()
		s.dropLocked(id)
	}
}
