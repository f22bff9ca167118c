package shim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A pod names a checkpoint of its own namespace by a name that is never a
// path; anything else is refused naming the annotation.
func TestRestoreDir(t *testing.T) {
	root := t.TempDir()
	name := "0123456789abcdef0123456789abcdef"
	if err := os.MkdirAll(filepath.Join(root, "team-a", name), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "team-a", "00000000000000000000000000000000"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{CheckpointDir: root}
	spec := func(ns, v string, set bool) *specs.Spec {
		a := map[string]string{criSandboxNamespace: ns}
		if set {
			a[AnnotationRestore] = v
		}
		return &specs.Spec{Annotations: a}
	}
	if d, err := restoreDir(cfg, spec("team-a", "", false)); d != "" || err != nil {
		t.Fatalf("no annotation: got %q, %v", d, err)
	}
	if d, err := restoreDir(cfg, spec("team-a", name, true)); d != filepath.Join(root, "team-a", name) || err != nil {
		t.Fatalf("own namespace: got %q, %v", d, err)
	}
	for _, tc := range []struct {
		ns, v string
		kind  error
		msg   string
	}{
		{"team-b", name, errdefs.ErrNotFound, "no checkpoint of that name in namespace team-b on this node"},
		{"team-a", "11111111111111111111111111111111", errdefs.ErrNotFound, "no checkpoint of that name"},
		{"team-a", "00000000000000000000000000000000", errdefs.ErrNotFound, "no checkpoint of that name"},
		{"team-a", "../team-a/" + name, errdefs.ErrInvalidArgument, "32 lowercase hex digits"},
		{"team-a", strings.ToUpper(name), errdefs.ErrInvalidArgument, "32 lowercase hex digits"},
		{"team-a", "", errdefs.ErrInvalidArgument, "32 lowercase hex digits"},
		{"..", name, errdefs.ErrInvalidArgument, "not a Kubernetes namespace"},
		{"", name, errdefs.ErrInvalidArgument, "not a Kubernetes namespace"},
	} {
		d, err := restoreDir(cfg, spec(tc.ns, tc.v, true))
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), AnnotationRestore) {
			t.Errorf("namespace %q, name %q: got %q, %v; want %v with %q", tc.ns, tc.v, d, err, tc.kind, tc.msg)
		}
	}
}

// A pod's checkpoint names the containers it holds; one without the list
// says nothing (nil), which is not the same as holding none.
func TestCheckpointNames(t *testing.T) {
	dir := t.TempDir()
	if n, err := checkpointNames(dir); n != nil || err != nil {
		t.Fatalf("no list: got %v, %v", n, err)
	}
	for body, want := range map[string]string{`{"containers":["a","b"]}`: "a,b", `{"containers":[]}`: ""} {
		if err := os.WriteFile(filepath.Join(dir, ContainersFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		n, err := checkpointNames(dir)
		if err != nil || n == nil || strings.Join(n, ",") != want {
			t.Fatalf("%s: got %v, %v", body, n, err)
		}
	}
}
