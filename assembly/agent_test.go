package assembly

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The agent is mounted read-only at its path, in place of whatever the
// spec mounted there.
func TestAgentMount(t *testing.T) {
	s := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/.hutch/hutch-init", Type: "bind", Source: "/pod/own", Options: []string{"rbind", "rw"}},
	}}
	if HasAgent(&specs.Spec{Mounts: s.Mounts[:1]}) {
		t.Fatal("HasAgent without the mount")
	}
	if err := Apply(s, AgentMount("/opt/hutch/hutch-init")); err != nil {
		t.Fatal(err)
	}
	var got []specs.Mount
	for _, m := range s.Mounts {
		if m.Destination == "/.hutch/hutch-init" {
			got = append(got, m)
		}
	}
	if len(got) != 1 || got[0].Source != "/opt/hutch/hutch-init" || !slices.Contains(got[0].Options, "ro") || slices.Contains(got[0].Options, "rw") {
		t.Fatalf("want one read-only mount of the agent, got %+v", got)
	}
	if len(s.Mounts) != 2 || !HasAgent(s) {
		t.Fatalf("mounts: %+v", s.Mounts)
	}
}

func TestCheckAgent(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "hutch-init"), filepath.Join(dir, "plain")
	os.WriteFile(exe, nil, 0o755)
	os.WriteFile(plain, nil, 0o644)
	if _, err := CheckAgent(exe); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckAgent(filepath.Join(dir, "missing")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing: got %v, want ErrNotFound", err)
	}
	for _, p := range []string{plain, dir} {
		if _, err := CheckAgent(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", p, err)
		}
	}
}
