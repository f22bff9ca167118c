package integration

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/overlay"
)

// persistRecord is the part of `hutch inspect` the persistence tests read.
type persistRecord struct {
	ID          string `json:"id"`
	Image       string `json:"image"`
	State       string `json:"state"`
	Pid         int    `json:"pid"`
	Checkpoint  string `json:"checkpoint"`
	SetupCache  string `json:"setupCache"`
	ForkedFrom  string `json:"forkedFrom"`
	WatchdogPid int    `json:"watchdogPid"`
}

func (e *env) inspectPersist(id string) persistRecord {
	e.t.Helper()
	var r persistRecord
	e.inspectInto(id, &r)
	return r
}

// imageDigest is the manifest digest `hutch image ls` reports for name.
// topLayer is the digest of image name's last layer, or "".
func (e *env) topLayer(name string) string {
	e.t.Helper()
	var imgs []struct {
		Name   string
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal([]byte(e.ok("image", "ls", "--format", "json")), &imgs); err != nil {
		e.t.Fatal(err)
	}
	for _, img := range imgs {
		if (img.Name == name || img.Name == name+":latest") && len(img.Layers) > 0 {
			return img.Layers[len(img.Layers)-1].Digest
		}
	}
	return ""
}

func (e *env) imageDigest(name string) string {
	e.t.Helper()
	var imgs []struct {
		Name   string `json:"Name"`
		Digest string `json:"Digest"`
	}
	if err := json.Unmarshal([]byte(e.ok("image", "ls", "--format", "json")), &imgs); err != nil {
		e.t.Fatal(err)
	}
	for _, img := range imgs {
		if img.Name == name || img.Name == name+":latest" {
			return img.Digest
		}
	}
	return ""
}

// fsState describes, inside a sandbox, what the snapshot tests change.
const fsState = `for p in /root/new /root/owned /etc/passwd /etc/group /home/user /home/other /root/link; do
  if [ -e "$p" ] || [ -L "$p" ]; then stat -c '%n %A %u:%g' "$p"; else echo "$p absent"; fi
done; cat /root/new /root/owned; ls /home; readlink /root/link`

// A snapshot carries every change of the sandbox's filesystem, deletions
// and permission and ownership changes included, and never /run.
func TestSnapshotChanges(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	e.ok("exec", id, "--", "sh", "-c", `set -e
echo new > /root/new
rm /etc/group
rm -rf /home/user; mkdir /home/other
chmod 600 /etc/passwd
echo mine > /root/owned; chown 1000:1000 /root/owned; chmod 4750 /root/owned
ln -s /root/new /root/link
mkdir -p /run/secrets; echo hunter2 > /run/secrets/token`)
	before := e.ok("exec", id, "--", "sh", "-c", fsState)
	if !strings.Contains(before, "/etc/group absent") || !strings.Contains(before, "-rwsr-x--- 1000:1000") {
		t.Fatalf("changes not made:\n%s", before)
	}
	if out := e.ok("snapshot", "-t", "snap", id); out != "snap:latest\n" {
		t.Fatalf("snapshot prints the image name: %q", out)
	}
	child := e.create("--image", "snap")
	after := e.ok("exec", child, "--", "sh", "-c", fsState)
	if after != before {
		t.Fatalf("sandbox from the snapshot differs:\n--- original\n%s--- from snapshot\n%s", before, after)
	}
	// The secret and /run are not in the snapshot.
	if out := e.ok("exec", child, "--", "sh", "-c", "ls -R /run 2>/dev/null; true"); out != "" {
		t.Fatalf("/run reached the snapshot:\n%s", out)
	}

	// Without changes in between, the same sandbox gives the same image.
	e.ok("snapshot", "-t", "snap-again", id)
	if a, b := e.imageDigest("snap"), e.imageDigest("snap-again"); a == "" || a != b {
		t.Fatalf("identical changes gave digests %s and %s", a, b)
	}
	e.ok("rm", "-f", id, child)
	e.assertClean(id)
	e.assertClean(child)
}

// The runsc hutch builds exports a sandbox's changes with every directory's
// entries in name order, so a snapshot stores them as they stream, and the
// layer is the one sorting the same export in another order gives.
func TestSnapshotOrder(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	e.ok("exec", id, "--", "sh", "-c", orderScript)
	_, entries, names := exportNames(t, e, filepath.Join(e.bin, "runsc"), id)
	if ok, x, y := inNameOrder(names); !ok {
		t.Fatalf("runsc's export is not in name order: %q before %q", x, y)
	}

	// hutch's snapshot streams the export. Its layer is the one the sorted
	// conversion gives from the same export in another order (here
	// reversed), what a runsc without tools/runsc/tarorder.patch writes.
	e.ok("snapshot", "-t", "streamed", id)
	streamed := e.topLayer("streamed")
	if got := sortedLayer(t, e, reversedTar(t, entries)); streamed == "" || got != streamed {
		t.Fatalf("the streamed snapshot's layer is %s, the sorted conversion's of the reversed export %s", streamed, got)
	}
	child := e.create("--image", "streamed")
	checkOrderFiles(t, e, child)
	e.ok("rm", "-f", id, child)
	e.assertClean(id)
}

// A snapshot of a sandbox whose process keeps writing to its files (a
// server's logs, through descriptors it holds open) succeeds, and each file
// in it holds what had been written by some moment: whole lines. runsc's
// export (tools/runsc/tarstream.patch) writes a file to its header's size;
// it failed ("archive/tar: write too long") when the file grew between its
// header and its content. A large file before each growing one fills the
// export's pipe, so that the growing one's header waits for room there,
// and the file grows meanwhile.
func TestSnapshotWhileFilesGrow(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	const line = "a line of the log\n"
	e.ok("exec", id, "--", "sh", "-c", "mkdir /logs && for f in a c e; do head -c 8388608 /dev/zero > /logs/$f; done")
	e.ok("exec", "-d", id, "--", "sh", "-c",
		"cd /logs && exec 3>>b 4>>d 5>>f && "+
			"while :; do for fd in 3 4 5; do printf 'a line of the log\\n' >&$fd; done; done")
	waitFor(t, func() bool { return e.run(nil, "exec", id, "--", "test", "-s", "/logs/f").code == 0 })
	var tags []string
	for i := range 10 {
		tag := fmt.Sprintf("growing:%d", i)
		if r := e.run(nil, "snapshot", "-t", tag, id); r.code != 0 {
			t.Fatalf("snapshot %d while files grow: %s", i, r)
		}
		tags = append(tags, tag)
	}
	for _, tag := range tags {
		// Every growing file is whole lines of the one line: nothing
		// torn, no zeros, no other file's bytes.
		out := e.ok("run", "--rm", "--image", tag, "--", "sh", "-c",
			`cd /logs && for f in b d f; do n=$(wc -c < $f); l=$(grep -c -x 'a line of the log' $f); echo "$f $n $l"; done`)
		for _, f := range strings.Split(strings.TrimSpace(out), "\n") {
			var name string
			var size, lines int
			if _, err := fmt.Sscan(f, &name, &size, &lines); err != nil || size == 0 || size != lines*len(line) {
				t.Errorf("%s: /logs/%s holds %d bytes, %d of them in whole lines (%v)", tag, name, size, lines*len(line), err)
			}
		}
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
}

// A sandbox holding a file larger than its memory limit can be
// snapshotted and keeps running: runsc's export (tools/runsc/tarstream.patch)
// no longer reads each file whole into the sandbox's memory, which got the
// sandbox killed for running out of it.
func TestSnapshotFileLargerThanMemory(t *testing.T) {
	e := newEnv(t)
	id := e.create("--memory", "128m")
	e.ok("exec", id, "--", "sh", "-c", "head -c 201326592 /dev/urandom > /root/big")
	sum := e.ok("exec", id, "--", "sha256sum", "/root/big")
	e.ok("snapshot", "-t", "big", id)
	if st := e.inspect(id).State; st != "running" {
		t.Fatalf("after the snapshot the sandbox is %s", st)
	}
	child := e.create("--image", "big", "--memory", "128m")
	if got := e.ok("exec", child, "--", "sha256sum", "/root/big"); got != sum {
		t.Fatalf("the file in a sandbox from the snapshot: %q, want %q", got, sum)
	}
	e.ok("rm", "-f", id, child)
	e.assertClean(id)
}

// orderScript makes files out of name order, in several directories;
// "a", "a-b", "a.txt" and "a/x" order differently per directory than as
// whole paths.
const orderScript = `set -e
for d in /root/q /root/b /root/m /etc/z /etc/c; do mkdir -p $d; for i in 9 3 7 1 8 2 6 4 5 0 13 11 12 10; do echo $d$i > $d/f$i; done; done
cd /root; echo 3 > a.txt; echo 2 > a-b; mkdir a; echo 1 > a/x; rm /etc/group`

// checkOrderFiles checks what orderScript left in a sandbox made from a
// snapshot of one it ran in.
func checkOrderFiles(t *testing.T, e *env, id string) {
	t.Helper()
	if got := e.ok("exec", id, "--", "sh", "-c", "cat /root/a/x /root/a-b /root/a.txt /etc/z/f13; ls /etc/group 2>&1 || true"); !strings.Contains(got, "1\n2\n3\n/etc/z13\n") || !strings.Contains(got, "No such file") {
		t.Fatalf("sandbox from the snapshot: %q", got)
	}
}

// exportNames exports the upper layer of sandbox id with `runsc tar
// rootfs-upper` of the runsc at runscPath and returns the export and its
// entries' names.
func exportNames(t *testing.T, e *env, runscPath, id string) (string, []tarEntry, []string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "upper.tar")
	runscCmd := exec.Command(runscPath, "--root", filepath.Join(e.root, "runsc"), "tar", "rootfs-upper", "--file", out, id)
	if b, err := runscCmd.CombinedOutput(); err != nil {
		t.Fatalf("runsc tar rootfs-upper: %v: %s", err, b)
	}
	entries := readTar(t, out)
	var names []string
	for _, en := range entries {
		names = append(names, strings.TrimSuffix(strings.TrimPrefix(en.hdr.Name, "./"), "/"))
	}
	if len(names) < 70 {
		t.Fatalf("the export holds %d entries: %v", len(names), names)
	}
	return out, entries, names
}

// inNameOrder reports whether names are in name order per directory
// ('/' before every other byte), or the first two that are not.
func inNameOrder(names []string) (bool, string, string) {
	for i := 1; i < len(names); i++ {
		a, b := strings.ReplaceAll(names[i-1], "/", "\x00"), strings.ReplaceAll(names[i], "/", "\x00")
		if a >= b {
			return false, names[i-1], names[i]
		}
	}
	return true, "", ""
}

// sortedLayer is the digest of the layer the image store's sorted
// conversion makes of the upper layer export upper, on busybox.
func sortedLayer(t *testing.T, e *env, upper *os.File) string {
	t.Helper()
	s, err := overlay.Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	bb, err := os.Open(filepath.Join(e.bin, "images", "busybox.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer bb.Close()
	ctx := context.Background()
	parent, err := s.Import(ctx, "busybox", bb)
	if err != nil {
		t.Fatal(err)
	}
	sorted, err := s.Snapshot(ctx, overlay.SnapshotOptions{Name: "sorted", Parent: parent, Upper: upper, Exclude: []string{"/run", "/.hutch"}})
	if err != nil {
		t.Fatal(err)
	}
	return sorted.Layers[len(sorted.Layers)-1].Digest.String()
}

// A runsc from elsewhere, here the pinned one without tools/runsc's
// patches, exports a directory's entries in map order and holds each
// file whole in its sentry while it exports it. A snapshot of its sandbox
// is still the layer the sorted conversion gives, and a sparse file larger
// than --disk is refused by name before the export, which would have
// allocated its apparent size and killed the sandbox.
func TestSnapshotUnpatchedRunsc(t *testing.T) {
	e := newEnv(t)
	unpatched := filepath.Join(e.bin, "runsc-unpatched")
	if _, err := os.Stat(unpatched); err != nil {
		t.Fatalf("%v (`make test` builds it)", err)
	}
	id := strings.TrimSpace(e.ok("--runsc", unpatched, "create", "--image", "busybox", "--disk", "64m"))
	e.ok("--runsc", unpatched, "exec", id, "--", "sh", "-c", orderScript+"\ndd of=/root/huge bs=1048576 seek=1048576 count=0 2>/dev/null")

	r := e.run(nil, "--runsc", unpatched, "snapshot", "-t", "huge", id)
	if r.code == 0 || !strings.Contains(r.stderr, "/root/huge") || !strings.Contains(r.stderr, "--disk") {
		t.Fatalf("snapshot of a 1 TiB sparse file in a --disk 64m sandbox of a runsc that holds files whole: %s", r)
	}
	if r := e.run(nil, "--runsc", unpatched, "exec", id, "--", "rm", "/root/huge"); r.code != 0 {
		t.Fatalf("the sandbox did not survive the refused snapshot: %s", r)
	}

	upper, _, names := exportNames(t, e, unpatched, id)
	if ok, _, _ := inNameOrder(names); ok {
		t.Fatalf("the unpatched runsc's export is in name order, so this test cannot tell the sorted path from the streamed one: %v", names)
	}
	r = e.run(nil, "--log-level", "debug", "--runsc", unpatched, "snapshot", "-t", "fallback", id)
	if r.code != 0 || !strings.Contains(r.stderr, "not in name order") {
		t.Fatalf("snapshot with the unpatched runsc (expected it to sort a copy): %s", r)
	}
	f, err := os.Open(upper)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, want := e.topLayer("fallback"), sortedLayer(t, e, f); got == "" || got != want {
		t.Fatalf("the snapshot's layer is %s, the sorted conversion's of runsc's export %s", got, want)
	}
	child := e.create("--image", "fallback")
	checkOrderFiles(t, e, child)
	e.ok("rm", "-f", id, child)
	e.assertClean(id)
}

// readTar reads the tar at p whole, headers as they are (tarOf, which
// writes entries back, sets their times and format).
func readTar(t *testing.T, p string) []tarEntry {
	t.Helper()
	in, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var entries []tarEntry
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, tarEntry{hdr: *h, body: b})
	}
}

// reversedTar writes entries in reverse order to a new tar file, rewound.
func reversedTar(t *testing.T, entries []tarEntry) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "reversed.tar"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tw := tar.NewWriter(f)
	for i := len(entries) - 1; i >= 0; i-- {
		if err := tw.WriteHeader(&entries[i].hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write(entries[i].body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	return f
}

// Snapshots of sandboxes made from snapshots chain.
func TestSnapshotChain(t *testing.T) {
	e := newEnv(t)
	image := "busybox"
	var ids []string
	for i := 1; i <= 3; i++ {
		id := e.create("--image", image)
		ids = append(ids, id)
		n := strconv.Itoa(i)
		e.ok("exec", id, "--", "sh", "-c", "echo "+n+" > /root/layer"+n+"; echo "+n+" > /root/top; rm -f /root/layer"+strconv.Itoa(i-1))
		image = "chain" + n
		e.ok("snapshot", "-t", image, id)
	}
	last := e.create("--image", image)
	out := e.ok("exec", last, "--", "sh", "-c", "ls /root; cat /root/top")
	if out != "layer3\ntop\n3\n" {
		t.Fatalf("after three snapshots /root is %q, want layer3 and top=3", out)
	}
	var imgs []struct {
		Name   string
		Layers []json.RawMessage
	}
	json.Unmarshal([]byte(e.ok("image", "ls", "--format", "json")), &imgs)
	layers := map[string]int{}
	for _, img := range imgs {
		layers[img.Name] = len(img.Layers)
	}
	if layers["chain3:latest"] != layers["busybox:latest"]+3 {
		t.Fatalf("chain3 should be busybox plus three layers: %v", layers)
	}
	for _, id := range append(ids, last) {
		e.ok("rm", "-f", id)
		e.assertClean(id)
	}
}

// The second create with the same image and setup commands starts from the
// cached result: /root/ran, appended to by the setup, has one line.
func TestSetupCache(t *testing.T) {
	e := newEnv(t)
	setup := []string{"--setup", "echo ran >> /root/ran", "--setup", "mkdir -p /opt/app && echo built > /opt/app/out"}
	first := e.create(setup...)
	if r := e.inspectPersist(first); r.SetupCache != "ran" {
		t.Fatalf("first create: setupCache %q, want ran", r.SetupCache)
	}
	second := e.create(setup...)
	r := e.inspectPersist(second)
	if r.SetupCache != "hit" || !strings.HasPrefix(r.Image, "hutch-setup/") {
		t.Fatalf("second create: %+v, want a cache hit", r)
	}
	if out := e.ok("exec", second, "--", "sh", "-c", "cat /root/ran /opt/app/out"); out != "ran\nbuilt\n" {
		t.Fatalf("setup ran again or its result is missing: %q", out)
	}
	// Other commands are another key.
	other := e.create("--setup", "echo ran >> /root/ran")
	if r := e.inspectPersist(other); r.SetupCache != "ran" {
		t.Fatalf("different setup: %+v", r)
	}
	// A failing setup fails the create and leaves nothing.
	before := e.sandboxDirs()
	assertOneLineError(t, e.run(nil, "create", "--image", "busybox", "--setup", "echo oops; exit 3"), "exit status 3")
	if after := e.sandboxDirs(); len(after) != len(before) {
		t.Fatalf("a failed setup left a sandbox: %v", after)
	}

	// Prune keeps cached results in use, then removes them once unused.
	e.ok("image", "prune")
	if e.imageDigest(r.Image) == "" {
		t.Fatal("prune removed a cached setup result a sandbox uses")
	}
	e.ok("rm", "-f", first, second, other)
	e.ok("image", "prune")
	if out := e.ok("image", "ls"); strings.Contains(out, "hutch-setup/") {
		t.Fatalf("prune kept unused setup results:\n%s", out)
	}
	if r := e.inspectPersistAfterCreate(setup...); r.SetupCache != "ran" {
		t.Fatalf("after prune the setup must run again: %+v", r)
	}
}

func (e *env) inspectPersistAfterCreate(args ...string) persistRecord {
	e.t.Helper()
	return e.inspectPersist(e.create(args...))
}

// startServices starts a counter loop and an HTTP server with exec -d.
func startServices(e *env, id string) {
	e.t.Helper()
	e.ok("exec", "-d", id, "--", "sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /root/count.new; mv /root/count.new /root/count; echo tick $i; sleep 0.1; done")
	e.ok("exec", id, "--", "sh", "-c", "mkdir -p /www && echo hello-from-httpd > /www/index.html")
	e.ok("exec", "-d", id, "--", "httpd", "-f", "-p", "8080", "-h", "/www")
	waitFor(e.t, func() bool {
		r := e.run(nil, "exec", id, "--", "wget", "-qO-", "http://127.0.0.1:8080/")
		return r.stdout == "hello-from-httpd\n"
	})
}

func (e *env) counter(id string) int {
	e.t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(e.ok("exec", id, "--", "cat", "/root/count")))
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// assertServing checks that the counter moves on and httpd answers.
func assertServing(e *env, id string) {
	e.t.Helper()
	n := e.counter(id)
	waitFor(e.t, func() bool { return e.counter(id) > n })
	if out := e.ok("exec", id, "--", "wget", "-qO-", "http://127.0.0.1:8080/"); out != "hello-from-httpd\n" {
		e.t.Fatalf("httpd: %q", out)
	}
}

// Pause keeps the sandbox's state on disk only; resume, from fresh hutch
// processes, continues every process, including ones started after create.
func TestPauseResume(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	startServices(e, id)
	e.ok("pause", id)
	r := e.inspectPersist(id)
	if r.State != "paused" || r.Checkpoint == "" || r.Pid != 0 {
		t.Fatalf("after pause: %+v", r)
	}
	// The pause returns once the sandbox is killed; what is left of it
	// goes in the background, in about a second at most.
	deadline := time.Now().Add(5 * time.Second)
	for len(processesMentioning(id)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if left := processesMentioning(id); len(left) > 0 {
		t.Fatalf("a paused sandbox still has processes 5s after its pause:\n%s", strings.Join(left, "\n"))
	}
	assertOneLineError(t, e.run(nil, "exec", id, "--", "true"), "paused")
	assertOneLineError(t, e.run(nil, "pause", id), "not running")
	if got := e.list(); len(got) != 1 || got[0].State != "paused" {
		t.Fatalf("ls: %+v", got)
	}

	e.ok("resume", id)
	if r := e.inspectPersist(id); r.State != "running" || r.Checkpoint != "" {
		t.Fatalf("after resume: %+v", r)
	}
	assertServing(e, id)
	// Twice in a row, and the log goes on across both.
	e.ok("pause", id)
	e.ok("resume", id)
	assertServing(e, id)
	logs := e.ok("logs", id)
	if !strings.Contains(logs, " init started ") || !strings.Contains(logs, " tick ") {
		t.Fatalf("logs lack the init's and the loop's lines:\n%.2000s", logs)
	}
	last := strings.Split(strings.TrimSpace(logs), "\n")
	ts, err := time.Parse(time.RFC3339Nano, strings.Fields(last[len(last)-1])[0])
	if err != nil || time.Since(ts) > time.Minute {
		t.Fatalf("last log line has no current timestamp: %q (%v)", last[len(last)-1], err)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
	// The checkpoints of the resumes go in the background too.
	waitFor(t, func() bool {
		m, _ := filepath.Glob(filepath.Join(e.root, "images", "checkpoints", "*"))
		return len(m) == 0
	})
}

// A pause ends in the background (its checksums, the teardown of the
// sandbox's runtime); an rm or a stop right after it does that work
// itself and leaves nothing: no process, no checkpoint, no runtime.
func TestPauseThenRemoveAtOnce(t *testing.T) {
	e := newEnv(t)
	for _, verb := range []string{"rm", "stop"} {
		id := e.create()
		e.ok("exec", id, "--", "sh", "-c", "head -c 67108864 /dev/urandom > /tmp/resident")
		e.ok("pause", id)
		if verb == "stop" {
			e.ok("stop", id)
			if r := e.inspectPersist(id); r.State != "stopped" || r.Checkpoint != "" {
				t.Fatalf("stopped right after its pause: %+v", r)
			}
		}
		e.ok("rm", "-f", id)
		e.assertClean(id)
		if m := e.visibleCheckpoints(); len(m) > 0 {
			t.Fatalf("%s right after a pause left checkpoints %v", verb, m)
		}
	}
}

// A pause's detached end (docs/decisions/0029) still checksums the
// checkpoint after it has removed the sandbox's runtime: a rm meanwhile
// ends it too, and leaves nothing.
func TestRemoveWhilePauseChecksums(t *testing.T) {
	e := newEnv(t)
	for try := 1; ; try++ {
		id := e.create()
		// 512 MiB to checksum take the finisher far longer than the
		// runtime's removal.
		e.ok("exec", id, "--", "sh", "-c", "head -c 536870912 /dev/urandom > /tmp/resident")
		e.ok("pause", id)
		caught := waitChecksumOnly(e, id)
		e.ok("rm", "-f", id)
		e.assertClean(id)
		if caught {
			return
		}
		if try == 3 {
			t.Fatal("three times, the pause's end had finished before its runtime was seen removed")
		}
	}
}

// waitChecksumOnly waits until paused sandbox id's runtime state is gone
// while the process that ends its pause still runs, and reports whether
// it saw that.
func waitChecksumOnly(e *env, id string) bool {
	e.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		finisher := false
		for _, p := range processesMentioning(id) {
			finisher = finisher || strings.Contains(p, engine.FinishPauseCommand)
		}
		if !finisher {
			return false
		}
		if m, _ := filepath.Glob(filepath.Join(e.root, "runsc", id+"*")); len(m) == 0 {
			return true
		}
	}
	e.t.Fatalf("the pause of %s was still ending after 10 s", id)
	return false
}

// A paused sandbox survives everything of the host's runtime state going
// away (as after a reboot): only its record and checkpoint matter.
func TestResumeAfterStateReload(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	startServices(e, id)
	e.ok("pause", id)
	// runsc's own state is gone after a reboot.
	os.RemoveAll(filepath.Join(e.root, "runsc"))
	os.MkdirAll(filepath.Join(e.root, "runsc"), 0o711)
	e.ok("resume", id)
	assertServing(e, id)
	e.ok("stop", id)
	if r := e.inspectPersist(id); r.State != "stopped" {
		t.Fatalf("after stop: %+v", r)
	}
	e.ok("rm", id)
	e.assertClean(id)
}

// Fork makes independent running copies, each with its own ID, hostname
// and filesystem.
func TestFork(t *testing.T) {
	e := newEnv(t)
	parent := e.create()
	startServices(e, parent)
	out := e.ok("fork", "--count", "3", parent)
	kids := strings.Fields(out)
	if len(kids) != 3 {
		t.Fatalf("fork --count 3 printed %q", out)
	}
	seen := map[string]bool{parent: true}
	for i, k := range kids {
		if seen[k] {
			t.Fatalf("duplicate ID %s", k)
		}
		seen[k] = true
		r := e.inspectPersist(k)
		if r.State != "running" || r.ForkedFrom != parent {
			t.Fatalf("fork %s: %+v", k, r)
		}
		if h := e.ok("exec", k, "--", "hostname"); h != k[:12]+"\n" {
			t.Fatalf("fork %s hostname %q", k, h)
		}
		assertServing(e, k)
		e.ok("exec", k, "--", "sh", "-c", "echo "+strconv.Itoa(i)+" > /root/mine")
	}
	for i, k := range kids {
		if got := e.ok("exec", k, "--", "cat", "/root/mine"); got != strconv.Itoa(i)+"\n" {
			t.Fatalf("fork %d sees %q: filesystems are shared", i, got)
		}
	}
	if r := e.run(nil, "exec", parent, "--", "cat", "/root/mine"); r.code == 0 {
		t.Fatal("the parent sees a fork's file")
	}
	assertServing(e, parent)
	assertOneLineError(t, e.run(nil, "fork", "--count", "0", parent), "count")
	for _, id := range append(kids, parent) {
		e.ok("rm", "-f", id)
		e.assertClean(id)
	}
}

// kill9During starts hutch args and kills it with SIGKILL after delay.
func kill9During(e *env, delay time.Duration, args ...string) {
	e.t.Helper()
	c := e.cmd(nil, args...)
	if err := c.Start(); err != nil {
		e.t.Fatal(err)
	}
	time.Sleep(delay)
	c.Process.Signal(syscall.SIGKILL)
	c.Wait()
}

// visibleCheckpoints lists the checkpoint directories a user could see.
func (e *env) visibleCheckpoints() []string {
	m, _ := filepath.Glob(filepath.Join(e.root, "images", "checkpoints", "[0-9a-f]*"))
	return m
}

// hutch killed in the middle of a snapshot or a pause leaves no partial
// image or checkpoint, and the sandbox usable.
func TestKilledSnapshotAndPause(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	e.ok("exec", id, "--", "sh", "-c", "head -c 104857600 /dev/urandom > /root/big")
	for _, delay := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond} {
		kill9During(e, delay, "snapshot", "-t", "partial", id)
		// runsc tar may still be writing; whatever it leaves is not an image.
		if out := e.ok("image", "ls"); strings.Contains(out, "partial") {
			// The snapshot may have completed before the kill: then it is whole.
			child := e.create("--image", "partial")
			if n := e.ok("exec", child, "--", "sh", "-c", "wc -c < /root/big"); strings.TrimSpace(n) != "104857600" {
				t.Fatalf("an image left by a killed snapshot is incomplete: %q", n)
			}
			e.ok("rm", "-f", child)
			e.ok("image", "rm", "partial")
		}
		if got := e.inspect(id).State; got != "running" {
			t.Fatalf("after a killed snapshot the sandbox is %s", got)
		}
	}
	e.ok("snapshot", "-t", "whole", id)

	startServices(e, id)
	for _, delay := range []time.Duration{20 * time.Millisecond, 150 * time.Millisecond} {
		kill9During(e, delay, "pause", id)
		waitFor(t, func() bool { return len(processesMentioning("checkpoint")) == 0 })
		r := e.inspectPersist(id)
		switch r.State {
		case "running":
			if len(e.visibleCheckpoints()) != 0 {
				t.Fatalf("a killed pause left a visible checkpoint: %v", e.visibleCheckpoints())
			}
		case "paused":
			if len(e.visibleCheckpoints()) != 1 {
				t.Fatalf("a paused sandbox has checkpoints %v", e.visibleCheckpoints())
			}
			e.ok("resume", id)
		default:
			t.Fatalf("after a killed pause the sandbox is %s", r.State)
		}
		assertServing(e, id)
	}
	// Prune removes what the killed commands left hidden.
	e.ok("image", "prune")
	if m, _ := filepath.Glob(filepath.Join(e.root, "images", "checkpoints", ".*")); len(m) > 0 {
		t.Fatalf("prune left checkpoint leftovers: %v", m)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
}

// flipByte flips one byte in the middle of file p.
func flipByte(t *testing.T, p string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	b := make([]byte, 1)
	off := fi.Size() / 2
	f.ReadAt(b, off)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// A flipped byte in a snapshot layer or in a checkpoint is detected and
// nothing is started from it.
func TestCorruptLayerAndCheckpoint(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	e.ok("exec", id, "--", "sh", "-c", "head -c 100000 /dev/urandom > /root/data")
	e.ok("snapshot", "-t", "flipped", id)
	layer := e.topLayer("flipped")
	flipByte(t, filepath.Join(e.root, "images", "oci", "blobs", "sha256", strings.TrimPrefix(layer, "sha256:")))
	before := e.sandboxDirs()
	assertOneLineError(t, e.run(nil, "create", "--image", "flipped"), "digest")
	if after := e.sandboxDirs(); len(after) != len(before) {
		t.Fatalf("a create from a corrupt layer left a sandbox: %v", after)
	}

	e.ok("pause", id)
	ck := e.visibleCheckpoints()
	if len(ck) != 1 {
		t.Fatalf("checkpoints: %v", ck)
	}
	// Damage on disk, after the pause has checksummed the checkpoint in
	// the background (its detached end, which mentions the sandbox).
	waitFor(t, func() bool { return len(processesMentioning(id)) == 0 })
	flipByte(t, filepath.Join(ck[0], "image", "pages.img"))
	assertOneLineError(t, e.run(nil, "resume", id), "pages.img")
	if r := e.inspectPersist(id); r.State != "paused" {
		t.Fatalf("after a refused resume: %+v", r)
	}
	if left := processesMentioning(id); len(left) > 0 {
		t.Fatalf("a refused resume started processes: %v", left)
	}
	// Truncated: refused too.
	os.Truncate(filepath.Join(ck[0], "image", "checkpoint.img"), 10)
	assertOneLineError(t, e.run(nil, "resume", id), "checkpoint.img")
	e.ok("rm", "-f", id)
	e.assertClean(id)
}

// When its lifetime ends a sandbox is paused (by default) and resume
// brings it back; its watchdog goes with stop, rm and pause.
func TestLifetime(t *testing.T) {
	e := newEnv(t)
	assertOneLineError(t, e.run(nil, "create", "--image", "busybox", "--timeout", "1m", "--on-timeout", "explode"), "on-timeout")
	id := e.create("--timeout", "2s")
	r := e.inspectPersist(id)
	if r.WatchdogPid == 0 || !processAlive(r.WatchdogPid) {
		t.Fatalf("no watchdog: %+v", r)
	}
	e.ok("exec", id, "--", "sh", "-c", "echo kept > /root/kept")
	waitFor(t, func() bool { return e.inspectPersist(id).State == "paused" })
	waitFor(t, func() bool { return !processAlive(r.WatchdogPid) })
	e.ok("resume", id)
	if out := e.ok("exec", id, "--", "cat", "/root/kept"); out != "kept\n" {
		t.Fatalf("after the lifetime pause and resume: %q", out)
	}
	r2 := e.inspectPersist(id)
	if r2.WatchdogPid == 0 || r2.WatchdogPid == r.WatchdogPid {
		t.Fatalf("resume must start a new lifetime: %+v", r2)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)

	gone := e.create("--timeout", "1s", "--on-timeout", "rm")
	waitFor(t, func() bool { return e.run(nil, "inspect", gone).code != 0 })
	e.assertClean(gone)

	stopped := e.create("--timeout", "1h")
	w := e.inspectPersist(stopped).WatchdogPid
	e.ok("stop", stopped)
	if processAlive(w) {
		t.Fatal("stop left the watchdog running")
	}
	e.ok("rm", stopped)
	e.assertClean(stopped)

	// run --rm with a lifetime: the command ends when the lifetime does.
	done := make(chan result, 1)
	go func() {
		done <- e.run(nil, "run", "--rm", "--image", "busybox", "--timeout", "2s", "--", "sleep", "600")
	}()
	select {
	case r := <-done:
		if r.code == 0 {
			t.Fatalf("run --rm past its lifetime succeeded: %s", r)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("run --rm --timeout 2s still runs its command after 120 s")
	}
	if d := e.sandboxDirs(); len(d) != 0 {
		t.Fatalf("run --rm --timeout left state behind: %v", d)
	}
}

// exec -d reports commands that cannot start, like exec.
func TestExecDetachStatuses(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	if r := e.run(nil, "exec", "-d", id, "--", "no-such-command"); r.code != 127 {
		t.Fatalf("not found: %s", r)
	}
	if r := e.run(nil, "exec", "-d", id, "--", "/etc/passwd"); r.code != 126 {
		t.Fatalf("not executable: %s", r)
	}
	out := e.ok("exec", "-d", "--user", "1000", id, "--", "sh", "-c", "id -u; sleep 600")
	if _, err := strconv.Atoi(strings.TrimSpace(out)); err != nil {
		t.Fatalf("exec -d prints the PID inside the sandbox: %q", out)
	}
	waitFor(t, func() bool { return strings.Contains(e.ok("logs", id), " 1000\n") })
	e.ok("rm", "-f", id)
	e.assertClean(id)
}
