package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/serve/envdpb/filesystempb"
)

// Work a data-plane call makes the server do is bounded per sandbox and per
// tenant: one tenant holding every filesystem watch it may (polling
// watchers and WatchDir streams) leaves another tenant able to watch, and
// a ListDir deeper than the server lists is refused with a message naming
// the depth.
func TestServeWatchAndListBounds(t *testing.T) {
	requiresRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	watcher := func(sb *client.Sandbox) (string, error) {
		res, err := sb.Filesystem("root").CreateWatcher(ctx, connect.NewRequest(&filesystempb.CreateWatcherRequest{Path: "/tmp"}))
		if err != nil {
			return "", err
		}
		return res.Msg.GetWatcherId(), nil
	}
	// stream opens a WatchDir stream and waits for its start event; it
	// is closed at the end of the test.
	stream := func(sb *client.Sandbox) error {
		sctx, stop := context.WithCancel(ctx)
		st, err := sb.Filesystem("root").WatchDir(sctx, connect.NewRequest(&filesystempb.WatchDirRequest{Path: "/tmp"}))
		if err != nil {
			stop()
			return err
		}
		t.Cleanup(func() { stop(); st.Close() })
		if !st.Receive() {
			return st.Err()
		}
		if st.Msg().GetStart() == nil {
			t.Fatalf("WatchDir's first message: %v, want its start event", st.Msg())
		}
		return nil
	}
	wantExhausted := func(t *testing.T, what string, err error, names string) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), names) {
			t.Errorf("%s: %v, want resource_exhausted naming %q", what, err, names)
		}
	}

	t.Run("a sandbox holds 16 watches at most and other tenants keep theirs", func(t *testing.T) {
		s := newServer(t, "")
		keyA, keyB := s.tenantAdd("watch-a"), s.tenantAdd("watch-b")
		s.serve()
		a := &client.Client{APIURL: s.url(""), APIKey: keyA}
		b := &client.Client{APIURL: s.url(""), APIKey: keyB}
		sa, err := a.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
		if err != nil {
			t.Fatalf("%v\nserver log:\n%s", err, s.logTail(30))
		}
		sb, err := b.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 15 {
			if _, err := watcher(sa); err != nil {
				t.Fatalf("watcher %d: %v\nserver log:\n%s", i+1, err, s.logTail(10))
			}
		}
		if err := stream(sa); err != nil {
			t.Fatalf("a WatchDir stream as the 16th watch: %v", err)
		}
		_, err = watcher(sa)
		wantExhausted(t, "a 17th watcher of one sandbox", err, "16 watches open")
		wantExhausted(t, "a 17th watch of one sandbox, a stream", stream(sa), "16 watches open")
		if _, err := watcher(sb); err != nil {
			t.Errorf("another tenant's watcher: %v", err)
		}
		if err := stream(sb); err != nil {
			t.Errorf("another tenant's WatchDir: %v", err)
		}

		_, err = sa.Filesystem("root").ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: "/", Depth: 1000}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "depth 1000") {
			t.Errorf("ListDir of / to depth 1000: %v, want invalid_argument naming depth 1000", err)
		}
		res, err := sa.Filesystem("root").ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: "/etc", Depth: 32}))
		if err != nil || len(res.Msg.GetEntries()) == 0 {
			t.Errorf("ListDir of /etc to depth 32: %v, %v", res, err)
		}
		s.deleteAllThroughAPI(keyA, keyB)
		s.stopAndCheckClean()
	})

	t.Run("a tenant at --tenant-watchers leaves others room and gets its own back", func(t *testing.T) {
		s := newServer(t, "")
		s.flags = []string{"--tenant-watchers", "3"}
		keyA, keyB := s.tenantAdd("watch-a"), s.tenantAdd("watch-b")
		s.serve()
		a := &client.Client{APIURL: s.url(""), APIKey: keyA}
		b := &client.Client{APIURL: s.url(""), APIKey: keyB}
		var sas []*client.Sandbox
		for range 2 {
			sb, err := a.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
			if err != nil {
				t.Fatal(err)
			}
			sas = append(sas, sb)
		}
		sb, err := b.Create(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		first, err := watcher(sas[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := watcher(sas[0]); err != nil {
			t.Fatal(err)
		}
		if err := stream(sas[1]); err != nil {
			t.Fatal(err)
		}
		_, err = watcher(sas[1])
		wantExhausted(t, "a 4th watch of the tenant", err, "tenant has 3 watches open")
		if _, err := watcher(sb); err != nil {
			t.Errorf("another tenant's watcher: %v", err)
		}
		if err := stream(sb); err != nil {
			t.Errorf("another tenant's WatchDir: %v", err)
		}
		if _, err := sas[0].Filesystem("root").RemoveWatcher(ctx, connect.NewRequest(&filesystempb.RemoveWatcherRequest{WatcherId: first})); err != nil {
			t.Fatal(err)
		}
		if _, err := watcher(sas[1]); err != nil {
			t.Errorf("a watcher once the tenant removed one: %v", err)
		}
		s.deleteAllThroughAPI(keyA, keyB)
		s.stopAndCheckClean()
	})
}
