package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An unprivileged user with a fresh store builds FROM the default image:
// the first build makes base (from the Debian archive, in the user's
// namespaces), then its RUN step uses python3, node and git under
// gVisor, and the result runs in the user's sandbox. On it, the user's
// shell gets a pty and runs as the image's user, and cp copies both ways.
func TestRootlessBuildFromBase(t *testing.T) {
	e := newRootlessBuildEnv(t)
	e.extra = append(e.extra, "HUTCH_SHARED_IMAGES=")
	archive := filepath.Join(binDir(t), "images", "bookworm-rootfs.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("%v (run `make base-rootfs`)", err)
	}
	copyFile(t, archive, filepath.Join(e.bin, "images", "bookworm-rootfs.tar"))
	ctxDir := writeContext(t, map[string]string{
		"app.py": "print('app', 6 * 7)\n",
		"Dockerfile": "FROM base\n" +
			"COPY app.py /home/user/app.py\n" +
			"RUN mkdir out && python3 app.py > out/py && node -e 'console.log(\"node\", 40 + 2)' > out/node && " +
			"git init -q repo && git -C repo -c user.email=b@hutch -c user.name=b commit -q --allow-empty -m built && " +
			"git -C repo log --format=%s > out/git && cat /proc/version > out/kernel && id -u > out/uid\n" +
			"USER root\n" +
			"RUN id -u > /home/user/out/root\n" +
			"USER user\n",
	})
	for _, d := range []string{filepath.Dir(ctxDir), ctxDir} {
		if err := os.Chmod(d, 0o755); err != nil { // the user reads the context
			t.Fatal(err)
		}
	}
	start := time.Now()
	r := e.run(nil, "image", "build", "-t", "app", ctxDir)
	if r.code != 0 {
		t.Fatalf("rootless build FROM base on a fresh store: %s", r)
	}
	t.Logf("rootless build FROM base, base included, in %s", time.Since(start).Round(time.Second))
	// Again, with base in the store: the build alone.
	if err := os.WriteFile(filepath.Join(ctxDir, "app.py"), []byte("print('app', 6 * 7)\n# again\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	e.ok("image", "build", "-t", "app", ctxDir)
	t.Logf("rootless build FROM base in %s", time.Since(start).Round(time.Second))

	start = time.Now()
	out := e.ok("run", "--rm", "--image", "app", "--", "sh", "-c",
		"cd /home/user && cat out/py out/node out/git out/kernel out/uid out/root && python3 app.py && git --version")
	t.Logf("first rootless run of the built image (unpacked) in %s", time.Since(start).Round(time.Second))
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 8 || lines[0] != "app 42" || lines[1] != "node 42" || lines[2] != "built" ||
		!strings.Contains(lines[3], "gvisor") || lines[4] != "1000" || lines[5] != "0" || lines[6] != "app 42" || !strings.HasPrefix(lines[7], "git version ") {
		t.Fatalf("the image built FROM base (want the RUN step's python3, node and git output, gVisor's kernel, base's user, then root):\n%s", out)
	}

	// hutch shell: the image's login shell on a terminal of the sandbox's.
	id := e.create("--image", "app")
	tm := e.startTerm(30, 100, "shell", id)
	// (Markers are split with "" so that the echo of what is typed
	// does not match them.)
	tm.send(`echo out-$((6*7)) $(id -un) $(pwd); case $(tty) in /dev/pts/[0-9]*) echo on-""pts;; esac; stty size` + "\r")
	tm.expect("out-42 user /home/user")
	tm.expect("on-pts")
	tm.expect("30 100")
	tm.send("exit 3\r")
	if code := tm.wait(); code != 3 {
		t.Fatalf("rootless hutch shell exited %d, want 3", code)
	}

	// cp both ways: into the image user's home, where that user reads
	// it (once sudo gave it to them), and back into a directory of the
	// host user's.
	dir := filepath.Dir(e.root)
	src := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(src, []byte("from the host\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(src, int(e.cred.Uid), int(e.cred.Gid)); err != nil {
		t.Fatal(err)
	}
	e.ok("cp", src, id+":/home/user/in.txt")
	e.ok("exec", id, "--", "sh", "-c", "sudo chown user /home/user/in.txt && tr a-z A-Z < /home/user/in.txt > /tmp/out.txt && chmod 600 /tmp/out.txt")
	e.ok("cp", id+":/tmp/out.txt", filepath.Join(dir, "out.txt"))
	b, err := os.ReadFile(filepath.Join(dir, "out.txt"))
	fi, _ := os.Stat(filepath.Join(dir, "out.txt"))
	if err != nil || string(b) != "FROM THE HOST\n" || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != e.cred.Uid {
		t.Fatalf("rootless cp round trip on base: %q %v %v", b, fi, err)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
}

// Without a network (no /dev/net/tun needed): a rootless sandbox pauses
// and resumes with its processes and files, forks into a running copy,
// and snapshots into an image that new sandboxes and run --rm start
// from.
func TestRootlessPersistNoNet(t *testing.T) {
	e := newRootlessEnv(t)
	id := e.create()
	e.ok("exec", id, "--", "sh", "-c", "echo kept > /root/mark")
	e.ok("exec", "-d", id, "--", "sleep", "1000")
	running := func(ref string) bool {
		return strings.Contains(e.ok("exec", ref, "--", "ps", "-o", "args"), "sleep 1000")
	}
	e.ok("pause", id)
	if st := e.inspect(id).State; st != "paused" {
		t.Fatalf("after pause: %s", st)
	}
	e.ok("resume", id)
	if got := e.ok("exec", id, "--", "cat", "/root/mark"); got != "kept\n" || !running(id) {
		t.Fatalf("after resume: %q, sleep running: %v", got, running(id))
	}

	child := strings.TrimSpace(e.ok("fork", id))
	e.ok("exec", child, "--", "sh", "-c", "echo child > /root/mark")
	if got := e.ok("exec", id, "--", "cat", "/root/mark"); got != "kept\n" {
		t.Fatalf("the fork's write reached its parent: %q", got)
	}
	if !running(child) {
		t.Fatal("the fork lacks its parent's process")
	}

	if out := strings.TrimSpace(e.ok("snapshot", "-t", "snap", id)); out != "snap:latest" {
		t.Fatalf("snapshot printed %q", out)
	}
	if r := e.run(nil, "run", "--rm", "--image", "snap", "--", "cat", "/root/mark"); r.code != 0 || r.stdout != "kept\n" {
		t.Fatalf("run --rm from the snapshot: %s", r)
	}
	snap := e.create("--image", "snap")
	if got := e.ok("exec", snap, "--", "cat", "/root/mark"); got != "kept\n" {
		t.Fatalf("a sandbox from the snapshot: %q", got)
	}
	for _, x := range []string{id, child, snap} {
		e.ok("rm", "-f", x)
		e.assertClean(x)
	}
}
