package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"sbx.dev/sbx/assembly"
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
	if err := e.nameFree("sb-5"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("nameFree of a used name: %v, want already exists", err)
	}
	if err := e.nameFree("sb-12"); err != nil {
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
// `sbx exec NAME` does before anything else.
func BenchmarkGetByName(b *testing.B) {
	e := lookupEngine(b, 500)
	ctx := context.Background()
	for b.Loop() {
		if _, err := e.get(ctx, "sb-250"); err != nil {
			b.Fatal(err)
		}
	}
}
