package integration

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// volumeRecord is the part of `hutch volume inspect` the tests read.
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

	// What a user sees of a sandbox names its mounts, and no host
	// process or path.
	var view struct {
		Mounts []struct {
			Volume, Target string
			ReadOnly       bool
		}
		Pid    int    `json:"pid"`
		Rootfs string `json:"rootfs"`
	}
	if err := json.Unmarshal([]byte(e.ok("inspect", a)), &view); err != nil {
		t.Fatal(err)
	}
	if len(view.Mounts) != 1 || view.Mounts[0].Volume != "shared" || view.Mounts[0].Target != "/data" || view.Mounts[0].ReadOnly {
		t.Fatalf("inspect: mounts %+v, want shared at /data", view.Mounts)
	}
	if view.Pid != 0 || view.Rootfs != "" {
		t.Fatalf("inspect shows host details: pid %d, rootfs %q", view.Pid, view.Rootfs)
	}

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
	// The source is given through a symlink: hutch resolves it once.
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

// treeHash describes every entry below dir (type, mode, content or link
// target), without following symlinks.
func treeHash(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(&b, "%s %v", rel, fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " -> %s", l)
		case fi.Mode().IsRegular():
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(c))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestVolumeOverlayWorkspaceDiffAndApply(t *testing.T) {
	e := newEnv(t)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	target := filepath.Join(outside, "target")
	writeFiles(t, outside, map[string]string{"secret": "host-only-secret\n", "target": "untouched\n"})
	host := t.TempDir()
	writeFiles(t, host, map[string]string{
		"a.txt": "hello\n", "del.txt": "gone\n", "sub/b.txt": "one\ntwo\nthree\n",
		"sub/bin": "\x00\x01old", "deldir/x": "x\n", "same.txt": "same\n",
	})
	// The user's own symlink out of the directory: apply must replace
	// it, never write through it.
	if err := os.Symlink(target, filepath.Join(host, "link")); err != nil {
		t.Fatal(err)
	}
	before := treeHash(t, host)

	id := e.create("-v", host+":/work:overlay")
	e.ok("exec", id, "--", "sh", "-c", `set -e
		echo changed >> /work/a.txt
		echo new > /work/new.txt
		mkdir /work/nd && echo f > /work/nd/f
		rm /work/del.txt
		rm -r /work/deldir
		sed -i s/two/TWO/ /work/sub/b.txt
		printf '\000\002new' > /work/sub/bin
		chmod 755 /work/same.txt
		touch /work/sub
		rm /work/link && echo pwn > /work/link
		ln -s `+secret+` /work/leak`)
	if got := treeHash(t, host); got != before {
		t.Fatalf("the sandbox's writes reached the host directory:\nbefore:\n%s\nafter:\n%s", before, got)
	}
	want := strings.Join([]string{
		"M /work/a.txt",
		"D /work/del.txt",
		"D /work/deldir/",
		"D /work/deldir/x",
		"A /work/leak -> " + secret,
		"M /work/link (mode 777 -> 644)",
		"A /work/nd/",
		"A /work/nd/f",
		"A /work/new.txt",
		"M /work/same.txt (mode 644 -> 755)",
		"M /work/sub/b.txt",
		"M /work/sub/bin",
	}, "\n") + "\n"
	if got := e.ok("diff", "--name-status", id); got != want {
		t.Fatalf("hutch diff --name-status:\n%s\nwant:\n%s", got, want)
	}
	patch := e.ok("diff", id)
	for _, w := range []string{
		"--- a/work/sub/b.txt\n+++ b/work/sub/b.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n",
		"--- /dev/null\n+++ b/work/new.txt\n@@ -0,0 +1 @@\n+new\n",
		"Binary files a/work/sub/bin and b/work/sub/bin differ\n",
		"old mode 100644\nnew mode 100755\n",
	} {
		if !strings.Contains(patch, w) {
			t.Fatalf("hutch diff lacks %q:\n%s", w, patch)
		}
	}
	if strings.Contains(patch, "host-only-secret") {
		t.Fatalf("hutch diff followed a planted symlink out of the workspace:\n%s", patch)
	}
	if got := e.ok("diff", "--name-status", id, "/work/sub"); got != "M /work/sub/b.txt\nM /work/sub/bin\n" {
		t.Fatalf("hutch diff ID /work/sub:\n%s", got)
	}

	// A fork gets a copy of the layer: what it writes, its parent never
	// sees, nor the host.
	fork := strings.Fields(e.ok("fork", id))[0]
	e.ok("exec", fork, "--", "sh", "-c", "echo fork > /work/fork-only && echo forked >> /work/a.txt")
	if got := e.ok("diff", "--name-status", id); got != want {
		t.Fatalf("the fork's writes reached its parent's workspace:\n%s", got)
	}
	if got := e.ok("diff", "--name-status", fork, "/work/fork-only"); got != "A /work/fork-only\n" {
		t.Fatalf("fork's diff: %q", got)
	}
	if got := strings.TrimSpace(e.ok("exec", id, "--", "cat", "/work/a.txt")); got != "hello\nchanged" {
		t.Fatalf("parent's a.txt after the fork wrote its own: %q", got)
	}
	// Pause/resume keeps the workspace; a stopped sandbox still diffs.
	e.ok("pause", id)
	if got := e.ok("diff", "--name-status", id); got != want {
		t.Fatalf("hutch diff of a paused sandbox:\n%s", got)
	}
	e.ok("resume", id)
	e.waitForOutput(id, "new", "cat", "/work/new.txt")
	e.ok("stop", fork)
	if got := e.ok("diff", "--name-status", fork, "/work/fork-only"); got != "A /work/fork-only\n" {
		t.Fatalf("hutch diff of a stopped fork: %q", got)
	}
	if got := treeHash(t, host); got != before {
		t.Fatalf("host directory changed before apply:\n%s", got)
	}

	e.ok("diff", "--apply", id)
	if got := e.ok("diff", id); got != "" {
		t.Fatalf("after --apply the sandbox still differs from the host:\n%s", got)
	}
	// The host now matches the sandbox's view, file by file.
	view := e.ok("exec", id, "--", "sh", "-c", "cd /work && find . | sort && md5sum a.txt new.txt nd/f sub/b.txt sub/bin link same.txt && readlink leak && stat -c %a same.txt")
	hostView := ""
	if b, err := exec.Command("sh", "-c", "cd "+host+" && find . | sort && md5sum a.txt new.txt nd/f sub/b.txt sub/bin link same.txt && readlink leak && stat -c %a same.txt").Output(); err != nil {
		t.Fatal(err)
	} else {
		hostView = string(b)
	}
	if view != hostView {
		t.Fatalf("after --apply:\nsandbox:\n%s\nhost:\n%s", view, hostView)
	}
	if fi, err := os.Lstat(filepath.Join(host, "leak")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("a planted symlink was not applied as a symlink: %v %v", fi, err)
	}
	if got, _ := os.ReadFile(target); string(got) != "untouched\n" {
		t.Fatalf("apply wrote through the host's symlink out of the directory: target = %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(host, "link")); string(got) != "pwn\n" {
		t.Fatalf("host link after apply: %q", got)
	}
	e.ok("rm", "-f", id, fork)
	e.assertClean(id)
	if out, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(out), e.root) {
		t.Fatalf("workspace mounts left after rm:\n%s", out)
	}
}

func TestVolumeOverlayRefused(t *testing.T) {
	e := newEnv(t)
	e.ok("volume", "create", "vol")
	for _, c := range []struct{ v, want string }{
		{"vol:/x:overlay", "needs a host directory"},
		{"/no/such/dir:/x:overlay", "does not exist"},
	} {
		assertOneLineError(t, e.run(nil, "create", "--image", "busybox", "-v", c.v), c.want)
	}
	id := e.create()
	assertOneLineError(t, e.run(nil, "diff", id), "no overlay workspace")
}
