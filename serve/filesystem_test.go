package serve

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/filesystempb"
)

func TestResolvePath(t *testing.T) {
	for _, tc := range []struct {
		in, home, want string
		bad            bool
	}{
		{in: "/etc/passwd", home: "/home/user", want: "/etc/passwd"},
		{in: "/tmp//a/./b/", home: "/home/user", want: "/tmp/a/b"},
		{in: "hello.txt", home: "/home/user", want: "/home/user/hello.txt"},
		{in: "a/b/c", home: "/root", want: "/root/a/b/c"},
		{in: "./x", home: "/home/user", want: "/home/user/x"},
		{in: "", home: "/home/user", want: "/home/user"},
		{in: "~", home: "/home/user", want: "/home/user"},
		{in: "~/", home: "/home/user", want: "/home/user"},
		{in: "~/docs/a.md", home: "/home/user", want: "/home/user/docs/a.md"},
		{in: "~//", home: "/home/user", want: "/home/user"},
		{in: "~//etc", home: "/home/user", want: "/home/user/etc"},
		{in: "/", home: "/home/user", want: "/"},
		{in: "a~b", home: "/root", want: "/root/a~b"},
		{in: "~other/x", home: "/home/user", bad: true},
		{in: "../etc/passwd", home: "/home/user", bad: true},
		{in: "/home/user/../../etc/shadow", home: "/home/user", bad: true},
		{in: "a/..", home: "/home/user", bad: true},
		{in: "~/..", home: "/home/user", bad: true},
		{in: "a\x00b", home: "/home/user", bad: true},
		{in: "rel", home: "", bad: true},
		{in: "..foo/bar..", home: "/root", want: "/root/..foo/bar.."},
	} {
		got, err := resolvePath(tc.in, tc.home)
		if tc.bad {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("resolvePath(%q, %q) = %q, %v; want an invalid-argument error", tc.in, tc.home, got, err)
			} else if !strings.Contains(err.Error(), "path") {
				t.Errorf("resolvePath(%q): error %q does not name the path", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("resolvePath(%q, %q) = %q, %v; want %q", tc.in, tc.home, got, err, tc.want)
		}
	}
}

func TestResolvePathErrorNamesPath(t *testing.T) {
	_, err := resolvePath("../secret", "/home/user")
	if err == nil || !strings.Contains(err.Error(), `"../secret"`) {
		t.Fatalf("error %v does not quote the path asked for", err)
	}
	if ce := connectError(err); connect.CodeOf(ce) != connect.CodeInvalidArgument {
		t.Fatalf("connect code %v, want invalid_argument", connect.CodeOf(ce))
	}
	if httpStatus(err) != 400 {
		t.Fatalf("HTTP status %d, want 400", httpStatus(err))
	}
}

func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"", "~", "~/a", "a/../b", "/x/./y", "..", "a\x00", "~x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := resolvePath(in, "/home/user")
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("resolvePath(%q): %v is not an invalid-argument error", in, err)
			}
			return
		}
		if !path.IsAbs(got) || path.Clean(got) != got || strings.ContainsRune(got, 0) {
			t.Fatalf("resolvePath(%q) = %q: not a clean absolute path", in, got)
		}
		for _, c := range strings.Split(in, "/") {
			if c == ".." {
				t.Fatalf("resolvePath(%q) = %q: a \"..\" component got through", in, got)
			}
		}
		if !strings.HasPrefix(in, "/") && !strings.HasPrefix(got, "/home/user") {
			t.Fatalf("resolvePath(%q) = %q: a relative path left the home directory", in, got)
		}
	})
}

