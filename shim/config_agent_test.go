package shim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
)

// hutch_init names the agent; one that is not an executable file is the
// operator's mistake, named in the error.
func TestLoadConfigHutchInit(t *testing.T) {
	dir := t.TempDir()
	agentBin := filepath.Join(dir, "hutch-init")
	if err := os.WriteFile(agentBin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	load := func(body string) (Config, error) {
		p := filepath.Join(dir, "shim.toml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		a, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: p})
		if err != nil {
			t.Fatal(err)
		}
		return loadConfig(a)
	}
	c, err := load("hutch_init = " + `"` + agentBin + `"`)
	if err != nil || c.HutchInit != agentBin {
		t.Fatalf("hutch_init %s: got %q, %v", agentBin, c.HutchInit, err)
	}
	c, err = load("")
	if err != nil || c.HutchInit != "" {
		t.Fatalf("no hutch_init: got %q, %v (want it found per pod, beside the shim)", c.HutchInit, err)
	}
	missing := filepath.Join(dir, "nope")
	_, err = load("hutch_init = " + `"` + missing + `"`)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing hutch_init: got %v", err)
	}
	_, err = load("hutch_init = " + `"` + dir + `"`)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a directory as hutch_init: got %v", err)
	}
}
