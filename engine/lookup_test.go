package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/assembly"
)

// lookupEngine is an engine whose state holds n sandboxes named sb-0 …
// sb-(n-1), with IDs 0000…, 0001…, that look running: their PID is this
// test's own process.
func lookupEngine(t testing.TB, n int) *Engine {
	t.Helper()
	e := &Engine{opts: Options{Root: t.TempDir()}}
	if err := os.MkdirAll(e.sandboxesDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	start, err := assembly.ProcessStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		sb := &record{
			ID: fmt.Sprintf("%04d%028x", i, i), Name: fmt.Sprintf("sb-%d", i), Image: "busybox:latest",
			Created: time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC), Rootless: true,
			Pid: os.Getpid(), PidStart: start, BootID: bootID(),
		}
		if err := os.Mkdir(e.sandboxDir(sb.ID), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := e.save(sb); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func TestGetResolvesIDNamePrefix(t *testing.T) {
	e := lookupEngine(t, 12)
	// A directory whose record is not written yet (a create under way) is
	// skipped, not an error.
	if err := os.Mkdir(e.sandboxDir("0099creating"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for ref, want := range map[string]string{
		"0003" + fmt.Sprintf("%028x", 3): "sb-3",  // full ID
		"sb-7":                           "sb-7",  // name
		"0011":                           "sb-11", // unique prefix
	} {
		sb, err := e.get(ctx, ref)
		if err != nil {
			t.Fatalf("get %q: %v", ref, err)
		}
		if sb.Name != want || sb.State != StateRunning {
			t.Errorf("get %q = %s (%s), want %s, running", ref, sb.Name, sb.State, want)
		}
	}
	if _, err := e.get(ctx, "001"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("get of a prefix of 0010 and 0011: %v, want ambiguous (invalid argument)", err)
	}
	if _, err := e.get(ctx, "sb-99"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get of an unknown name: %v, want not found", err)
	}
	if err := e.nameFree("sb-5", ""); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("nameFree of a used name: %v, want already exists", err)
	}
	if err := e.nameFree("sb-12", ""); err != nil {
		t.Errorf("nameFree of a free name: %v", err)
	}
	if err := os.WriteFile(e.recordPath("0099creating"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.get(ctx, "sb-99"); err == nil || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get with a corrupt record in the state: %v, want the corruption reported", err)
	}
}

// BenchmarkGetByName is a lookup by name among 500 sandboxes, what
// `hutch exec NAME` does before anything else.
func BenchmarkGetByName(b *testing.B) {
	e := lookupEngine(b, 500)
	ctx := context.Background()
	for b.Loop() {
		if _, err := e.get(ctx, "sb-250"); err != nil {
			b.Fatal(err)
		}
	}
}

// A state root without a name index (an earlier hutch's) gets one from its
// records; names taken and dropped keep it right, and an entry whose
// sandbox is gone, was never written or has another name is free.
func TestNameIndex(t *testing.T) {
	e := lookupEngine(t, 3)
	ctx := context.Background()
	if _, err := os.Lstat(e.namesDir()); err == nil {
		t.Fatal("the test state already has a name index")
	}
	if sb, err := e.get(ctx, "sb-1"); err != nil || sb.Name != "sb-1" {
		t.Fatalf("get sb-1: %v %v", sb, err)
	}
	if id, err := os.Readlink(filepath.Join(e.namesDir(), "sb-2")); err != nil || id != fmt.Sprintf("%04d%028x", 2, 2) {
		t.Fatalf("index entry of sb-2: %q %v", id, err)
	}

	// Taken by one sandbox, refused to another, free again once dropped.
	a, b := fmt.Sprintf("%032x", 0xa), fmt.Sprintf("%032x", 0xb)
	if err := e.takeName("web", a); err != nil {
		t.Fatal(err)
	}
	// Its record is not written yet (a create under way, or one that
	// crashed here): the name is free.
	if err := e.nameFree("web", b); err != nil {
		t.Fatalf("a name whose record was never written: %v", err)
	}
	os.Mkdir(e.sandboxDir(a), 0o700)
	if err := e.save(&record{ID: a, Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if err := e.takeName("web", b); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("a name in use, taken by another: %v", err)
	}
	if err := e.nameFree("web", a); err != nil {
		t.Fatalf("a sandbox's own name: %v", err)
	}
	if sb, err := e.get(ctx, "web"); err != nil || sb.ID != a {
		t.Fatalf("get web: %v %v", sb, err)
	}
	// Another sandbox's drop leaves the entry.
	if err := e.dropName("web", b); err != nil {
		t.Fatal(err)
	}
	if sb, err := e.get(ctx, "web"); err != nil || sb.ID != a {
		t.Fatalf("get web after another's drop: %v %v", sb, err)
	}
	// The record renamed (a stale entry): free.
	if err := e.save(&record{ID: a, Name: "api"}); err != nil {
		t.Fatal(err)
	}
	if err := e.nameFree("web", b); err != nil {
		t.Fatalf("an entry whose record has another name: %v", err)
	}
	// The sandbox removed without its entry (a crash): free, and an
	// unknown name again.
	os.RemoveAll(e.sandboxDir(a))
	if err := e.nameFree("web", b); err != nil {
		t.Fatalf("an entry whose sandbox is gone: %v", err)
	}
	if _, err := e.get(ctx, "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get of a name whose sandbox is gone: %v", err)
	}
	// An entry that does not name an ID is ignored.
	os.Symlink("../../etc", filepath.Join(e.namesDir(), "evil"))
	if _, err := e.get(ctx, "evil"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get through an entry that is not an ID: %v", err)
	}
}
