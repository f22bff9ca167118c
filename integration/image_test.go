package integration

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// Images move in and out of the store as OCI archives, and a sandbox runs
// on an imported one.
func TestImageImportExport(t *testing.T) {
	e := newEnv(t)
	archive := filepath.Join(e.bin, "images", "busybox.tar")
	digest := strings.TrimSpace(e.ok("image", "import", "tools:v1", archive))
	if !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("import should print the manifest digest, got %q", digest)
	}
	var imgs []struct {
		Name   string `json:"Name"`
		Digest string `json:"Digest"`
	}
	if err := json.Unmarshal([]byte(e.ok("image", "ls", "--format", "json")), &imgs); err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Name != "tools:v1" || imgs[0].Digest != digest {
		t.Fatalf("image ls: %+v", imgs)
	}
	out := filepath.Join(t.TempDir(), "out.tar")
	e.ok("image", "export", "tools:v1", out)
	e.ok("image", "rm", "tools:v1")
	assertOneLineError(t, e.run(nil, "create", "--image", "tools:v1"), `"tools:v1" not found`)
	if again := strings.TrimSpace(e.ok("image", "import", "again", out)); again != digest {
		t.Fatalf("export then import changed the digest: %s -> %s", digest, again)
	}
	r := e.run(nil, "run", "--rm", "--image", "again", "--", "echo", "from-again")
	if r.code != 0 || r.stdout != "from-again\n" {
		t.Fatalf("run on the imported image: %s", r)
	}
	assertOneLineError(t, e.run(nil, "image", "import", "broken", filepath.Join(e.bin, "hutch")), "broken")
	assertOneLineError(t, e.run(nil, "image", "rm", "nosuch"), "nosuch")
	if out := e.ok("image", "ls"); strings.Contains(out, "broken") {
		t.Fatalf("a failed import left a tag:\n%s", out)
	}
}

func TestVersionAndDoctor(t *testing.T) {
	e := newEnv(t)
	if out := e.ok("version"); !strings.Contains(out, "runsc version release-20260905.0") {
		t.Fatalf("version should name the pinned runsc: %q", out)
	}
	out := e.ok("doctor")
	for _, want := range []string{"ok    runsc", "ok    sandbox", "gvisor"} {
		if !strings.Contains(out, want) {
			t.Fatalf("doctor output lacks %q:\n%s", want, out)
		}
	}
	r := e.run(nil, "--runsc", "/nonexistent/runsc", "doctor")
	if r.code != 125 || !strings.Contains(r.stdout+r.stderr, "/nonexistent/runsc") {
		t.Fatalf("doctor without runsc must fail naming it: %s", r)
	}
}
