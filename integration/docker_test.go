package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// requireDockerImage fails unless the docker template is built (make
// docker-image); it returns its archive.
func requireDockerImage(t *testing.T) string {
	t.Helper()
	archive := filepath.Join(binDir(t), "images", "docker.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("the docker image is not built (run `make docker-image`): %v", err)
	}
	return archive
}

// dockerEnv is a root test's env with the docker template imported, and
// an archive of the busybox test image, made on the host by
// hutch-mkimage, for the sandboxes' daemons to load (there is no
// registry).
type dockerEnv struct {
	*env
	busybox string
}

// The Docker tests share base's state root (baseArchive), with the
// docker template imported and its root filesystem unpacked once a run by
// the first of them: the unpack takes 10-30 s.
var sharedDocker struct {
	once sync.Once
	err  error
}

func newDockerEnv(t *testing.T) *dockerEnv {
	archive := requireDockerImage(t)
	root := baseArchive(t)
	e := newEnv(t)
	e.root = root
	sharedDocker.once.Do(func() {
		start := time.Now()
		if r := e.run(nil, "image", "import", "docker", archive); r.code != 0 {
			sharedDocker.err = fmt.Errorf("image import docker: %s", r)
			return
		}
		if r := e.run(nil, "run", "--rm", "--docker", "--", "true"); r.code != 0 {
			sharedDocker.err = fmt.Errorf("the first Docker sandbox: %s", r)
			return
		}
		t.Logf("docker template imported and unpacked in %s", time.Since(start).Round(time.Second))
	})
	if sharedDocker.err != nil {
		t.Fatal(sharedDocker.err)
	}
	bb := filepath.Join(t.TempDir(), "busybox.tar")
	out, err := exec.Command(filepath.Join(e.bin, "hutch-mkimage"), "-busybox", "/bin/busybox", "-name", "busybox:latest", "-o", bb).CombinedOutput()
	if err != nil {
		t.Fatalf("hutch-mkimage: %v: %s", err, out)
	}
	return &dockerEnv{env: e, busybox: bb}
}

