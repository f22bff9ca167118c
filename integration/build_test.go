package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeContext makes a build context directory from name -> content.
func writeContext(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// imageEntry is the part of `hutch image ls --format json` the tests read.
type imageEntry struct {
	Name   string `json:"Name"`
	Digest string `json:"Digest"`
	Config struct {
		Config struct {
			User       string            `json:"User"`
			Env        []string          `json:"Env"`
			WorkingDir string            `json:"WorkingDir"`
			Labels     map[string]string `json:"Labels"`
		} `json:"config"`
	} `json:"Config"`
}

func (e *env) images() map[string]imageEntry {
	e.t.Helper()
	var imgs []imageEntry
	if err := json.Unmarshal([]byte(e.ok("image", "ls", "--format", "json")), &imgs); err != nil {
		e.t.Fatal(err)
	}
	m := map[string]imageEntry{}
	for _, i := range imgs {
		m[i.Name] = i
	}
	return m
}

const buildDockerfile = `FROM busybox
ARG GREETING=hello
ENV APP_MODE=test
WORKDIR /app
COPY greeting.txt data/
RUN uname -r > /app/kernel && echo "$GREETING" > /app/arg && echo "builder:x:1234:1234::/app:/bin/sh" >> /etc/passwd && chown -R 1234 /app
USER builder
RUN id -u > /app/uid-at-build && echo "$APP_MODE" > /app/env-at-build
`

// A Dockerfile FROM the busybox test image with COPY, RUN, ENV, WORKDIR,
// USER and a build arg builds into the store; a sandbox on the result sees
// all of them, and the RUN steps ran under gVisor. A second build of the
// same input is the same image, and later builds start FROM it.
func TestImageBuild(t *testing.T) {
	e := newEnv(t)
	e.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	ctxDir := writeContext(t, map[string]string{"Dockerfile": buildDockerfile, "greeting.txt": "from the context\n"})

	r := e.run(nil, "image", "build", "--progress", "plain", "-t", "app:v1", "--build-arg", "GREETING=howdy", ctxDir)
	if r.code != 0 {
		t.Fatalf("build: %s", r)
	}
	digest := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(digest, "sha256:") || !strings.Contains(r.stderr, "RUN uname -r") {
		t.Fatalf("build should print the digest and show BuildKit's progress: %s", r)
	}
	if got := e.images()["app:v1"].Digest; got != digest {
		t.Fatalf("store has app:v1 at %q, build printed %q", got, digest)
	}

	out := e.ok("run", "--rm", "--image", "app:v1", "--", "sh", "-c",
		`cat kernel arg data/greeting.txt uid-at-build env-at-build; echo "$APP_MODE"; pwd; id -u`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 8 {
		t.Fatalf("sandbox on the built image:\n%s", out)
	}
	if !strings.Contains(lines[0], "gvisor") {
		t.Fatalf("the RUN step should have reported gVisor's kernel, got %q", lines[0])
	}
	want := []string{"howdy", "from the context", "1234", "test", "test", "/app", "1234"}
	if got := lines[1:]; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("sandbox sees %q, want %q (arg, COPY, USER at build, ENV at build, ENV, WORKDIR, USER)", got, want)
	}

	// Unchanged input: the same image, from the cache.
	r = e.run(nil, "image", "build", "--progress", "plain", "-t", "app:v1", "--build-arg", "GREETING=howdy", ctxDir)
	if r.code != 0 || strings.TrimSpace(r.stdout) != digest || !strings.Contains(r.stderr, "CACHED") {
		t.Fatalf("rebuild of unchanged input should give %s from the cache: %s", digest, r)
	}
	// A different build arg: a different image.
	if d2 := strings.TrimSpace(e.ok("image", "build", "--progress", "quiet", "-t", "app:v2", ctxDir)); d2 == digest {
		t.Fatal("a different build arg gave the same image")
	}
	if out := e.ok("run", "--rm", "--image", "app:v2", "--", "cat", "/app/arg"); out != "hello\n" {
		t.Fatalf("ARG default: %q", out)
	}

	// FROM an image this store built, with -f outside the context.
	df := filepath.Join(t.TempDir(), "Child.dockerfile")
	os.WriteFile(df, []byte("FROM app:v1\nRUN cat /app/arg > /app/child\n"), 0o644)
	e.ok("image", "build", "--progress", "quiet", "-t", "child", "-f", df, t.TempDir())
	if out := e.ok("run", "--rm", "--image", "child", "--", "cat", "/app/child"); out != "howdy\n" {
		t.Fatalf("FROM a built image: %q", out)
	}
}

// The daemon hutch starts for builds stops by itself once idle. Its root is
// deep: the daemon's socket there is too long for a socket address.
func TestImageBuildDaemonIdles(t *testing.T) {
	e := newEnv(t)
	e.root = filepath.Join(e.root, strings.Repeat("d", 120)) // e's cleanup reads it
	if sock := filepath.Join(e.root, "buildkit", "buildkitd.sock"); len(sock) < 108 {
		t.Fatalf("%s: not too long for a socket address", sock)
	}
	e.extra = append(e.extra, "HUTCH_BUILDKIT_IDLE=2s")
	e.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	ctxDir := writeContext(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo idle > /f\n"})
	e.ok("image", "build", "--progress", "quiet", "-t", "idle", ctxDir)
	if e.builderPid() == 0 {
		t.Fatal("no buildkitd supervisor after a build")
	}
	dir := filepath.Join(e.root, "buildkit")
	waitFor(t, func() bool { return e.builderPid() == 0 && len(processesMentioning(dir)) == 0 })
	// And comes back on demand.
	if out := e.ok("image", "build", "--progress", "quiet", "-t", "idle", ctxDir); !strings.HasPrefix(out, "sha256:") {
		t.Fatalf("build after an idle stop: %q", out)
	}
}

// Bad input fails with one line and exit 125 before any build starts, and
// leaves the store as it was.
func TestImageBuildBadInput(t *testing.T) {
	e := newEnv(t)
	e.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	index := func() []byte {
		b, err := os.ReadFile(filepath.Join(e.root, "images", "oci", "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	before := index()
	good := writeContext(t, map[string]string{"Dockerfile": "FROM busybox\nRUN true\n"})
	for _, tc := range []struct {
		name, dockerfile string
		args             []string
		want             string
	}{
		{"syntax error", "FROM busybox\nRUN true\nBOGUS thing\n", nil, "line 3"},
		{"unknown FROM", "FROM nosuchimage:v9\n", nil, `"nosuchimage:v9" is not in hutch's store`},
		{"unknown COPY --from", "FROM busybox\nCOPY --from=ghost /x /x\n", nil, `"ghost:latest"`},
		{"missing context", "", []string{"image", "build", "-t", "x", "/nonexistent/ctx"}, "/nonexistent/ctx"},
		{"missing Dockerfile", "", []string{"image", "build", "-t", "x", "-f", "/nonexistent/Dockerfile", good}, "/nonexistent/Dockerfile"},
		{"bad tag", "", []string{"image", "build", "-t", "Bad:Tag!", good}, "Bad:Tag!"},
		{"bad registry tag", "", []string{"image", "build", "-t", "example.com/X", good}, "invalid image reference"},
		{"bad build arg", "", []string{"image", "build", "--build-arg", "NOVALUE", good}, "NOVALUE"},
		{"bad progress", "", []string{"image", "build", "--progress", "fancy", good}, "--progress"},
		{"no context", "", []string{"image", "build", "-t", "x"}, "usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if args == nil {
				args = []string{"image", "build", "-t", "bad", writeContext(t, map[string]string{"Dockerfile": tc.dockerfile})}
			}
			assertOneLineError(t, e.run(nil, args...), tc.want)
		})
	}
	if e.builderPid() != 0 {
		t.Fatal("bad input started buildkitd")
	}
	// A step that fails does start a build: its error is one line too.
	failing := writeContext(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo step-output && exit 3\n"})
	assertOneLineError(t, e.run(nil, "image", "build", "--progress", "quiet", "-t", "bad", failing), "exit code: 3")
	if after := index(); !bytes.Equal(before, after) {
		t.Fatalf("failed builds changed the store's index:\n%s\n->\n%s", before, after)
	}
}

// A build interrupted by a killed buildkitd or by Ctrl-C leaves the store
// as it was and no build step running; the next build succeeds.
func TestImageBuildInterrupted(t *testing.T) {
	e := newEnv(t)
	e.ok("image", "import", "busybox", filepath.Join(e.bin, "images", "busybox.tar"))
	slow := writeContext(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo started && sleep 600\n"})
	quick := writeContext(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo ok > /ok\n"})
	stepsDir := filepath.Join(e.root, "buildkit", "runsc")
	stepRunning := func() bool {
		m, _ := filepath.Glob(filepath.Join(stepsDir, "*.state"))
		return len(m) > 0
	}
	imagesBefore := e.ok("image", "ls")

	for _, how := range []string{"kill buildkitd", "SIGINT to hutch"} {
		t.Run(how, func(t *testing.T) {
			c := e.cmd(nil, "image", "build", "--progress", "plain", "-t", "slow", slow)
			var out, errb bytes.Buffer
			c.Stdout, c.Stderr = &out, &errb
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- c.Wait() }()
			// A failure below must not leave this build running into
			// the next subtest, which would see its step.
			t.Cleanup(func() { c.Process.Kill() }) // after Wait, a no-op
			for deadline := time.Now().Add(30 * time.Second); !stepRunning(); time.Sleep(50 * time.Millisecond) {
				select {
				case err := <-done:
					t.Fatalf("the build ended before its step ran: %v\nstderr: %s", err, errb.String())
				default:
				}
				if time.Now().After(deadline) {
					c.Process.Kill()
					err := <-done
					t.Fatalf("the build's step did not start within 30s (%v)\nstderr: %s", err, errb.String())
				}
			}
			if how == "kill buildkitd" {
				pid := e.builderPid()
				bk := childrenOf(pid)
				if len(bk) == 0 {
					t.Fatalf("buildkitd is not a child of the supervisor %d", pid)
				}
				if err := exec.Command("kill", "-KILL", bk[0]).Run(); err != nil {
					t.Fatal(err)
				}
			} else {
				c.Process.Signal(syscall.SIGINT)
			}
			select {
			case err := <-done:
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 {
					t.Fatalf("interrupted build: want exit 125, got %v\nstderr: %s", err, errb.String())
				}
			case <-time.After(60 * time.Second):
				c.Process.Kill()
				t.Fatalf("build did not end after %s\nstderr: %s", how, errb.String())
			}
			if lines := strings.Split(strings.TrimSpace(errb.String()), "\n"); !strings.HasPrefix(lines[len(lines)-1], "hutch: ") {
				t.Fatalf("interrupted build should end with hutch's error line: %q", errb.String())
			}
			waitFor(t, func() bool { return !stepRunning() })
			if now := e.ok("image", "ls"); now != imagesBefore {
				t.Fatalf("interrupted build changed the images:\n%s\n->\n%s", imagesBefore, now)
			}
			if out := e.ok("image", "build", "--progress", "quiet", "-t", "quick", quick); !strings.HasPrefix(out, "sha256:") {
				t.Fatalf("build after the interruption: %q", out)
			}
			e.ok("image", "rm", "quick")
		})
	}
}

// childrenOf lists the PIDs whose parent is pid.
func childrenOf(pid int) []string {
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, filepath.Base(filepath.Dir(p)))
		}
	}
	return out
}
