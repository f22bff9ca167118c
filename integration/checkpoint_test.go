package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// checkpointEntry is the part of `hutch checkpoint ls --format json` the
// tests read.
type checkpointEntry struct {
	ID           string `json:"id"`
	Chunked      bool   `json:"chunked"`
	Whole        bool   `json:"whole"`
	MemoryStored int64  `json:"memoryStored"`
	Sandbox      string `json:"sandbox"`
	Parent       string `json:"parent"`
	Message      string `json:"message"`
	Current      bool   `json:"current"`
	MemorySize   int64  `json:"memorySize"`
	FilesSize    int64  `json:"filesSize"`
}

func (e *env) checkpoints(id string) []checkpointEntry {
	e.t.Helper()
	var out []checkpointEntry
	if err := json.Unmarshal([]byte(e.ok("checkpoint", "ls", "--format", "json", id)), &out); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) checkpoint(id string, args ...string) string {
	e.t.Helper()
	ck := strings.TrimSpace(e.ok(append(append([]string{"checkpoint"}, args...), id)...))
	if !strings.HasPrefix(ck, "ck-") || len(ck) != 15 {
		e.t.Fatalf("checkpoint printed %q", ck)
	}
	return ck
}

// assertNoCheckpointsLeft checks that nothing of any checkpoint is left
// in the store: no memory checkpoint, no checkpoint files image.
func (e *env) assertNoCheckpointsLeft() {
	e.t.Helper()
	waitFor(e.t, func() bool {
		m, _ := filepath.Glob(filepath.Join(e.root, "images", "checkpoints", "*"))
		return len(m) == 0
	})
	if left := treeFiles(e.t, filepath.Join(e.root, "images", "chunks")); len(left) > 0 {
		e.t.Fatalf("%d checkpoint chunks left, e.g. %s", len(left), left[0])
	}
}

// waitStored waits until sandbox id's checkpoints are checksummed and
// chunked and the process doing it has ended.
func (e *env) waitStored(id string) {
	e.t.Helper()
	waitFor(e.t, func() bool {
		for _, c := range e.checkpoints(id) {
			if !c.Chunked || c.Whole != c.Current {
				return false
			}
		}
		return len(processesMentioning("__store-checkpoints "+id)) == 0
	})
}

func fileIn(e *env, id, p string) string {
	e.t.Helper()
	return e.run(nil, "exec", id, "--", "sh", "-c", "cat "+p+" 2>/dev/null || echo absent").stdout
}