// sandbox creates a Docker sandbox with args, timing it, and loads the
// busybox archive into its daemon.
func (d *dockerEnv) sandbox(args ...string) string {
	d.t.Helper()
	start := time.Now()
	id := strings.TrimSpace(d.ok(append([]string{"create", "--docker"}, args...)...))
	d.t.Logf("create --docker %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	d.ok("cp", d.busybox, id+":/tmp/busybox.tar")
	if out := d.sh(id, "docker load -i /tmp/busybox.tar"); !strings.Contains(out, "Loaded image: busybox:latest") {
		d.t.Fatalf("docker load: %q", out)
	}
	return id
}

// sh runs script with sh -c in sandbox id as its user and fails the test
// unless it exits 0; it returns the output.
func (d *dockerEnv) sh(id, script string) string {
	d.t.Helper()
	r := d.run(nil, "exec", id, "--", "sh", "-c", script)
	if r.code != 0 {
		d.t.Fatalf("in %s: %s: %s", id, script, r)
	}
	return r.stdout + r.stderr
}

// A Docker sandbox's daemon is up when create returns, with the overlay2
// driver; the image's user drives it without sudo: `docker load` of an
// archive copied in, `docker run` of it, and `docker build` of a
// Dockerfile FROM it, whose RUN step's result the built image prints.
func TestDockerLoadRunBuild(t *testing.T) {
	d := newDockerEnv(t)
	id := d.sandbox()
	if out := d.sh(id, "docker info --format '{{.Driver}} {{.ServerVersion}}'"); !strings.HasPrefix(out, "overlay2 20.10") {
		t.Fatalf("docker info: %q, want the overlay2 driver of Docker 20.10", out)
	}
	if out := d.sh(id, "docker run --rm busybox echo hello from an inner container"); strings.TrimSpace(out) != "hello from an inner container" {
		t.Fatalf("docker run: %q", out)
	}
	start := time.Now()
	d.sh(id, `mkdir -p /tmp/ctx && cd /tmp/ctx &&
printf 'FROM busybox\nRUN echo "made by RUN in $(uname -s)" > /made\nCMD ["cat", "/made"]\n' > Dockerfile &&
docker build -q -t made .`)
	t.Logf("docker build: %s", time.Since(start).Round(time.Millisecond))
	if out := d.sh(id, "docker run --rm made"); strings.TrimSpace(out) != "made by RUN in Linux" {
		t.Fatalf("the built image printed %q", out)
	}
	// The inner containers run in gVisor's kernel, as the sandbox does.
	if out := d.sh(id, "docker run --rm --cap-add SYSLOG busybox dmesg"); !strings.Contains(out, "gVisor") {
		t.Fatalf("dmesg in an inner container: %q, want gVisor's", out)
	}
	var rec struct {
		Docker bool `json:"docker"`
	}
	d.inspectInto(id, &rec)
	if !rec.Docker {
		t.Fatal("inspect does not say the sandbox is a Docker sandbox")
	}
}

// The sandbox's limits hold for its inner containers: a fork bomb in one
// stops at the sandbox's process limit while the sandbox's user still
// runs commands and the daemon still removes it; a container given more
// memory than the sandbox has (docker run --memory) cannot use it: the
// sandbox reaches its own limit and is stopped, as any sandbox is.
func TestDockerLimits(t *testing.T) {
	d := newDockerEnv(t)
	const pids = 256
	id := d.sandbox("--memory", "512m", "--pids", fmt.Sprint(pids))

	d.sh(id, `docker run -d --name bomb busybox sh -c 'b() { b | b & }; b; sleep 1000'`)
	// The bomb grows until forks fail, then keeps the table full.
	count := func() int {
		r := d.run(nil, "exec", "--user", "0", id, "--", "sh", "-c", "ls -d /proc/[0-9]* | wc -l")
		n, _ := strconv.Atoi(strings.TrimSpace(r.stdout))
		return n
	}
	most := 0
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		most = max(most, count())
		if most >= pids-20 {
			break
		}
	}
	time.Sleep(2 * time.Second)
	most = max(most, count())
	t.Logf("processes in the sandbox with the bomb running: at most %d seen (limit %d)", most, pids)
	if most < pids/2 || most > pids+16 {
		t.Fatalf("%d processes with a fork bomb running under --pids %d", most, pids)
	}
	// The sandbox answers: its user's commands, and the daemon.
	start := time.Now()
	if out := d.sh(id, "echo still here"); strings.TrimSpace(out) != "still here" {
		t.Fatalf("exec during the bomb: %q", out)
	}
	d.sh(id, "docker rm -f bomb")
	t.Logf("exec and docker rm -f of the bomb: %s", time.Since(start).Round(time.Millisecond))
	if out := d.sh(id, "docker run --rm busybox echo after the bomb"); strings.TrimSpace(out) != "after the bomb" {
		t.Fatalf("docker run after the bomb: %q", out)
	}

	// 900 MiB held by tail (no newline in /dev/zero) in a container
	// allowed 4 GiB, in a sandbox of 512 MiB.
	r := d.run(nil, "exec", id, "--", "sh", "-c", "docker run --rm --memory 4g busybox sh -c 'head -c 900m /dev/zero | tail >/dev/null; echo held 900m'")
	if strings.Contains(r.stdout, "held 900m") {
		t.Fatalf("an inner container held 900 MiB in a sandbox of 512 MiB: %s", r)
	}
	var rec struct {
		State     string `json:"state"`
		OOMKilled bool   `json:"oomKilled"`
		Memory    int64  `json:"memory"`
	}
	d.inspectInto(id, &rec)
	if !rec.OOMKilled || rec.State != "stopped" || rec.Memory != 512<<20 {
		t.Fatalf("after the inner container's allocation: %+v, want the sandbox stopped at its limit (oomKilled)", rec)
	}
	t.Logf("the allocation ended with %s; the sandbox: %+v", strings.TrimSpace(r.stderr), rec)
}

// An inner container's traffic leaves from the sandbox's address, so the
// sandbox's policy holds for it: it reaches what the sandbox may reach
// and nothing else (a denied test host, a port the rule does not name,
// the metadata address). A container's published port (docker run -p)
// is a port of the sandbox, which hutch's -p publishes on the host.
func TestDockerNetwork(t *testing.T) {
	d := newDockerEnv(t)
	w := newTestWorld(t)
	hostPort := freePort(t)
	id := d.sandbox("--net", "allow", "--allow", w.testHost+":8080", "-p", fmt.Sprintf("127.0.0.1:%d:8000", hostPort))

	inner := func(addr string) (bool, string) {
		host, port, _ := strings.Cut(addr, ":")
		// nc, as probe: the static busybox's wget needs glibc's NSS,
		// which the image lacks.
		r := d.run(nil, "exec", "--timeout", "60s", id, "--", "docker", "run", "--rm", "busybox", "sh", "-c",
			`printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' "$0" | nc -w 5 "$0" "$1"`, host, port)
		return strings.Contains(r.stdout, "testhost"), r.String()
	}
	if ok, out := inner(w.testHost + ":8080"); !ok {
		t.Fatalf("an inner container could not reach %s:8080, which the sandbox's policy allows: %s", w.testHost, out)
	}
	// The sandbox itself, with curl (the image has no nc).
	outer := func(addr string) bool {
		r := d.run(nil, "exec", "--timeout", "30s", id, "--", "curl", "-s", "-m", "5", "http://"+addr+"/")
		return strings.Contains(r.stdout, "testhost")
	}
	if !outer(w.testHost + ":8080") {
		t.Fatalf("the sandbox could not reach %s:8080", w.testHost)
	}
	for _, denied := range []string{w.other + ":80", w.testHost + ":80", w.metadata + ":80", hostGateway(d.inspect(id).IP) + ":" + hostListener(t)} {
		if ok, out := inner(denied); ok {
			t.Fatalf("an inner container reached %s, which the sandbox's policy denies: %s", denied, out)
		}
		if outer(denied) {
			t.Fatalf("the sandbox reached %s, which its policy denies", denied)
		}
	}

	d.sh(id, `docker run -d --name web -p 8000:80 busybox sh -c 'mkdir /www && echo hello from an inner web server > /www/index.html && exec httpd -f -p 80 -h /www'`)
	url := fmt.Sprintf("http://127.0.0.1:%d/", hostPort)
	start := time.Now()
	waitFor(t, func() bool { b, err := get(url); return err == nil && b == "hello from an inner web server\n" })
	t.Logf("%s answered from the inner container %s after it started", url, time.Since(start).Round(time.Millisecond))
}

