package integration

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
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
	"syscall"
	"testing"
	"time"
)

// demoWheel is a pure-Python wheel made by the test: package hutchdemo,
// whose VALUE says where it came from.
func demoWheel(t *testing.T) (name string, data []byte) {
	t.Helper()
	files := []struct{ name, data string }{
		{"hutchdemo/__init__.py", "VALUE = \"from-the-test-index\"\n"},
		{"hutchdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: hutchdemo\nVersion: 1.0\nSummary: a test package\n"},
		{"hutchdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: hutch-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, f.data)
		sum := sha256.Sum256([]byte(f.data))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.data))
	}
	record.WriteString("hutchdemo-1.0.dist-info/RECORD,,\n")
	w, err := zw.Create("hutchdemo-1.0.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return "hutchdemo-1.0-py3-none-any.whl", buf.Bytes()
}

// pkgMirror is a package mirror served by the test over HTTPS on port
// 443 of every test host address, with a certificate of the test's CA
// for allowed.test and denied.test: a Python index (PEP 503's simple
// API) at /simple with the wheel demoWheel, an npm registry at /npm with
// package hutch-demo, and a flat Debian repository at /apt with package
// hutch-demo. It records each request as "SNI HOST PATH".
type pkgMirror struct {
	mu   sync.Mutex
	hits []string
}

func (p *pkgMirror) requests() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.hits, "\n")
}

func servePkgMirror(t *testing.T, w *testWorld, ca *testCA) *pkgMirror {
	t.Helper()
	name, wheel := demoWheel(t)
	sum := sha256.Sum256(wheel)
	p := &pkgMirror{}
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/hutchdemo/", func(rw http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(rw, "<!DOCTYPE html><html><body><a href=\"/files/%s#sha256=%s\">%s</a></body></html>\n", name, hex.EncodeToString(sum[:]), name)
	})
	mux.HandleFunc("/files/"+name, func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/octet-stream")
		rw.Write(wheel)
	})
	tgz := demoNpmPackage(t)
	sha1sum := sha1.Sum(tgz)
	sha512sum := sha512.Sum512(tgz)
	mux.HandleFunc("/npm/hutch-demo", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(map[string]any{
			"name": "hutch-demo", "dist-tags": map[string]string{"latest": "1.0.0"},
			"versions": map[string]any{"1.0.0": map[string]any{
				"name": "hutch-demo", "version": "1.0.0",
				"dist": map[string]string{
					"tarball":   "https://allowed.test/npm/hutch-demo/-/hutch-demo-1.0.0.tgz",
					"shasum":    hex.EncodeToString(sha1sum[:]),
					"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha512sum[:]),
				},
			}},
		})
	})
	mux.HandleFunc("/npm/hutch-demo/-/hutch-demo-1.0.0.tgz", func(rw http.ResponseWriter, _ *http.Request) { rw.Write(tgz) })
	apt := demoAptRepo(t)
	for file, data := range apt {
		mux.HandleFunc("/apt/"+file, func(rw http.ResponseWriter, _ *http.Request) { rw.Write(data) })
	}
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			// apt asks for InRelease and Release.gpg first.
			http.NotFound(rw, r)
			return
		}
		fmt.Fprintln(rw, "testhost")
	})
	l := w.listenInNetns("tcp", "0.0.0.0:443").(net.Listener)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			p.mu.Lock()
			p.hits = append(p.hits, r.TLS.ServerName+" "+r.Host+" "+r.URL.Path)
			p.mu.Unlock()
			mux.ServeHTTP(rw, r)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.siteCert(t, "allowed.test", "denied.test")}},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go srv.ServeTLS(l, "", "") //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return p
}

