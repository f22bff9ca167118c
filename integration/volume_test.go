package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// volumeRecord is the part of `sbx volume inspect` the tests read.
type volumeRecord struct {
	Name   string   `json:"name"`
	Path   string   `json:"path"`
	UsedBy []string `json:"usedBy"`
}

// waitForOutput runs cmd in sandbox id until it prints want, for up to a
// second.
func (e *env) waitForOutput(id, want string, cmd ...string) {
	e.t.Helper()
	var last result
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last = e.run(nil, append([]string{"exec", id, "--"}, cmd...)...)
		if last.code == 0 && strings.TrimSpace(last.stdout) == want {
			return
		}
	}
	e.t.Fatalf("sandbox %s: %v did not print %q within a second: %s", id, cmd, want, last)
}

func TestVolumeSharedBetweenSandboxes(t *testing.T) {
	e := newEnv(t)
	e.ok("volume", "create", "shared")
	a := e.create("-v", "shared:/data")
	b := e.create("-v", "shared:/mnt/vol")

	e.ok("exec", a, "--", "sh", "-c", "echo from-a > /data/a")
	e.waitForOutput(b, "from-a", "cat", "/mnt/vol/a")
	e.ok("exec", b, "--", "sh", "-c", "echo from-b > /mnt/vol/b")
	e.waitForOutput(a, "from-b", "cat", "/data/b")
	// An overwrite, not only a new file, must show: the cache revalidates.
	e.ok("exec", a, "--", "sh", "-c", "echo again > /data/b")
	e.waitForOutput(b, "again", "cat", "/mnt/vol/b")

	var v volumeRecord
	if err := json.Unmarshal([]byte(e.ok("volume", "inspect", "shared")), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.UsedBy) != 2 {
		t.Fatalf("volume inspect: want 2 users, got %v", v.UsedBy)
	}
	if got, _ := os.ReadFile(filepath.Join(v.Path, "a")); string(got) != "from-a\n" {
		t.Fatalf("host view of the volume: a = %q", got)
	}

	var all []volumeRecord
	if err := json.Unmarshal([]byte(e.ok("volume", "ls", "--format", "json")), &all); err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Name != "shared" {
		t.Fatalf("volume ls: %+v", all)
	}
}

