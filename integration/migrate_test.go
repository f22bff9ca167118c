package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A user whose state is still under the former name's path (sbx's
// default root) gets one line naming the command that moves it, and after
// that command finds every sandbox, image and volume where hutch looks,
// working: the paused sandbox resumes with its files and processes, the
// snapshot image starts sandboxes, the volume keeps its contents.
func TestMigrateFormerState(t *testing.T) {
	cur := newRootlessEnv(t).withDefaultRoot()
	data := filepath.Dir(cur.root)
	oldRoot := filepath.Join(data, "sbx")
	old := *cur
	old.root = oldRoot
	old.extra = append(append([]string{}, cur.extra...), "HUTCH_ROOT="+oldRoot)
	t.Cleanup(old.removeAll)

	// State as the former name left it: the same formats, under its path.
	old.ok("volume", "create", "keep")
	src := old.create("--name", "src", "-v", "keep:/data")
	old.ok("exec", src, "--", "sh", "-c", "echo in-volume > /data/v && echo in-rootfs > /root/f")
	if out := strings.TrimSpace(old.ok("snapshot", "-t", "snap", src)); out != "snap:latest" {
		t.Fatalf("snapshot: %q", out)
	}
	old.ok("stop", src)
	paused := old.create("--name", "paused")
	old.ok("exec", paused, "--", "sh", "-c", "echo kept > /root/p")
	old.ok("exec", "-d", paused, "--", "sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done")
	old.ok("pause", paused)
	running := old.create("--name", "running")

	// hutch finds it and names the command; it makes no state of its own.
	for _, args := range [][]string{{"ls"}, {"image", "ls"}, {"volume", "ls"}, {"create", "--image", "busybox"}} {
		r := cur.run(nil, args...)
		assertOneLineError(t, r, "hutch migrate")
		if !strings.Contains(r.stderr, oldRoot) {
			t.Fatalf("hutch %v: the error does not name %s: %q", args, oldRoot, r.stderr)
		}
	}
	if _, err := os.Lstat(cur.root); !os.IsNotExist(err) {
		t.Fatalf("hutch made %s beside the former state: %v", cur.root, err)
	}

	// A running sandbox holds its paths: migrate refuses and moves nothing.
	r := cur.run(nil, "migrate")
	assertOneLineError(t, r, "running")
	if !strings.Contains(r.stderr, running[:12]) {
		t.Fatalf("migrate does not name the running sandbox %s: %q", running[:12], r.stderr)
	}
	if _, err := os.Stat(filepath.Join(oldRoot, "sandboxes")); err != nil {
		t.Fatalf("a refused migrate changed the former state: %v", err)
	}
	old.ok("stop", running)

	out := cur.ok("migrate")
	if !strings.Contains(out, "moved "+oldRoot+" to "+cur.root) {
		t.Fatalf("migrate printed %q", out)
	}
	if _, err := os.Lstat(oldRoot); !os.IsNotExist(err) {
		t.Fatalf("%s is still there after migrate: %v", oldRoot, err)
	}
	if b, err := exec.Command("grep", "-rlIF", "--exclude-dir=blobs", oldRoot, cur.root).Output(); err == nil {
		t.Fatalf("state under %s still names %s:\n%s", cur.root, oldRoot, b)
	}

	var ls []struct {
		ID    string `json:"id"`
		Name  string `json:"name"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(cur.ok("ls", "--format", "json")), &ls); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, s := range ls {
		states[s.ID] = s.State
	}
	if len(ls) != 3 || states[src] != "stopped" || states[paused] != "paused" || states[running] != "stopped" {
		t.Fatalf("after migrate, hutch ls: %+v", ls)
	}
	if imgs := cur.ok("image", "ls"); !strings.Contains(imgs, "snap") || !strings.Contains(imgs, "busybox") {
		t.Fatalf("after migrate, hutch image ls:\n%s", imgs)
	}
	if vols := cur.ok("volume", "ls"); !strings.Contains(vols, "keep") {
		t.Fatalf("after migrate, hutch volume ls:\n%s", vols)
	}

	// The paused sandbox resumes with its files and its process.
	cur.ok("resume", paused)
	if got := cur.ok("exec", paused, "--", "cat", "/root/p"); got != "kept\n" {
		t.Fatalf("resumed sandbox's file: %q", got)
	}
	a := strings.TrimSpace(cur.ok("exec", paused, "--", "cat", "/tmp/count"))
	cur.ok("exec", paused, "--", "sleep", "1")
	if b := strings.TrimSpace(cur.ok("exec", paused, "--", "cat", "/tmp/count")); a == b {
		t.Fatalf("the resumed sandbox's background process does not run: count %s, then %s", a, b)
	}
	// The snapshot starts a sandbox; the volume has what was written in it.
	id := cur.create("--image", "snap", "-v", "keep:/data")
	if got := cur.ok("exec", id, "--", "cat", "/root/f", "/data/v"); got != "in-rootfs\nin-volume\n" {
		t.Fatalf("sandbox of the migrated snapshot and volume: %q", got)
	}
	for _, x := range []string{id, paused, src, running} {
		cur.ok("rm", "-f", x)
		cur.assertClean(x)
	}
	cur.ok("volume", "rm", "keep")

	// Nothing left to move: migrate says so and changes nothing.
	assertOneLineError(t, cur.run(nil, "migrate"), "no state of sbx")
}
