package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"hutch.dev/hutch/engine"
)

// engine opens the Go API on the CLI's state root: what a platform
// embedding hutch does.
func (e *env) engine() *engine.Engine {
	e.t.Helper()
	log.SetLevel("error") //nolint:errcheck // a valid level
	eng, err := engine.Open(engine.Options{
		Root:                e.root,
		RunscPath:           filepath.Join(e.bin, "runsc"),
		InitPath:            filepath.Join(e.bin, "hutch-init"),
		DefaultImageArchive: filepath.Join(e.bin, "images", "busybox.tar"),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return eng
}

func TestFilesAPI(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	eng := e.engine()
	ctx := context.Background()

	// Write and read back a 5 MiB file, streamed both ways.
	data := make([]byte, 5<<20)
	rand.Read(data)
	if err := eng.WriteFile(ctx, id, engine.WriteFileRequest{Path: "/root/blob", Data: bytes.NewReader(data), Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if err := eng.ReadFile(ctx, id, "/root/blob", &got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("read back %d bytes, not the %d written", got.Len(), len(data))
	}
	fi, err := eng.Stat(ctx, id, "/root/blob")
	if err != nil || fi.Size != int64(len(data)) || fi.Mode.Perm() != 0o600 || fi.IsDir || fi.Name != "blob" {
		t.Fatalf("stat /root/blob: %+v %v", fi, err)
	}
	// The sandbox's own tools see the same file.
	if out := e.ok("exec", id, "--", "stat", "-c", "%s %a", "/root/blob"); out != "5242880 600\n" {
		t.Fatalf("stat inside: %q", out)
	}

	// Directories.
	if err := eng.Mkdir(ctx, id, "/root/a/b", 0o750, true); err != nil {
		t.Fatal(err)
	}
	if err := eng.Mkdir(ctx, id, "/root/a/b", 0, false); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("mkdir of an existing directory: %v", err)
	}
	if err := eng.WriteFile(ctx, id, engine.WriteFileRequest{Path: "/root/a/b/f", Data: strings.NewReader("x")}); err != nil {
		t.Fatal(err)
	}
	if err := eng.WriteFile(ctx, id, engine.WriteFileRequest{Path: "/tmp/in-tmpfs", Data: strings.NewReader("t")}); err != nil {
		t.Fatal(err)
	}
	ents, err := eng.ReadDir(ctx, id, "/root")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, fi := range ents {
		names = append(names, fi.Name)
		if fi.Name == "a" && (!fi.IsDir || fi.Mode.Perm() != 0o750) {
			t.Fatalf("/root/a: %+v", fi)
		}
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "a blob" {
		t.Fatalf("ReadDir /root: %v", names)
	}

	// Remove: a non-empty directory only when recursive.
	if err := eng.RemoveFile(ctx, id, "/root/a", false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("rm of a non-empty directory: %v", err)
	}
	if err := eng.RemoveFile(ctx, id, "/root/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Stat(ctx, id, "/root/a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat after rm: %v", err)
	}

	// Errors say what went wrong.
	if err := eng.ReadFile(ctx, id, "/no/such", &got); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("read of a missing file: %v", err)
	}
	if err := eng.ReadFile(ctx, id, "/root", &got); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("read of a directory: %v", err)
	}
	if _, err := eng.Stat(ctx, id, "/root/../etc"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a path with ..: %v", err)
	}
}

func TestFilesWatch(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	eng := e.engine()
	e.ok("exec", id, "--", "mkdir", "/root/w")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := eng.Watch(ctx, id, engine.WatchRequest{Path: "/root/w", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	e.ok("exec", id, "--", "sh", "-c", "echo 1 > /root/w/f && mkdir /root/w/sub")
	// A directory created after the watch started is watched too, once
	// its create event is seen.
	want := []FileEventKey{{"/root/w/f", "create"}, {"/root/w/f", "write"}, {"/root/w/sub", "create"}}
	seen := collectEvents(t, events, want)
	e.ok("exec", id, "--", "sh", "-c", "echo 2 > /root/w/sub/g && rm /root/w/f")
	want = []FileEventKey{{"/root/w/sub/g", "create"}, {"/root/w/f", "remove"}}
	seen = append(seen, collectEvents(t, events, want)...)
	t.Logf("events: %v", seen)

	cancel()
	deadline := time.After(30 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-events:
		case <-deadline:
			t.Fatal("the event channel was not closed after cancel")
		}
	}
	// The watching agent is gone with it.
	var ps []struct{ Cmd string }
	if err := json.Unmarshal([]byte(e.ok("ps", "--format", "json", id)), &ps); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if strings.Contains(p.Cmd, "watch") {
			t.Fatalf("a watch process outlived its context: %+v", ps)
		}
	}
}

type FileEventKey struct{ Path, Op string }

// collectEvents reads events until every one of want has been seen.
func collectEvents(t *testing.T, events <-chan engine.FileEvent, want []FileEventKey) []FileEventKey {
	t.Helper()
	missing := map[FileEventKey]bool{}
	for _, w := range want {
		missing[w] = true
	}
	var seen []FileEventKey
	deadline := time.After(30 * time.Second)
	for len(missing) > 0 {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("event channel closed; seen %v, missing %v", seen, missing)
			}
			k := FileEventKey{ev.Path, ev.Op}
			seen = append(seen, k)
			delete(missing, k)
		case <-deadline:
			t.Fatalf("events missing after 30s: %v (seen %v)", missing, seen)
		}
	}
	return seen
}

// hutch ps ID lists the processes inside, in a table or as JSON.
func TestPsInsideSandbox(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	e.ok("exec", "-d", id, "--", "sleep", "321")
	var ps []struct {
		PID int    `json:"pid"`
		Cmd string `json:"cmd"`
	}
	waitFor(t, func() bool {
		ps = nil
		if err := json.Unmarshal([]byte(e.ok("ps", "--format", "json", id)), &ps); err != nil {
			t.Fatal(err)
		}
		return len(ps) >= 2
	})
	var cmds []string
	for _, p := range ps {
		cmds = append(cmds, p.Cmd)
	}
	if ps[0].PID != 1 || ps[0].Cmd != "hutch-init" || !strings.Contains(strings.Join(cmds, " "), "sleep") {
		t.Fatalf("ps: %+v", ps)
	}
	table := e.ok("top", id)
	if !strings.HasPrefix(table, "PID") || !strings.Contains(table, "sleep") {
		t.Fatalf("top table:\n%s", table)
	}
	// Without an ID, ps lists sandboxes as it always did.
	if out := e.ok("ps", "-q"); strings.TrimSpace(out) != id {
		t.Fatalf("ps -q: %q", out)
	}
	e.ok("stop", id)
	assertOneLineError(t, e.run(nil, "ps", id), "not running")
}