// demoNpmPackage is the tarball of npm package hutch-demo 1.0.0.
func demoNpmPackage(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, data string }{
		{"package/package.json", `{"name":"hutch-demo","version":"1.0.0","main":"index.js"}` + "\n"},
		{"package/index.js", "module.exports = 'npm-from-the-test-registry'\n"},
	} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: time.Unix(1e9, 0), Typeflag: tar.TypeReg})
		io.WriteString(tw, f.data)
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// demoAptRepo is a flat Debian repository, by file name, holding package
// hutch-demo (built here with dpkg-deb): its one file says where it came
// from.
func demoAptRepo(t *testing.T) map[string][]byte {
	t.Helper()
	dir := t.TempDir()
	pkg := filepath.Join(dir, "pkg")
	for name, data := range map[string]string{
		"DEBIAN/control":              "Package: hutch-demo\nVersion: 1.0\nArchitecture: all\nMaintainer: hutch tests <tests@hutch.invalid>\nDescription: a test package\n",
		"usr/share/hutch-demo/origin": "apt-from-the-test-repository\n",
	} {
		os.MkdirAll(filepath.Join(pkg, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(pkg, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(dir, "hutch-demo_1.0_all.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v: %s", err, out)
	}
	debData, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	control, _ := os.ReadFile(filepath.Join(pkg, "DEBIAN/control"))
	debSum := sha256.Sum256(debData)
	packages := fmt.Sprintf("%sFilename: ./hutch-demo_1.0_all.deb\nSize: %d\nSHA256: %s\n\n", control, len(debData), hex.EncodeToString(debSum[:]))
	pkgSum := sha256.Sum256([]byte(packages))
	release := fmt.Sprintf("Origin: hutch tests\nLabel: hutch tests\nSuite: test\nCodename: test\nDate: %s\nArchitectures: all amd64 arm64\nSHA256:\n %s %d Packages\n",
		time.Now().UTC().Format(time.RFC1123), hex.EncodeToString(pkgSum[:]), len(packages))
	return map[string][]byte{"Packages": []byte(packages), "Release": []byte(release), "hutch-demo_1.0_all.deb": debData}
}

// stopNetBuilders stops the buildkitds of the root's build allow lists
// and waits until nothing of them runs.
func (e *env) stopNetBuilders() {
	e.t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(e.root, "buildnet", "*"))
	for _, dir := range dirs {
		if b, err := os.ReadFile(filepath.Join(dir, "supervisor.pid")); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				syscall.Kill(pid, syscall.SIGTERM)
			}
		}
		for deadline := time.Now().Add(30 * time.Second); len(processesMentioning(dir)) > 0; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				e.t.Errorf("buildkitd of %s still runs:\n%s", dir, strings.Join(processesMentioning(dir), "\n"))
				break
			}
		}
	}
}

// stepNetns lists the network namespaces of build steps on the host.
func stepNetns(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "hutch-build-") {
			ns = append(ns, f[0])
		}
	}
	return ns
}

// buildProbes is a RUN step that tries what the build allow list
// allowed.test:443 does not allow, each bounded to 5 s, and writes one
// line per attempt to /probes.txt: another name on the allowed name's
// address (the egress gateway judges the TLS server name), a name the
// resolver does not admit, another address and port of the test host,
// and the cloud metadata address. A broken policy reaches the test host,
// which answers "testhost".
func buildProbes(w *testWorld) string {
	probes := []string{
		"https://denied.test/ --resolve denied.test:443:" + w.public,
		"https://denied.test/",
		"http://" + w.other + ":8080/",
		"http://" + w.testHost + ":8080/",
		"http://" + metadataIP + "/",
	}
	var b strings.Builder
	b.WriteString("RUN : > /probes.txt")
	for _, p := range probes {
		fmt.Fprintf(&b, " && { out=$(curl -fsS -m 5 %s 2>&1) && echo \"reached %s: $out\" || echo \"refused %s\"; } >> /probes.txt", p, p, p)
	}
	return b.String() + "\n"
}