// What a Docker sandbox cannot do is refused with the reason, exit 125:
// a pause, fork or checkpoint (gVisor cannot save the bridge in its
// netstack), leaving the sandbox and its containers running; and a
// Docker sandbox on a rootless host.
func TestDockerRefusals(t *testing.T) {
	d := newDockerEnv(t)
	id := d.sandbox()
	d.sh(id, "docker run -d --name idle busybox sleep 1000")
	for _, args := range [][]string{{"pause", id}, {"fork", id}, {"checkpoint", id}} {
		r := d.run(nil, args...)
		if r.code != 125 || !strings.Contains(r.stderr, "Docker sandbox") || !strings.Contains(r.stderr, "bridge") {
			t.Fatalf("hutch %s: %s, want exit 125 naming the bridge", strings.Join(args, " "), r)
		}
	}
	if out := d.sh(id, "docker ps --format '{{.Names}}' && docker run --rm busybox echo still runs"); !strings.Contains(out, "idle") || !strings.Contains(out, "still runs") {
		t.Fatalf("after the refusals: %q", out)
	}

	u := newRootlessEnv(t)
	r := u.run(nil, "create", "--docker")
	if r.code != 125 || !strings.Contains(r.stderr, "rootless") || !strings.Contains(r.stderr, "cgroups") {
		t.Fatalf("rootless create --docker: %s, want exit 125 saying why", r)
	}
}

// composeProject is a two-service Compose project built from the loaded
// busybox: a "database" answering on port 5000, and a web server whose
// CGI looks the database up by its service name (busybox's nslookup:
// its static nc has no resolver of glibc's) and queries it.
const composeProject = `version: "2.4"
services:
  db:
    image: busybox
    command: ["sh", "-c", "exec nc -ll -p 5000 -e sh -c 'echo rows=42'"]
  web:
    image: busybox
    depends_on: [db]
    ports: ["8000:80"]
    command: ["sh", "-c", "mkdir -p /www/cgi-bin && printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\nip=$$(nslookup db 2>/dev/null | sed -n \"s/^Address: *\\\\([0-9.]*\\\\).*/\\\\1/p\" | tail -n 1)\\necho db at $$ip says $$(nc $$ip 5000 </dev/null)\\n' > /www/cgi-bin/q && chmod +x /www/cgi-bin/q && exec httpd -f -p 80 -h /www"]
`

// Compose v1 (Debian's docker-compose) brings up web + database; the web
// service reaches the database by its Compose name, and its published
// port is reached from the host through hutch's -p.
func TestDockerCompose(t *testing.T) {
	d := newDockerEnv(t)
	hostPort := freePort(t)
	id := d.sandbox("-p", fmt.Sprintf("127.0.0.1:%d:8000", hostPort))
	dir := filepath.Join(t.TempDir(), "shop")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "docker-compose.yml"), []byte(composeProject), 0o644); err != nil {
		t.Fatal(err)
	}
	d.ok("cp", dir, id+":/tmp/shop")
	start := time.Now()
	d.sh(id, "cd /tmp/shop && docker-compose up -d")
	t.Logf("docker-compose up -d: %s", time.Since(start).Round(time.Millisecond))
	url := fmt.Sprintf("http://127.0.0.1:%d/cgi-bin/q", hostPort)
	var body string
	waitFor(t, func() bool { b, err := get(url); body = b; return err == nil && strings.Contains(b, "says rows=42") })
	if !strings.Contains(body, "db at 172.") {
		t.Fatalf("%s: %q, want the database's answer from its address on the project's network", url, body)
	}
	t.Logf("%s: %s", url, strings.TrimSpace(body))
	if out := d.sh(id, "cd /tmp/shop && docker-compose ps --services"); !strings.Contains(out, "web") || !strings.Contains(out, "db") {
		t.Fatalf("docker-compose ps: %q", out)
	}
	d.sh(id, "cd /tmp/shop && docker-compose down")
}

