package commands

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestVersionFlag checks that --version prints hutch's version, commit,
// build date and Go version, and runsc's version, as the version command
// does.
func TestVersionFlag(t *testing.T) {
	dir := t.TempDir()
	runsc := filepath.Join(dir, "bin", "runsc")
	if err := os.Mkdir(filepath.Dir(runsc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(runsc, []byte("#!/bin/sh\necho 'runsc version test-1.2'\necho 'spec: 1.1.0'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		app := App()
		var out bytes.Buffer
		app.Writer = &out
		code := run(app, append([]string{"hutch", "--root", filepath.Join(dir, "root"), "--runsc", runsc}, args...), &out)
		got := out.String()
		if _, err := os.Stat(filepath.Join(dir, "root")); err == nil {
			t.Errorf("hutch %s made a state root", args)
		}
		for _, want := range []string{"hutch ", "commit:", "built:", runtime.Version(), "runsc version test-1.2 (" + runsc + ")"} {
			if code != 0 || !strings.Contains(got, want) {
				t.Errorf("hutch %s: exit %d\n%s\nwant %q in it", args, code, got, want)
			}
		}
	}
}
