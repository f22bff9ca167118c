package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// newRootlessBuildEnv is newRootlessEnv with the image builder's binaries
// beside hutch.
func newRootlessBuildEnv(t *testing.T) *env {
	t.Helper()
	if _, err := exec.LookPath("newuidmap"); err != nil {
		t.Fatal("newuidmap is missing: apt-get install uidmap (make deps)")
	}
	e := newRootlessEnv(t)
	src := binDir(t)
	for _, f := range []string{"buildkitd", "hutch-buildkitd", "hutch-buildkit-runtime"} {
		copyFile(t, filepath.Join(src, f), filepath.Join(e.bin, f))
	}
	return e
}

// An unprivileged user builds a Dockerfile: COPY from the context, RUN
// steps under gVisor, and the result runs in the user's own sandbox. The
// builder runs as the user, its mounts stay out of the host's mount table,
// and a RUN step that writes to the host paths of the user's state and of
// the builder's own state writes only into its layer.
func TestRootlessBuild(t *testing.T) {
	e := newRootlessBuildEnv(t)
	e.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	buildkit := filepath.Join(e.root, "buildkit")
	targets := []string{
		filepath.Join(e.root, "escaped"),
		filepath.Join(buildkit, "escaped"),
		filepath.Join(buildkit, "state", "escaped"),
	}
	var hostile strings.Builder
	for _, p := range targets {
		hostile.WriteString("mkdir -p " + filepath.Dir(p) + " && echo escaped > " + p + " && cat " + p + " >> /written && ")
	}
	ctxDir := writeContext(t, map[string]string{
		"greeting.txt": "from the context\n",
		"Dockerfile": "FROM busybox\n" +
			"COPY greeting.txt /greeting.txt\n" +
			"RUN cat /proc/version > /kernel && dmesg > /dmesg && id -u > /uid\n" +
			"RUN " + hostile.String() + "(echo escaped > /proc/1/root/escaped-root || true) && echo done > /hostile\n",
	})
	for _, d := range []string{filepath.Dir(ctxDir), ctxDir} {
		if err := os.Chmod(d, 0o755); err != nil { // the user reads the context
			t.Fatal(err)
		}
	}
	start := time.Now()
	r := e.run(nil, "image", "build", "--progress", "plain", "-t", "app", ctxDir)
	if r.code != 0 {
		t.Fatalf("rootless build: %s", r)
	}
	t.Logf("rootless build (daemon start included) in %s", time.Since(start).Round(time.Millisecond))
	if !strings.HasPrefix(r.stdout, "sha256:") {
		t.Fatalf("build printed no digest: %s", r)
	}

	// The builder is the user's: no process of it runs as host root, and
	// the snapshots it mounted are in its own mount namespace only.
	procs := processesMentioning(buildkit)
	if len(procs) == 0 {
		t.Fatalf("no builder process mentions %s after the build", buildkit)
	}
	for _, p := range procs {
		pid := strings.TrimSuffix(strings.Fields(p)[1], ":")
		if uid := procUID(pid); uid == "0" {
			t.Fatalf("a rootless builder process runs as host root: %s", p)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), buildkit) {
		t.Fatalf("the builder's mounts show on the host:\n%s", mounts)
	}
	for _, p := range append(targets, "/escaped-root") {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("a RUN step wrote %s on the host", p)
		}
	}

	// The step's writes succeeded, in the sandbox's own file system
	// (gVisor's /tmp), and it recorded them in its layer.
	script := "cat /greeting.txt /kernel /uid /hostile && head -n1 /dmesg && cat /written"
	out := e.ok("run", "--rm", "--image", "app", "--", "sh", "-c", script)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 5+len(targets) || lines[0] != "from the context" || !strings.Contains(lines[1], "gvisor") ||
		lines[2] != "0" || lines[3] != "done" || !strings.Contains(lines[4], "gVisor") {
		t.Fatalf("the built image holds (want the context's file, gVisor's kernel and dmesg, uid 0, the hostile step's marker):\n%s", out)
	}
	for i := range targets {
		if lines[5+i] != "escaped" {
			t.Fatalf("the hostile step's writes are not in its layer:\n%s", out)
		}
	}

	// A builder whose supervisor is killed outright in the middle of a
	// RUN step leaves nothing running: not buildkitd, not the step's
	// sandbox, no process of the user's subordinate IDs.
	slow := writeContext(t, map[string]string{"Dockerfile": "FROM busybox\nRUN sleep 1000\n"})
	for _, d := range []string{filepath.Dir(slow), slow} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := e.cmd(nil, "image", "build", slow)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer c.Wait()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if strings.Contains(strings.Join(processesMentioning(buildkit), "\n"), "runsc-sandbox") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the RUN step's sandbox did not start:\n%s", strings.Join(processesMentioning(buildkit), "\n"))
		}
	}
	pid := e.builderPid()
	if pid == 0 {
		t.Fatal("no builder runs during a build")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(processesMentioning(buildkit)) > 0 || len(subIDProcesses(t)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("left running after the builder's supervisor was killed:\n%s\n%s",
				strings.Join(processesMentioning(buildkit), "\n"), strings.Join(subIDProcesses(t), "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// subIDProcesses lists the host's processes whose real UID is one of the
// test user's subordinate IDs.
func subIDProcesses(t *testing.T) []string {
	t.Helper()
	u := rootlessUser(t)
	b, err := os.ReadFile("/etc/subuid")
	if err != nil {
		t.Fatal(err)
	}
	var start, count int
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Split(l, ":")
		if len(f) == 3 && (f[0] == u.Username || f[0] == u.Uid) {
			start, _ = strconv.Atoi(f[1])
			count, _ = strconv.Atoi(f[2])
			break
		}
	}
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, st := range stats {
		pid := filepath.Base(filepath.Dir(st))
		uid, err := strconv.Atoi(procUID(pid))
		if err == nil && count > 0 && uid >= start && uid < start+count {
			cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			out = append(out, "process "+pid+" uid "+strconv.Itoa(uid)+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return out
}

// The default image for an unprivileged user with no help from root: no
// shared store, so the first sandbox without --image builds it in the
// user's own namespaces (the Debian layer from the archive `make
// base-rootfs` writes, BuildKit's layer with RUN under gVisor). It runs
// python3, node and git, and its setuid sudo works inside the sandbox.
// About a minute here.
func TestRootlessBaseImage(t *testing.T) {
	e := newRootlessBuildEnv(t).withDefaultRoot()
	e.extra = append(e.extra, "HUTCH_SHARED_IMAGES=")
	archive := filepath.Join(binDir(t), "images", "bookworm-rootfs.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("%v (run `make base-rootfs`)", err)
	}
	copyFile(t, archive, filepath.Join(e.bin, "images", "bookworm-rootfs.tar"))
	start := time.Now()
	r := e.run(nil, "run", "--rm", "--", "sh", "-c",
		`python3 -c 'print(1)' && node -e 'console.log(2)' && git --version && cat /usr/share/hutch/build-info && id -un && sudo id -u`)
	if r.code != 0 {
		t.Fatalf("first rootless run on the default image: %s", r)
	}
	t.Logf("default image built rootless and run in %s", time.Since(start).Round(time.Second))
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 6 || lines[0] != "1" || lines[1] != "2" || !strings.HasPrefix(lines[2], "git version ") ||
		!strings.Contains(lines[3], "gvisor") || lines[4] != "user" || lines[5] != "0" {
		t.Fatalf("the default image built without root: %s", r)
	}
	var imgs []struct{ Name, Source string }
	if err := json.Unmarshal([]byte(e.ok("image", "ls", "--format", "json")), &imgs); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, i := range imgs {
		names[i.Name] = true
	}
	if !names["base:latest"] || !names["bookworm-rootfs:latest"] {
		t.Fatalf("the user's images: %+v", imgs)
	}
}

// The default image built without root from Debian's packages: no shared
// store and no rootfs archive, so mmdebstrap installs Debian in its
// unshare mode (the user's subordinate IDs) from the host's apt sources,
// then BuildKit adds its layer. About five minutes here, so it runs only
// with HUTCH_SLOW=1 (`make test-slow`).
func TestRootlessBaseBootstrap(t *testing.T) {
	if os.Getenv("HUTCH_SLOW") != "1" {
		t.Skip("slow (mmdebstrap installs Debian): set HUTCH_SLOW=1 or run `make test-slow`")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Fatal("mmdebstrap is missing: apt-get install mmdebstrap (make deps)")
	}
	e := newRootlessBuildEnv(t)
	e.extra = append(e.extra, "HUTCH_SHARED_IMAGES=")
	start := time.Now()
	r := e.run(nil, "run", "--rm", "--", "sh", "-c",
		`python3 -c 'print(1)' && git --version && cat /usr/share/hutch/build-info && grep -c . /usr/share/hutch/packages.tsv`)
	if r.code != 0 {
		t.Fatalf("first rootless run on the default image, bootstrapped: %s", r)
	}
	t.Logf("default image bootstrapped rootless and run in %s", time.Since(start).Round(time.Second))
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 4 || lines[0] != "1" || !strings.HasPrefix(lines[1], "git version ") || !strings.Contains(lines[2], "gvisor") {
		t.Fatalf("the default image bootstrapped without root: %s", r)
	}
	if n, err := strconv.Atoi(lines[3]); err != nil || n < 100 {
		t.Fatalf("the image's package manifest lists %q packages", lines[3])
	}
}

// A user without subordinate IDs (a system user: useradd gives them none)
// is told, before anything starts, what is missing and how root adds it;
// so is one whose first sandbox would need the default image built.
func TestRootlessBuildWithoutSubIDs(t *testing.T) {
	e := newRootlessBuildEnv(t)
	const name = "hutchnosubids"
	u, err := user.Lookup(name)
	if err != nil {
		if out, err := exec.Command("useradd", "--system", "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
			t.Fatalf("useradd %s: %v: %s", name, err, out)
		}
		if u, err = user.Lookup(name); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), name+":") {
			t.Fatalf("%s has subordinate IDs in %s", name, f)
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	data := filepath.Join(filepath.Dir(e.bin), "data-"+name)
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, uid, gid); err != nil {
		t.Fatal(err)
	}
	n := &env{t: t, bin: e.bin, root: filepath.Join(data, "hutch"),
		cred:  &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
		extra: []string{"HOME=" + u.HomeDir, "XDG_DATA_HOME=" + data, "USER=" + name, "TMPDIR=" + data, "HUTCH_SHARED_IMAGES="},
	}
	n.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	ctxDir := writeContext(t, map[string]string{"Dockerfile": "FROM busybox\nRUN true\n"})
	for _, d := range []string{filepath.Dir(ctxDir), ctxDir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := n.run(nil, "image", "build", "-t", "x", ctxDir)
	assertOneLineError(t, r, "usermod --add-subuids 100000-165535 "+name)
	for _, want := range []string{"/etc/subuid", "/etc/subgid", "--add-subgids"} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("the error does not name %q: %s", want, r)
		}
	}
	r = n.run(nil, "run", "--rm", "--", "true")
	assertOneLineError(t, r, "usermod --add-subuids")
	if !strings.Contains(r.stderr, "--image busybox") {
		t.Fatalf("the error offers no way around: %s", r)
	}
	if _, err := os.Stat(filepath.Join(n.root, "buildkit", "supervisor.pid")); err == nil {
		t.Fatal("a builder started without subordinate IDs")
	}
}