func TestVolumeSurvivesSandboxAndRmRefusedInUse(t *testing.T) {
	e := newEnv(t)
	e.ok("volume", "create", "keep")
	id := e.create("-v", "keep:/data")
	e.ok("exec", id, "--", "sh", "-c", "echo kept > /data/f")

	r := e.run(nil, "volume", "rm", "keep")
	assertOneLineError(t, r, "in use by sandbox "+id[:12])

	e.ok("rm", "-f", id)
	e.assertClean(id)
	id2 := e.create("-v", "keep:/other")
	if got := strings.TrimSpace(e.ok("exec", id2, "--", "cat", "/other/f")); got != "kept" {
		t.Fatalf("after rm of its sandbox, the volume holds %q", got)
	}

	// Forced, it goes even in use.
	e.ok("volume", "rm", "-f", "keep")
	if out := e.ok("volume", "ls"); strings.Contains(out, "keep") {
		t.Fatalf("volume ls after rm -f:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(e.root, "volumes", "keep")); !os.IsNotExist(err) {
		t.Fatalf("volume directory still there: %v", err)
	}
}

func TestVolumeHostDirReadWriteAndReadOnly(t *testing.T) {
	e := newEnv(t)
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "f"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The source is given through a symlink: sbx resolves it once.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(host, link); err != nil {
		t.Fatal(err)
	}
	id := e.create("-v", link+":/work", "-v", host+":/ro:ro")

	e.waitForOutput(id, "one", "cat", "/work/f")
	if err := os.WriteFile(filepath.Join(host, "f"), []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.waitForOutput(id, "two", "cat", "/work/f")
	e.ok("exec", id, "--", "sh", "-c", "echo inside > /work/g")
	if got, _ := os.ReadFile(filepath.Join(host, "g")); string(got) != "inside\n" {
		t.Fatalf("write through a :rw mount: host has %q", got)
	}

	// Symlinks planted in the mount resolve inside the sandbox, never to
	// the host's files beside the mounted directory.
	secret := filepath.Join(filepath.Dir(host), "secret")
	if err := os.WriteFile(secret, []byte("host-only\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.ok("exec", id, "--", "sh", "-c", "ln -s "+secret+" /work/abs && ln -s ../secret /work/rel")
	for _, l := range []string{"/work/abs", "/work/rel"} {
		if r := e.run(nil, "exec", id, "--", "cat", l); r.code == 0 || strings.Contains(r.stdout, "host-only") {
			t.Fatalf("a symlink planted in the mount reached the host: %s", r)
		}
	}

	r := e.run(nil, "exec", id, "--", "sh", "-c", "echo x > /ro/h")
	if r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
		t.Fatalf("write to a :ro mount: %s", r)
	}
	r = e.run(nil, "exec", id, "--", "rm", "/ro/f")
	if r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
		t.Fatalf("rm on a :ro mount: %s", r)
	}
	if _, err := os.Stat(filepath.Join(host, "h")); !os.IsNotExist(err) {
		t.Fatalf("a :ro mount let a file through: %v", err)
	}
	if _, err := os.Stat(filepath.Join(host, "f")); err != nil {
		t.Fatalf("a :ro mount let a file be removed: %v", err)
	}
}

func TestVolumeRefusedSources(t *testing.T) {
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ v, want string }{
		{e.root + ":/x", "state root"},
		{filepath.Join(e.root, "sandboxes") + ":/x", "state root"},
		{filepath.Dir(e.root) + ":/x", "state root"},
		{"/:/x", "system directory"},
		{"/etc:/x", "system directory"},
		{"/proc/self:/x", "/proc"},
		{"/no/such/dir:/x", "does not exist"},
		{file + ":/x", "not a directory"},
		{"nosuchvolume:/x", "no such volume"},
		{t.TempDir() + ":/proc/x", "reserved"},
		{t.TempDir() + ":/x:rx", "unknown mode"},
	} {
		r := e.run(nil, "create", "--image", "busybox", "-v", c.v)
		assertOneLineError(t, r, c.want)
	}
	if all := e.list(); len(all) != 0 {
		t.Fatalf("refused creates left sandboxes: %+v", all)
	}
	ents, _ := os.ReadDir(filepath.Join(e.root, "sandboxes"))
	if len(ents) != 0 {
		t.Fatalf("refused creates left %d sandbox directories", len(ents))
	}
}

func TestVolumePauseResumeAndFork(t *testing.T) {
	e := newEnv(t)
	e.ok("volume", "create", "v")
	host := t.TempDir()
	id := e.create("-v", "v:/data", "-v", host+":/host")
	e.ok("exec", id, "--", "sh", "-c", "echo before > /data/f")

	e.ok("pause", id)
	if err := os.WriteFile(filepath.Join(host, "while-paused"), []byte("p\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.ok("resume", id)
	e.waitForOutput(id, "before", "cat", "/data/f")
	e.waitForOutput(id, "p", "cat", "/host/while-paused")

	// A fork mounts the same volume and host directory: it shares them.
	fork := strings.Fields(e.ok("fork", id))[0]
	e.waitForOutput(fork, "before", "cat", "/data/f")
	e.ok("exec", fork, "--", "sh", "-c", "echo from-fork > /data/g; echo hf > /host/hf")
	e.waitForOutput(id, "from-fork", "cat", "/data/g")
	if got, _ := os.ReadFile(filepath.Join(host, "hf")); string(got) != "hf\n" {
		t.Fatalf("fork's write to the host mount: host has %q", got)
	}
	var v volumeRecord
	if err := json.Unmarshal([]byte(e.ok("volume", "inspect", "v")), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.UsedBy) != 2 {
		t.Fatalf("volume inspect after fork: want 2 users, got %v", v.UsedBy)
	}
}
