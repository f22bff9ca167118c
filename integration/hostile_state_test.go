package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// duBytes is the disk space the files under dir take.
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Sys().(*syscall.Stat_t).Blocks * 512
			}
		}
		return nil
	})
	return n
}

// A 1 TiB sparse file costs a --disk 64m sandbox nothing; snapshotting or
// copying it must neither write it to the host's disk, take long, nor
// kill the sandbox. Many sparse files that each fit --disk but add up to
// more are refused too.
func TestHostileSparseFileSnapshot(t *testing.T) {
	e := newEnv(t)
	id := e.create("--disk", "64m")
	before := duBytes(t, e.root)
	e.ok("exec", id, "--", "sh", "-c", "dd of=/root/huge bs=1048576 seek=1048576 count=0 2>/dev/null && echo data > /root/keep")

	start := time.Now()
	r := e.run(nil, "snapshot", "-t", "sparse", id)
	if r.code == 0 {
		t.Fatalf("snapshot of a sandbox with a 1 TiB sparse file succeeded: %s", r)
	}
	if !strings.Contains(r.stderr, "/root/huge") || !strings.Contains(r.stderr, "--disk") {
		t.Errorf("snapshot error does not name the file and --disk: %s", r)
	}
	r = e.run(nil, "cp", id+":/root/huge", filepath.Join(t.TempDir(), "huge"))
	if r.code == 0 || !strings.Contains(r.stderr, "/root/huge") {
		t.Errorf("cp of a 1 TiB sparse file out of a --disk 64m sandbox: %s", r)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("refusing a sparse file took %v", d)
	}
	if r := e.run(nil, "exec", id, "--", "cat", "/root/keep"); r.code != 0 || r.stdout != "data\n" {
		t.Fatalf("the sandbox did not survive the refused snapshot: %s", r)
	}

	// Each fits --disk, together they do not.
	e.ok("exec", id, "--", "sh", "-c", "rm /root/huge && for i in 1 2 3 4 5 6 7 8; do dd of=/root/s$i bs=1048576 seek=48 count=0 2>/dev/null; done")
	if r := e.run(nil, "snapshot", "-t", "sparse", id); r.code == 0 || !strings.Contains(r.stderr, "--disk") {
		t.Errorf("snapshot of 8 sparse files of 48 MiB in a --disk 64m sandbox: %s", r)
	}
	if grew := duBytes(t, e.root) - before; grew > 8<<20 {
		t.Errorf("the state root grew by %d bytes", grew)
	}

	// What fits is snapshotted and runs.
	e.ok("exec", id, "--", "sh", "-c", "rm /root/s*")
	e.ok("snapshot", "-t", "sparse", id)
	if out := e.ok("run", "--rm", "--image", "sparse", "--", "cat", "/root/keep"); out != "data\n" {
		t.Errorf("run on the snapshot: %q", out)
	}
}

// A paused sandbox's checkpoint holds its memory, so its secrets: it is
// owner-only whatever the umask, unreadable by another host user, and
// gone with the sandbox. The state root and its control sockets are
// owner-only too.
func TestHostileCheckpointAtRest(t *testing.T) {
	e := newEnv(t)
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	e.root = filepath.Join(base, "hutch")
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	u := rootlessUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	other := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}

	b := make([]byte, 16)
	rand.Read(b)
	secret := "S3CRET" + hex.EncodeToString(b)
	e.extra = append(e.extra, "HOSTILE_TOKEN="+secret)
	id := e.create("--secret", "TOKEN=env:HOSTILE_TOKEN")
	e.ok("exec", id, "--", "sh", "-c", `printf %s "$TOKEN" > /root/copy; sleep 1000 & true`)

	for _, d := range []string{e.root, filepath.Join(e.root, "sandboxes"), filepath.Join(e.root, "runsc")} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v (%v), want 0700 under umask 000", d, fi.Mode().Perm(), err)
		}
	}
	socks, _ := filepath.Glob(filepath.Join(e.root, "runsc", "*.sock"))
	for _, s := range socks {
		if out, err := asUser(other, "connect", s); err == nil || !strings.Contains(out, "ermission denied") {
			t.Errorf("another user connecting to %s: %v: %s", s, err, out)
		}
	}

	e.ok("pause", id)
	var files []string
	filepath.WalkDir(filepath.Join(e.root, "images", "checkpoints"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, _ := d.Info()
		switch {
		case d.IsDir() && fi.Mode().Perm() != 0o700:
			t.Errorf("checkpoint directory %s is %v, want 0700", p, fi.Mode().Perm())
		case !d.IsDir() && fi.Mode().Perm() != 0o600:
			t.Errorf("checkpoint file %s is %v, want 0600", p, fi.Mode().Perm())
		}
		if !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) == 0 {
		t.Fatal("no checkpoint files after pause")
	}
	for _, f := range files {
		if out, err := asUser(other, "read", f); err == nil || !strings.Contains(out, "ermission denied") {
			t.Errorf("another user reading the checkpoint file %s: %v: %s", f, err, out)
		}
	}

	e.ok("rm", "-f", id)
	filepath.WalkDir(e.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(secret)) {
			t.Errorf("after rm, %s holds the secret", p)
		}
		return nil
	})
}

// asUser tries, as cred, to read a byte of a file ("read") or to connect
// to a UNIX socket ("connect"); it fails unless that succeeded.
func asUser(cred *syscall.Credential, op, arg string) (string, error) {
	var c *exec.Cmd
	switch op {
	case "read":
		c = exec.Command("head", "-c", "1", arg)
	case "connect":
		c = exec.Command("/usr/bin/python3", "-c", "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])", arg)
	}
	c.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := c.CombinedOutput()
	return string(out), err
}

// A state root another user made first is refused, whoever runs hutch: the
// /tmp/hutch-<uid> fallback made by someone else, and a root owned by
// another user.
func TestHostileStateRootPrecreated(t *testing.T) {
	e := newRootlessEnv(t)
	u := rootlessUser(t)
	fallback := "/tmp/hutch-" + u.Uid
	os.RemoveAll(fallback)
	if err := os.Mkdir(fallback, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(fallback) })
	if err := os.Chmod(fallback, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(fallback, 65534, 65534); err != nil { // nobody
		t.Fatal(err)
	}
	noHome := *e
	noHome.extra = []string{"HOME=", "XDG_DATA_HOME=", "USER=" + u.Username, "HUTCH_ROOT="}
	r := noHome.run(nil, "ls")
	if r.code == 0 || !strings.Contains(r.stderr, "refusing") {
		t.Errorf("hutch used a root under %s made by another user: %s", fallback, r)
	}
	if ents, _ := os.ReadDir(fallback); len(ents) != 0 {
		t.Errorf("hutch wrote into %s, made by another user: %v", fallback, ents)
	}

	// root given a root another user owns.
	re := newEnv(t)
	if err := os.Chown(re.root, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if r := re.run(nil, "ls"); r.code == 0 || !strings.Contains(r.stderr, "owned by uid 65534") {
		t.Errorf("root hutch used a state root owned by nobody: %s", r)
	}
	os.Chown(re.root, 0, 0)
}