// The docker template is a template of hutch serve by its name, as
// code-interpreter-v1 is: a sandbox created with templateID "docker" is a
// Docker sandbox whose daemon answers when the create does.
func TestServeDockerTemplate(t *testing.T) {
	d := newDockerEnv(t)
	s := newServer(t, d.root)
	key := s.tenantAdd("builder")
	s.serve()
	start := time.Now()
	c := s.createSandbox(key, "docker")
	t.Logf("POST /sandboxes docker: %s", time.Since(start).Round(time.Millisecond))
	ids := s.sandboxIDs()
	if len(ids) != 1 {
		t.Fatalf("sandboxes after the create: %v", ids)
	}
	if out := d.sh(ids[0], "docker version --format '{{.Server.Version}}'"); !strings.HasPrefix(out, "20.10") {
		t.Fatalf("docker in the sandbox %s of templateID docker: %q", c.SandboxID, out)
	}
	var rec struct {
		Docker bool `json:"docker"`
	}
	d.inspectInto(ids[0], &rec)
	if !rec.Docker {
		t.Fatal("the sandbox of templateID docker is no Docker sandbox")
	}

	// An operator who wants no Docker sandboxes on the host says so: the
	// same create on a server with --no-docker is refused and leaves
	// nothing.
	off := newServer(t, d.root)
	offKey := off.tenantAdd("nodocker")
	off.flags = []string{"--no-docker"}
	off.serve()
	r := off.do("POST", "/sandboxes", strings.NewReader(`{"templateID":"docker"}`), map[string]string{"X-API-Key": offKey, "Content-Type": "application/json"})
	if code, msg, err := r.errorBody(); r.status != 403 || err != nil || code != 403 || !strings.Contains(msg, "--no-docker") {
		t.Fatalf("create of templateID docker under --no-docker: %s, want 403 naming --no-docker", r)
	}
	if now := s.sandboxIDs(); len(now) != 1 {
		t.Fatalf("sandboxes after the refused create: %v", now)
	}
}

// An inner `docker pull` reaches a registry the sandbox's policy allows,
// over TLS with a CA the state root trusts (`hutch ca add`): the registry
// is served by the test at a test host's address in its own network
// namespace, the image is built FROM what was pulled, and both run.
func TestDockerPullFromRegistry(t *testing.T) {
	d := newDockerEnv(t)
	reg := startRegistry(t, nil)
	pushBusybox(t, reg.host, reg.host+"/lib/busybox:1")
	w := newTestWorld(t)
	ca := newTestCA(t)
	l := w.listenInNetns("tcp", net.JoinHostPort(w.testHost, "443")).(net.Listener)
	srv := &http.Server{Handler: reg.app, TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.serverCert(t, w.testHost)}},
		ErrorLog: log.New(io.Discard, "", 0)}
	go srv.ServeTLS(l, "", "") //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	// The shared state root trusts the test's CA for this test only.
	d.ok("ca", "add", "--name", "docker-pull-ca", ca.file)
	t.Cleanup(func() { d.run(nil, "ca", "rm", "docker-pull-ca") })

	id := d.sandbox("--net", "allow", "--allow", w.testHost+":443")
	ref := w.testHost + "/lib/busybox:1"
	start := time.Now()
	d.sh(id, "docker pull "+ref)
	t.Logf("docker pull %s: %s", ref, time.Since(start).Round(time.Millisecond))
	if out := d.sh(id, "docker run --rm "+ref+" echo pulled"); !strings.Contains(out, "pulled") {
		t.Fatalf("docker run of the pulled image: %q", out)
	}
	d.sh(id, "mkdir -p /tmp/p && printf 'FROM "+ref+"\\nRUN echo built-on-pulled > /b\\n' > /tmp/p/Dockerfile && docker build -q -t onpulled /tmp/p")
	if out := d.sh(id, "docker run --rm onpulled cat /b"); !strings.Contains(out, "built-on-pulled") {
		t.Fatalf("docker run of the image built FROM the pulled one: %q", out)
	}
	// The same registry is not reached from a sandbox whose policy allows
	// another destination only.
	other := d.sandbox("--net", "allow", "--allow", w.public+":80")
	if r := d.run(nil, "exec", other, "--", "sh", "-c", "timeout 20 docker pull "+ref); r.code == 0 {
		t.Fatalf("docker pull from a sandbox whose policy does not allow the registry: %s", r)
	}
}