// A sandbox with a dev server and a background counter goes back to a
// checkpoint in place: the counter continues from its checkpointed
// value, files and an installed tool are as they were, the server answers
// on the same host port and the sandbox keeps its address; then to a
// later checkpoint, and back again.
func TestCheckpointRestore(t *testing.T) {
	e := newEnv(t)
	port := freePort(t)
	id := e.create("--net", "open", "-p", fmt.Sprintf("127.0.0.1:%d:8080", port))
	ip := e.inspect(id).IP
	if ip == "" {
		t.Fatal("the sandbox has no address")
	}
	startServices(e, id)
	e.ok("exec", id, "--", "sh", "-c", "echo v1 > /root/file")
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if out, err := get(url); err != nil || out != "hello-from-httpd\n" {
		t.Fatalf("dev server before: %q %v", out, err)
	}

	c1 := e.counter(id)
	ck1 := e.checkpoint(id, "-m", "before the change")
	// The change: a file rewritten, the server's page replaced, a tool
	// installed.
	e.ok("exec", id, "--", "sh", "-c", "echo v2 > /root/file && echo changed > /www/index.html && mkdir -p /opt/tool/bin && cp /bin/busybox /opt/tool/bin/busybox")
	waitFor(t, func() bool { return e.counter(id) > c1+30 })
	c2 := e.counter(id)
	ck2 := e.checkpoint(id, "-m", "after the change")

	e.ok("restore", id, ck1)
	c3 := e.counter(id)
	if c3 < c1 || c3 >= c2 {
		t.Fatalf("after the restore the counter is %d: it was %d at the checkpoint, %d before the restore", c3, c1, c2)
	}
	assertServing(e, id)
	if got := fileIn(e, id, "/root/file"); got != "v1\n" {
		t.Fatalf("/root/file after the restore: %q", got)
	}
	if r := e.run(nil, "exec", id, "--", "test", "-e", "/opt/tool/bin/busybox"); r.code == 0 {
		t.Fatal("the tool installed after the checkpoint is still there")
	}
	if out, err := get(url); err != nil || out != "hello-from-httpd\n" {
		t.Fatalf("dev server on host port %d after the restore: %q %v", port, out, err)
	}
	if got := e.inspect(id); got.IP != ip || got.State != "running" {
		t.Fatalf("after the restore: %+v, address was %s", got, ip)
	}

	// To the later checkpoint, and back.
	e.ok("restore", id, ck2)
	if c := e.counter(id); c < c2 {
		t.Fatalf("restored to the later checkpoint, the counter is %d, it was %d there", c, c2)
	}
	if got := fileIn(e, id, "/root/file"); got != "v2\n" {
		t.Fatalf("/root/file at the later checkpoint: %q", got)
	}
	if out := e.ok("exec", id, "--", "/opt/tool/bin/busybox", "echo", "tool-ok"); out != "tool-ok\n" {
		t.Fatalf("the tool at the later checkpoint: %q", out)
	}
	if out, err := get(url); err != nil || out != "changed\n" {
		t.Fatalf("dev server at the later checkpoint: %q %v", out, err)
	}
	e.ok("restore", id, ck1)
	if got := fileIn(e, id, "/root/file"); got != "v1\n" {
		t.Fatalf("/root/file back at the first checkpoint: %q", got)
	}
	if out, err := get(url); err != nil || out != "hello-from-httpd\n" {
		t.Fatalf("dev server back at the first checkpoint: %q %v", out, err)
	}

	cks := e.checkpoints(id)
	if len(cks) != 2 || cks[0].ID != ck1 || cks[1].ID != ck2 || cks[1].Parent != ck1 || cks[0].Parent != "" ||
		!cks[0].Current || cks[1].Current || cks[0].Message != "before the change" || cks[0].MemorySize == 0 {
		t.Fatalf("checkpoints: %+v", cks)
	}
	// Paused, then restored: the pause's own checkpoint goes.
	e.ok("pause", id)
	e.ok("restore", id, ck2)
	if got := fileIn(e, id, "/root/file"); got != "v2\n" {
		t.Fatalf("/root/file restored from paused: %q", got)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
	e.assertNoCheckpointsLeft()
}

// Twenty restores in a row leave nothing behind on the host: no process,
// mount, checkpoint or file more than after the first.
func TestCheckpointRestoreRepeatedly(t *testing.T) {
	e := newEnv(t)
	id := e.create("--net", "open")
	startServices(e, id)
	ck := e.checkpoint(id)
	e.ok("restore", id, ck)
	e.waitStored(id)
	before := settledProcessesMentioning(t, id)
	files := treeFiles(t, e.root)
	for i := range 20 {
		e.ok("exec", id, "--", "sh", "-c", fmt.Sprintf("echo %d > /root/n", i))
		e.ok("restore", id, ck)
		if got := fileIn(e, id, "/root/n"); got != "absent\n" {
			t.Fatalf("restore %d: /root/n is %q", i, got)
		}
	}
	assertServing(e, id)
	e.waitStored(id)
	if after := settledProcessesMentioning(t, id); len(after) != len(before) {
		t.Fatalf("after 20 restores %d processes mention the sandbox, %d after the first:\n%s\nafter the first:\n%s",
			len(after), len(before), strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	// The store's dropped checkpoints go in the background.
	waitFor(t, func() bool { return len(treeFiles(t, e.root)) <= len(files) })
	if got := treeFiles(t, e.root); len(got) != len(files) {
		t.Fatalf("after 20 restores the state root holds %d files, %d after the first", len(got), len(files))
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
	e.assertNoCheckpointsLeft()
}

// settledProcessesMentioning is processesMentioning(id) once it has not
// changed for half a second (at most 10 s): a process a command ended as
// it returned (the previous sandbox's, a port forwarder) may still be
// exiting when the next one is counted, and a leaked one stays.
func settledProcessesMentioning(t *testing.T, id string) []string {
	t.Helper()
	last := processesMentioning(id)
	since := time.Now()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		now := processesMentioning(id)
		if !slices.Equal(now, last) {
			last, since = now, time.Now()
			continue
		}
		if time.Since(since) >= 500*time.Millisecond {
			break
		}
	}
	return last
}

// treeFiles lists the regular files under root, but for logs.
func treeFiles(t *testing.T, root string) []string {
	var out []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && !strings.HasSuffix(p, ".log") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// A tree three levels deep with two branches is listed as it is, and the
// diff between the two siblings names what was added, changed, removed,
// renamed and had its permissions changed. A fork from a checkpoint
// branches a new sandbox off it.
func TestCheckpointTree(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	ck1 := e.checkpoint(id, "-m", "empty")
	e.ok("exec", id, "--", "sh", "-c", "cd /root && echo c > c && echo r > r && echo moved > m && echo p > p && chmod 644 p")
	ck2 := e.checkpoint(id, "-m", "files")
	e.ok("exec", id, "--", "sh", "-c", "echo three > /root/only3")
	ck3 := e.checkpoint(id, "-m", "branch one")
	e.ok("restore", id, ck2)
	e.ok("exec", id, "--", "sh", "-c", "cd /root && echo added > added && echo c2 > c && rm r && mv m m2 && chmod 700 p")
	ck4 := e.checkpoint(id, "-m", "branch two")

	cks := e.checkpoints(id)
	parents := map[string]string{}
	for _, c := range cks {
		parents[c.ID] = c.Parent
	}
	want := map[string]string{ck1: "", ck2: ck1, ck3: ck2, ck4: ck2}
	if fmt.Sprint(parents) != fmt.Sprint(want) {
		t.Fatalf("parents %v, want %v", parents, want)
	}
	// Each checkpoint's memory is in chunks; only the current one's is
	// also whole. Restoring an evicted one makes it whole again.
	e.waitStored(id)
	e.ok("restore", id, ck3)
	e.waitStored(id)
	e.ok("restore", id, ck4)
	e.waitStored(id)
	for _, c := range e.checkpoints(id) {
		t.Logf("%s: memory %d bytes, %d of them new to the store", c.ID, c.MemorySize, c.MemoryStored)
	}
	tree := e.ok("checkpoint", "ls", id)
	lines := strings.Split(strings.TrimRight(tree, "\n"), "\n")
	shape := []string{"  " + ck1, "  └─ " + ck2, "     ├─ " + ck3, "*    └─ " + ck4}
	if len(lines) != 4 {
		t.Fatalf("tree:\n%s", tree)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, shape[i]+"  ") {
			t.Fatalf("tree line %d is %q, want it to begin %q:\n%s", i, l, shape[i], tree)
		}
	}
	if !strings.Contains(lines[3], "branch two") || !strings.Contains(lines[0], "empty") {
		t.Fatalf("tree lacks messages:\n%s", tree)
	}

	diff := e.ok("checkpoint", "diff", id, ck3, ck4)
	wantDiff := "A /root/added\nM /root/c\nD /root/only3\nM /root/p (mode 644 -> 700)\nD /root/r\nR /root/m -> /root/m2\n"
	if sortLines(diff) != sortLines(wantDiff) {
		t.Fatalf("diff %s %s:\n%s\nwant:\n%s", ck3, ck4, diff, wantDiff)
	}
	// Against the sandbox now: at ck4, nothing; then one change.
	if out := e.ok("checkpoint", "diff", id, ck4); out != "" {
		t.Fatalf("diff against the sandbox at the checkpoint: %q", out)
	}
	e.ok("exec", id, "--", "sh", "-c", "ln -s /root/c /root/link")
	if out := e.ok("checkpoint", "diff", id, ck4, "live"); out != "A /root/link -> /root/c\n" {
		t.Fatalf("diff against the sandbox now: %q", out)
	}
	var js []struct{ Kind, Path, From string }
	if err := json.Unmarshal([]byte(e.ok("checkpoint", "diff", "--format", "json", id, ck3, ck4)), &js); err != nil || len(js) != 6 {
		t.Fatalf("diff --format json: %v %+v", err, js)
	}

	// A fork from the first branch: its files are that branch's, and
	// the sandbox is left alone.
	kid := strings.TrimSpace(e.ok("fork", "--from", ck3))
	if got := fileIn(e, kid, "/root/only3"); got != "three\n" {
		t.Fatalf("fork from %s: /root/only3 is %q", ck3, got)
	}
	if got := fileIn(e, id, "/root/only3"); got != "absent\n" {
		t.Fatalf("the sandbox after a fork from its checkpoint: /root/only3 is %q", got)
	}
	// Removing a middle checkpoint: its children take its parent.
	e.ok("checkpoint", "rm", id, ck2)
	for _, c := range e.checkpoints(id) {
		if (c.ID == ck3 || c.ID == ck4) && c.Parent != ck1 {
			t.Fatalf("after removing %s, %s has parent %q", ck2, c.ID, c.Parent)
		}
	}
	// --keep 2: the two newest stay, the current one among them.
	ck5 := e.checkpoint(id, "--keep", "2")
	if got := e.checkpoints(id); len(got) != 2 || got[0].ID != ck4 || got[1].ID != ck5 || got[1].Parent != ck4 {
		t.Fatalf("after --keep 2: %+v", got)
	}
	e.ok("rm", "-f", id, kid)
	e.assertClean(id)
	e.assertClean(kid)
	e.assertNoCheckpointsLeft()
}

func sortLines(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	for i := range l {
		for j := i + 1; j < len(l); j++ {
			if l[j] < l[i] {
				l[i], l[j] = l[j], l[i]
			}
		}
	}
	return strings.Join(l, "\n")
}

// Bad names, another sandbox's checkpoint, a restore racing an exec and a
// sandbox removed in the middle of a checkpoint: clear errors, and
// nothing left.
func TestCheckpointHostile(t *testing.T) {
	e := newEnv(t)
	a := e.create()
	b := e.create()
	cka := e.checkpoint(a)
	for _, args := range [][]string{
		{"restore", a, "../../../etc/passwd"},
		{"restore", a, "/etc/passwd"},
		{"restore", a, "ck-../../../../"},
		{"checkpoint", "rm", a, "../" + cka},
		{"checkpoint", "diff", a, cka, "../x"},
		{"fork", "--from", "ck-0123/../../x"},
	} {
		assertOneLineError(t, e.run(nil, args...), "not a checkpoint ID")
	}
	assertOneLineError(t, e.run(nil, "checkpoint", "ls", "../../etc"), "not a valid ID")
	assertOneLineError(t, e.run(nil, "checkpoint", "-m", strings.Repeat("x", 2000), a), "at most 1024")
	// Another sandbox's checkpoint: not found, and that sandbox untouched.
	pid := e.inspect(b).Pid
	assertOneLineError(t, e.run(nil, "restore", b, cka), "has no checkpoint")
	assertOneLineError(t, e.run(nil, "checkpoint", "rm", b, cka), "has no checkpoint")
	assertOneLineError(t, e.run(nil, "checkpoint", "diff", b, cka), "has no checkpoint")
	if got := e.inspect(b); got.Pid != pid || got.State != "running" {
		t.Fatalf("sandbox %s after a restore to another's checkpoint: %+v", b, got)
	}
	if got := e.checkpoints(a); len(got) != 1 || got[0].ID != cka {
		t.Fatalf("the owner's checkpoints: %+v", got)
	}

	// A restore racing an exec: the exec ends with an error (its
	// process is not in the checkpoint); the sandbox runs at the
	// checkpoint.
	var wg sync.WaitGroup
	var racing result
	wg.Go(func() { racing = e.run(nil, "exec", a, "--", "sh", "-c", "echo started; sleep 5; echo finished") })
	waitFor(t, func() bool { return strings.Contains(strings.Join(processesMentioning("sleep 5"), ""), "sleep") })
	start := time.Now()
	e.ok("restore", a, cka)
	wg.Wait()
	if racing.code == 0 || strings.Contains(racing.stdout, "finished") || time.Since(start) > 4*time.Second {
		t.Fatalf("an exec racing a restore: %s", racing)
	}
	if strings.TrimSpace(racing.stderr) == "" {
		t.Fatalf("an exec ended by a restore says nothing on stderr: %s", racing)
	}
	if out := e.ok("exec", a, "--", "echo", "after"); out != "after\n" {
		t.Fatalf("exec after the restore: %q", out)
	}

	// A sandbox removed in the middle of a checkpoint: the checkpoint
	// either finished first or fails clearly; nothing of either is left.
	e.ok("exec", a, "--", "sh", "-c", "head -c 268435456 /dev/urandom > /tmp/resident")
	var ckr result
	wg.Go(func() { ckr = e.run(nil, "checkpoint", a) })
	time.Sleep(100 * time.Millisecond)
	e.ok("rm", "-f", a)
	wg.Wait()
	if ckr.code != 0 && strings.TrimSpace(ckr.stderr) == "" {
		t.Fatalf("a checkpoint of a removed sandbox: %s", ckr)
	}
	e.assertClean(a)
	e.ok("rm", "-f", b)
	e.assertClean(b)
	e.assertNoCheckpointsLeft()
}