// A build given an allow list gets a network in its RUN steps that
// reaches what the list names and nothing else, enforced as a sandbox's
// --net allow is (the firewall, the resolver, the egress gateway), and
// trusting the host's CAs: pip installs a wheel from the test's own
// index, served over HTTPS with a certificate of a CA only the state
// root trusts, reached by name through the test's DNS server. Every
// other destination is refused, and reaches no test host. Without
// --allow the same steps have no network. No step network outlives its
// step, nor the daemon.
func TestBuildNetwork(t *testing.T) {
	e := newEnv(t)
	e.root = baseArchive(t)
	w := newTestWorld(t)
	ca := newTestCA(t)
	index := servePkgMirror(t, w, ca)
	e.ok("ca", "add", "--name", "build-net-ca", ca.file)
	t.Cleanup(func() { e.run(nil, "ca", "rm", "build-net-ca") })
	t.Cleanup(e.stopNetBuilders)
	before := stepNetns(t)

	pip := "RUN pip install --break-system-packages --retries 0 --timeout 10 --index-url https://allowed.test/simple hutchdemo\n"
	dockerfile := "FROM base\nUSER root\n" + pip + buildProbes(w) +
		"RUN python3 -c 'import hutchdemo; print(hutchdemo.VALUE)' > /value.txt\n"
	ctxDir := writeContext(t, map[string]string{"Dockerfile": dockerfile})
	tag := "build-net-test"
	t.Cleanup(func() { e.run(nil, "image", "rm", tag) })
	start := time.Now()
	r := e.run(nil, "image", "build", "--progress", "plain", "--allow", "allowed.test:443", "--dns", w.testHost, "-t", tag, ctxDir)
	if r.code != 0 {
		t.Fatalf("build with --allow: %s\nindex saw:\n%s", r, index.requests())
	}
	t.Logf("build with network: %s", time.Since(start).Round(time.Millisecond))
	out := e.ok("run", "--rm", "--image", tag, "--", "cat", "/value.txt", "/probes.txt")
	if !strings.Contains(out, "from-the-test-index") {
		t.Errorf("hutchdemo did not come from the test's index:\n%s", out)
	}
	if strings.Contains(out, "reached") || strings.Count(out, "refused") != 5 {
		t.Errorf("a build step reached what its allow list does not name:\n%s", out)
	}
	hits := index.requests()
	if !strings.Contains(hits, "allowed.test allowed.test /files/hutchdemo-1.0-py3-none-any.whl") {
		t.Errorf("the index did not serve the wheel by its name; it saw:\n%s", hits)
	}
	if strings.Contains(hits, "denied.test") {
		t.Errorf("a denied name reached the test host:\n%s", hits)
	}
	if ns := stepNetns(t); len(ns) != len(before) {
		t.Errorf("step networks outlive their steps: %q (before the build: %q)", ns, before)
	}

	// Without --allow: no network, whatever the Dockerfile asks.
	seen := len(index.requests())
	ctxDir = writeContext(t, map[string]string{"Dockerfile": "FROM base\n" + pip})
	r = e.run(nil, "image", "build", "--progress", "plain", ctxDir)
	if r.code == 0 {
		t.Errorf("pip reached the index from a build without --allow: %s", r)
	}
	if len(index.requests()) != seen {
		t.Errorf("a build without --allow reached the index:\n%s", index.requests())
	}
	e.stopBuilder()

	// Bad input names what is wrong and builds nothing.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--allow", "no such rule!"}, "not an address, CIDR or domain name"},
		{[]string{"--dns", w.testHost}, "without an allow list"},
		{[]string{"--allow", "allowed.test", "--dns", "not-an-address"}, `build DNS server "not-an-address"`},
	} {
		assertOneLineError(t, e.run(nil, append(append([]string{"image", "build"}, tc.args...), ctxDir)...), tc.want)
	}

	e.stopNetBuilders()
	if ns := stepNetns(t); len(ns) != len(before) {
		t.Errorf("step networks outlive the daemon: %q", ns)
	}
}

// The E2B SDK's Template builder through `hutch serve --build-allow`:
// aptInstall, pipInstall and npmInstall install from the test's mirror,
// the one destination the operator's build allow list names, over HTTPS
// trusted through the host's CAs; a step that reaches another host fails
// the build, and the mirror never sees a name it does not serve
// (integration/e2b/buildnet.mjs).
func TestServeTemplateBuildNetwork(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	base := baseArchive(t)
	w := newTestWorld(t)
	ca := newTestCA(t)
	mirror := servePkgMirror(t, w, ca)
	s := newServer(t, base)
	s.env.ok("ca", "add", "--name", "build-net-ca", ca.file)
	t.Cleanup(func() { s.env.run(nil, "ca", "rm", "build-net-ca") })
	t.Cleanup(s.env.stopNetBuilders)
	s.flags = append(s.flags, "--build-allow", "allowed.test:443", "--build-dns", w.testHost)
	key := s.tenantAdd("netbuilder")
	s.serve()
	s.runScript(t, "buildnet.mjs", key, map[string]string{"HUTCH_MIRROR": "https://allowed.test"}, 20*time.Minute)
	hits := mirror.requests()
	for _, want := range []string{"/apt/Packages", "/files/hutchdemo-1.0-py3-none-any.whl", "/npm/hutch-demo/-/hutch-demo-1.0.0.tgz"} {
		if !strings.Contains(hits, want) {
			t.Errorf("the mirror did not serve %s; it saw:\n%s", want, hits)
		}
	}
	if strings.Contains(hits, "denied.test") {
		t.Errorf("a denied name reached the test host:\n%s", hits)
	}
	s.stopBuilder()
	s.env.stopNetBuilders()
	s.stopAndCheckClean()
}