func TestEntryInfo(t *testing.T) {
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)
	file := entryInfo(engine.FileInfo{Name: "a.txt", Path: "/home/user/a.txt", Size: 12, Mode: 0o640, ModTime: mtime, UID: 1000, GID: 1000, Owner: "user", Group: "user"})
	if file.Type != filesystempb.FileType_FILE_TYPE_FILE || file.Name != "a.txt" || file.Path != "/home/user/a.txt" ||
		file.Size != 12 || file.Mode != 0o640 || file.Permissions != "-rw-r-----" || file.Owner != "user" || file.Group != "user" ||
		!file.ModifiedTime.AsTime().Equal(mtime) || file.SymlinkTarget != nil {
		t.Errorf("file: %v", file)
	}
	dir := entryInfo(engine.FileInfo{Name: "d", Path: "/d", Mode: fs.ModeDir | 0o755, IsDir: true, UID: 5, GID: 6})
	if dir.Type != filesystempb.FileType_FILE_TYPE_DIRECTORY || dir.Permissions != "drwxr-xr-x" || dir.Mode != 0o755 {
		t.Errorf("dir: %v", dir)
	}
	if dir.Owner != "5" || dir.Group != "6" {
		t.Errorf("owner without a name: %q:%q, want the IDs", dir.Owner, dir.Group)
	}
	rel := entryInfo(engine.FileInfo{Name: "l", Path: "/home/user/l", Mode: fs.ModeSymlink | 0o777, Link: "sub/target"})
	if rel.Type != filesystempb.FileType_FILE_TYPE_SYMLINK || rel.GetSymlinkTarget() != "/home/user/sub/target" {
		t.Errorf("relative symlink: %v", rel)
	}
	abs := entryInfo(engine.FileInfo{Name: "l", Path: "/x/l", Mode: fs.ModeSymlink | 0o777, Link: "/etc/hosts"})
	if abs.GetSymlinkTarget() != "/etc/hosts" {
		t.Errorf("absolute symlink: %v", abs)
	}
	dev := entryInfo(engine.FileInfo{Name: "null", Path: "/dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666})
	if dev.Type != filesystempb.FileType_FILE_TYPE_UNSPECIFIED {
		t.Errorf("device: type %v, want unspecified (the SDKs skip it)", dev.Type)
	}
}

func TestKeepaliveInterval(t *testing.T) {
	for in, want := range map[string]time.Duration{"50": 50 * time.Second, " 5 ": 5 * time.Second, "": 0, "0": 0, "-3": 0, "x": 0} {
		if got := keepaliveInterval(in); got != want {
			t.Errorf("keepaliveInterval(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestEventNames(t *testing.T) {
	s := newFilesystemService(nil, WatchLimits{})
	for _, tc := range []struct {
		dir, path, op, name string
		typ                 filesystempb.EventType
	}{
		{"/home/user", "/home/user/a.txt", "create", "a.txt", filesystempb.EventType_EVENT_TYPE_CREATE},
		{"/home/user", "/home/user/sub/b", "write", "sub/b", filesystempb.EventType_EVENT_TYPE_WRITE},
		{"/", "/etc", "remove", "etc", filesystempb.EventType_EVENT_TYPE_REMOVE},
		{"/tmp", "/tmp", "chmod", ".", filesystempb.EventType_EVENT_TYPE_CHMOD},
		{"/tmp", "/tmp/x", "rename", "x", filesystempb.EventType_EVENT_TYPE_RENAME},
	} {
		ev, ok := s.event(context.Background(), actor{}, watchSpec{dir: tc.dir}, engine.FileEvent{Path: tc.path, Op: tc.op})
		if !ok || ev.Name != tc.name || ev.Type != tc.typ || ev.Entry != nil {
			t.Errorf("event(%s in %s, %s) = %v, %v; want %q %v", tc.path, tc.dir, tc.op, ev, ok, tc.name, tc.typ)
		}
	}
	if _, ok := s.event(context.Background(), actor{}, watchSpec{dir: "/"}, engine.FileEvent{Path: "/a", Op: "ready"}); ok {
		t.Error("an unknown change was reported")
	}
}

// addWatcher puts a watcher fed by events into s's table, as CreateWatcher
// does once the engine's watch is in place.
func addWatcher(s *filesystemService, id string, tg target, events <-chan engine.FileEvent) (*watcher, <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{target: tg, cancel: cancel, lastPoll: time.Now()}
	s.mu.Lock()
	if err := s.takeWatchLocked(tg); err != nil {
		panic(err)
	}
	s.watchers[id] = w
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.collect(id, events, func(ev engine.FileEvent) (*filesystempb.FilesystemEvent, bool) {
			return s.event(ctx, actor{}, watchSpec{dir: "/w"}, ev)
		})
	}()
	return w, done
}

func poll(t *testing.T, s *filesystemService, tg target, id string) ([]*filesystempb.FilesystemEvent, error) {
	t.Helper()
	res, err := s.GetWatcherEvents(withTarget(context.Background(), tg), connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Events, nil
}

func TestWatcherTable(t *testing.T) {
	s := newFilesystemService(nil, WatchLimits{})
	mine := target{Tenant: "t1", SandboxID: "sb1"}
	events := make(chan engine.FileEvent)
	w, done := addWatcher(s, "w1", mine, events)

	events <- engine.FileEvent{Path: "/w/a", Op: "create"}
	events <- engine.FileEvent{Path: "/w/a", Op: "write"}
	// collect has taken both once the third send is accepted.
	events <- engine.FileEvent{Path: "/w/b", Op: "ready"}
	got, err := poll(t, s, mine, "w1")
	if err != nil || len(got) != 2 || got[0].Name != "a" || got[0].Type != filesystempb.EventType_EVENT_TYPE_CREATE || got[1].Type != filesystempb.EventType_EVENT_TYPE_WRITE {
		t.Fatalf("first poll: %v, %v", got, err)
	}
	if got, err := poll(t, s, mine, "w1"); err != nil || len(got) != 0 {
		t.Fatalf("a second poll returned events again: %v, %v", got, err)
	}

	// Another tenant's request, or another sandbox's, does not find it.
	for _, other := range []target{{Tenant: "t2", SandboxID: "sb1"}, {Tenant: "t1", SandboxID: "sb2"}} {
		if _, err := poll(t, s, other, "w1"); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("poll from %+v: %v, want not_found", other, err)
		}
		_, err := s.RemoveWatcher(withTarget(context.Background(), other), connect.NewRequest(&filesystempb.RemoveWatcherRequest{WatcherId: "w1"}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("remove from %+v: %v, want not_found", other, err)
		}
	}

	// Events past the bound are dropped, not kept.
	for i := 0; i < maxWatcherEvents+10; i++ {
		events <- engine.FileEvent{Path: "/w/f", Op: "write"}
	}
	events <- engine.FileEvent{Path: "/w/b", Op: "ready"}
	if got, _ := poll(t, s, mine, "w1"); len(got) != maxWatcherEvents {
		t.Fatalf("kept %d events between polls, want the bound %d", len(got), maxWatcherEvents)
	}

	// When the watch ends, the last events are returned once, then the
	// watcher is gone.
	events <- engine.FileEvent{Path: "/w/last", Op: "remove"}
	close(events)
	<-done
	if got, err := poll(t, s, mine, "w1"); err != nil || len(got) != 1 || got[0].Name != "last" {
		t.Fatalf("poll after the end: %v, %v", got, err)
	}
	if _, err := poll(t, s, mine, "w1"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("poll of an ended watcher: %v, want not_found", err)
	}
	_ = w
}

func TestRemoveWatcherStopsWatch(t *testing.T) {
	s := newFilesystemService(nil, WatchLimits{})
	tg := target{Tenant: "t", SandboxID: "sb"}
	w, _ := addWatcher(s, "w", tg, make(chan engine.FileEvent))
	stopped := make(chan struct{})
	cancel := w.cancel
	w.cancel = func() { cancel(); close(stopped) }
	if _, err := s.RemoveWatcher(withTarget(context.Background(), tg), connect.NewRequest(&filesystempb.RemoveWatcherRequest{WatcherId: "w"})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("RemoveWatcher did not stop the watch")
	}
	if _, err := poll(t, s, tg, "w"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("poll of a removed watcher: %v, want not_found", err)
	}
}

func TestSweepForgetsStaleEndedWatchers(t *testing.T) {
	s := newFilesystemService(nil, WatchLimits{})
	now := time.Now()
	s.watchers["ended-old"] = &watcher{ended: true, lastPoll: now.Add(-2 * watcherLinger), cancel: func() {}}
	s.watchers["ended-new"] = &watcher{ended: true, lastPoll: now, cancel: func() {}}
	s.watchers["running-old"] = &watcher{lastPoll: now.Add(-2 * watcherLinger), cancel: func() {}}
	s.mu.Lock()
	s.sweepLocked(now)
	s.mu.Unlock()
	if _, ok := s.watchers["ended-old"]; ok {
		t.Error("an ended watcher nobody polls was kept")
	}
	if len(s.watchers) != 2 {
		t.Errorf("watchers left: %d, want 2", len(s.watchers))
	}
}

// Watches are bounded per sandbox and per tenant below the server's bound,
// so that one tenant holding all it may leaves others room; a watch given
// back makes room again.
func TestWatchLimits(t *testing.T) {
	s := newFilesystemService(nil, WatchLimits{Tenant: 3, Sandbox: 2})
	take := func(tenant, sb string) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.takeWatchLocked(target{Tenant: tenant, SandboxID: sb})
	}
	for _, c := range []struct {
		tenant, sb string
		want       string // "" = taken
	}{
		{"a", "a1", ""}, {"a", "a1", ""},
		{"a", "a1", "sandbox a1 has 2 watches open"},
		{"a", "a2", ""},
		{"a", "a3", "the tenant has 3 watches open"},
		{"b", "b1", ""}, {"b", "b1", ""},
	} {
		err := take(c.tenant, c.sb)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errdefs.IsResourceExhausted(err)) {
			t.Errorf("watch of %s in %s: %v, want %q", c.tenant, c.sb, err, c.want)
		}
	}
	s.mu.Lock()
	s.giveWatchLocked(target{Tenant: "a", SandboxID: "a1"})
	s.mu.Unlock()
	if err := take("a", "a3"); err != nil {
		t.Errorf("a watch after one was given back: %v", err)
	}
	s = newFilesystemService(nil, WatchLimits{Tenant: maxWatchers + 1, Sandbox: maxWatchers + 1})
	for i := range maxWatchers {
		if err := take("a", "a1"); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	if err := take("b", "b1"); err == nil || !strings.Contains(err.Error(), "the most this server keeps") {
		t.Errorf("a watch past the server's bound: %v", err)
	}
}
