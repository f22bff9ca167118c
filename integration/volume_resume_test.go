package integration

import (
	"strings"
	"testing"
)

// A paused sandbox whose named volume was removed with `volume rm -f` is
// not resumed, and the error names the volume and says it was removed;
// once a volume of that name exists again, the sandbox resumes with it.
func TestVolumeRemovedUnderPausedSandbox(t *testing.T) {
	requiresRoot(t)
	e := newEnv(t)
	e.ok("volume", "create", "scratch")
	id := e.create("-v", "scratch:/data")
	e.ok("exec", id, "--", "sh", "-c", "echo before > /data/f")
	e.ok("pause", id)
	e.ok("volume", "rm", "-f", "scratch")

	r := e.run(nil, "resume", id)
	assertOneLineError(t, r, `volume "scratch"`)
	if !strings.Contains(r.stderr, "was removed") || !strings.Contains(r.stderr, "/data") {
		t.Errorf("resume error %q does not say the volume mounted at /data was removed", r.stderr)
	}
	if ls := e.list(); len(ls) != 1 || ls[0].State != "paused" {
		t.Errorf("after the refused resume: %+v, want the sandbox still paused", ls)
	}

	e.ok("volume", "create", "scratch")
	e.ok("resume", id)
	if out := e.ok("exec", id, "--", "sh", "-c", "ls -A /data; echo after > /data/f; cat /data/f"); out != "after\n" {
		t.Errorf("the resumed sandbox's /data: %q, want the new, empty volume", out)
	}
	e.ok("rm", "-f", id)
	e.ok("volume", "rm", "scratch")
	e.assertClean(id)
}
