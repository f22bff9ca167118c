package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// serveDomain is the domain the tests' servers and SDK clients use: the
// SDK's sandbox.getHost(port) answers PORT-ID.serveDomain.
const serveDomain = "e2e.hutch.test"

// e2bDir holds the E2B SDK scripts and their pinned node_modules;
// HUTCH_E2B_DIR names another (make e2b-latest: the newest 2.x).
var e2bDir = cmp.Or(os.Getenv("HUTCH_E2B_DIR"), "e2b")

// server is one `hutch serve` of a test: its own state root, tenants file
// and loopback port.
type server struct {
	*env
	port    int
	tenants string
	audit   string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
	// noTenants starts the server without --tenants: apiKey is then the
	// key it made (serve/api.key under its root), once it answers.
	noTenants bool
	apiKey    string
	// flags are more flags of hutch serve.
	flags []string
	// nofile, if set, is the server's limit of open files (soft and
	// hard), set as soon as it starts.
	nofile uint64
	// listen, if set, is the address the server listens on, instead of
	// a free loopback port.
	listen string
	// tls, if set, is the client side of a server that speaks HTTPS
	// (its flags are the test's): the test's clients trust its roots,
	// and address the API as https://api.serveDomain at listen.
	tls *tlsClient
}

// tlsClient is how the tests reach a server over TLS.
type tlsClient struct {
	// roots are the CAs the clients trust; caFile holds them, for
	// NODE_EXTRA_CA_CERTS. Without roots, the clients trust what caFile
	// holds when they are made.
	roots  *x509.CertPool
	caFile string
	// netns is the network namespace the SDK's scripts run in, whose
	// resolver answers serveDomain's names with the server's address.
	netns string
}

// sharedBase is the state root in which the default image ("base") is
// built once per test process: building it takes a minute, unpacking its
// root filesystem in a fresh root up to half a minute under load. TestMain
// removes it.
var sharedBase struct {
	once    sync.Once
	dir     string
	archive string
	err     error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedBase.dir != "" {
		os.RemoveAll(sharedBase.dir)
	}
	removeCodeRoot()
	os.Exit(code)
}

// baseArchive is a state root in which the default image is built (and
// its root filesystem unpacked), made by the first test that asks; every
// later one gets the same root, or the same error. Tests that need base
// share it, one after another, so that base is built and unpacked once a
// run. HUTCH_SERVE_BASE_ARCHIVE names an archive made earlier (`hutch image
// export base:latest FILE`) to import instead of building.
func baseArchive(t *testing.T) string {
	t.Helper()
	sharedBase.once.Do(func() {
		if sharedBase.dir, sharedBase.err = os.MkdirTemp("", "hutch-serve-root-"); sharedBase.err != nil {
			return
		}
		e := &env{t: t, bin: binDir(t), root: sharedBase.dir}
		defer e.stopBuilder()
		start := time.Now()
		if a := os.Getenv("HUTCH_SERVE_BASE_ARCHIVE"); a != "" {
			if r := e.run(nil, "image", "import", "base", a); r.code != 0 {
				sharedBase.err = fmt.Errorf("importing HUTCH_SERVE_BASE_ARCHIVE: %s", r)
				return
			}
		}
		if r := e.run(nil, "run", "--rm", "--image", "base", "--", "true"); r.code != 0 {
			sharedBase.err = fmt.Errorf("building the base image: %s", r)
			return
		}
		sharedBase.archive = sharedBase.dir
		t.Logf("base image ready in %s", time.Since(start).Round(time.Second))
	})
	if sharedBase.err != nil {
		t.Fatal(sharedBase.err)
	}
	return sharedBase.archive
}

// newServer prepares a `hutch serve` of the test: on base's shared state
// root (from baseArchive) if base is not empty, else on a fresh one, and
// an empty tenants file. Add tenants with tenantAdd, then start it with
// serve. Every sandbox of the root is removed when the test ends.
func newServer(t *testing.T, base string) *server {
	t.Helper()
	e := newEnv(t)
	if base != "" {
		e.root = base
	}
	dir := t.TempDir()
	return &server{
		env:     e,
		tenants: filepath.Join(dir, "tenants"),
		audit:   filepath.Join(dir, "audit.jsonl"),
		logPath: filepath.Join(dir, "serve.log"),
	}
}

// serve starts the server on a free loopback port and waits until it
// answers GET /health. It is stopped at the end of the test if the test
// did not stop it.
func (s *server) serve() {
	s.t.Helper()
	// A port found free can be taken before serve binds it: try a few.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if lastErr = s.start(); lastErr == nil {
			s.t.Cleanup(func() {
				if !s.stopped {
					s.stop()
				}
			})
			return
		}
	}
	s.t.Fatalf("hutch serve did not come up: %v\nserver log:\n%s", lastErr, s.logTail(40))
}

func (s *server) start() error {
	if s.listen == "" {
		s.port = freePort(s.t)
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	s.cmd = s.env.cmd(nil, s.args()...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start hutch serve: %w", err)
	}
	if s.nofile > 0 {
		lim := unix.Rlimit{Cur: s.nofile, Max: s.nofile}
		if err := unix.Prlimit(s.cmd.Process.Pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
			s.cmd.Process.Kill()
			return fmt.Errorf("limit hutch serve's open files: %w", err)
		}
	}
	s.exited = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.exited) }() //nolint:errcheck // the exit status is read from ProcessState
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("hutch serve exited: %v", s.cmd.ProcessState)
		default:
		}
		if resp, err := s.client().Get(s.url("/health")); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				s.readAPIKey()
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.cmd.Process.Kill()
	<-s.exited
	return fmt.Errorf("GET /health did not answer 200 within 30s")
}

// args are the arguments of the server's hutch serve.
func (s *server) args() []string {
	args := []string{"--root", s.root, "serve", "--listen", s.addr(), "--domain", serveDomain, "--audit-log", s.audit}
	if !s.noTenants {
		args = append(args, "--tenants", s.tenants)
	}
	return append(args, s.flags...)
}

// apiKeyFile is where a server without tenants keeps its key.
func (s *server) apiKeyFile() string { return filepath.Join(s.root, "serve", "api.key") }

// readAPIKey reads the key of a server without tenants, if it made one.
func (s *server) readAPIKey() {
	if !s.noTenants {
		return
	}
	if b, err := os.ReadFile(s.apiKeyFile()); err == nil {
		s.apiKey = strings.TrimSpace(string(b))
	}
}

func (s *server) addr() string {
	if s.listen != "" {
		return s.listen
	}
	return "127.0.0.1:" + strconv.Itoa(s.port)
}

// url is path at the server's API: http://ADDR, or over TLS
// https://api.serveDomain[:PORT], as the SDK addresses it.
func (s *server) url(path string) string {
	if s.tls == nil {
		return "http://" + s.addr() + path
	}
	host := "api." + serveDomain
	if _, port, _ := net.SplitHostPort(s.addr()); port != "443" {
		host += ":" + port
	}
	return "https://" + host + path
}

// client is an HTTP client of the server: over TLS, one that trusts its
// roots and dials its address for every name (HTTP/2 where offered).
func (s *server) client() *http.Client {
	if s.tls == nil {
		return httpClient
	}
	addr := s.addr()
	roots := s.tls.roots
	if roots == nil {
		// A CA the server makes: in caFile once it has.
		roots = x509.NewCertPool()
		if b, err := os.ReadFile(s.tls.caFile); err == nil {
			roots.AppendCertsFromPEM(b)
		}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
}

// stop sends SIGTERM and waits (30s at most) for a graceful exit.
func (s *server) stop() {
	s.t.Helper()
	s.stopped = true
	select {
	case <-s.exited:
		s.t.Errorf("hutch serve had exited before the end of the test: %v\nserver log:\n%s", s.cmd.ProcessState, s.logTail(40))
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		if !s.cmd.ProcessState.Success() {
			s.t.Errorf("hutch serve did not exit cleanly on SIGTERM: %v\nserver log:\n%s", s.cmd.ProcessState, s.logTail(40))
		}
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
		s.t.Errorf("hutch serve did not stop within 30s of SIGTERM\nserver log:\n%s", s.logTail(40))
	}
}

// logTail is the last n lines the server logged.
func (s *server) logTail(n int) string {
	b, _ := os.ReadFile(s.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// tenantAdd creates a tenant and returns its API key.
func (s *server) tenantAdd(name string, flags ...string) string {
	s.t.Helper()
	args := append([]string{"tenant", "add", "--tenants", s.tenants}, flags...)
	out := s.ok(append(args, name)...)
	key := strings.TrimSpace(out)
	if !strings.HasPrefix(key, "e2b_") || strings.ContainsAny(key, " \n") {
		s.t.Fatalf("hutch tenant add %s printed %q, want one API key e2b_...", name, out)
	}
	return key
}

// sandboxIDs lists the IDs of the sandboxes in the server's root, as
// `hutch ls` sees them, sorted.
func (s *server) sandboxIDs() []string {
	s.t.Helper()
	var ids []string
	for _, r := range s.list() {
		ids = append(ids, r.ID)
	}
	sort.Strings(ids)
	return ids
}

// stopAndCheckClean ends a test: no sandbox is left in the server's root,
// the server stops on SIGTERM, and no runsc or other process of that root
// remains.
func (s *server) stopAndCheckClean() {
	s.t.Helper()
	if ids := s.sandboxIDs(); len(ids) > 0 {
		s.t.Errorf("sandboxes left after the test: %v", ids)
	}
	s.stop()
	var left []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if left = processesMentioning(s.root); len(left) == 0 {
			break
		}
	}
	if len(left) > 0 {
		s.t.Errorf("processes of the server's root left after it stopped:\n%s", strings.Join(left, "\n"))
	}
}

// apiResponse is one plain HTTP exchange with the server.
type apiResponse struct {
	status int
	body   string
	header http.Header
}

func (r apiResponse) String() string {
	b := r.body
	if len(b) > 500 {
		b = b[:500] + "..."
	}
	return fmt.Sprintf("%d %s", r.status, b)
}

// errorBody decodes E2B's REST error shape {code, message}.
func (r apiResponse) errorBody() (code int, message string, err error) {
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(r.body), &e); err != nil {
		return 0, "", fmt.Errorf("not E2B's error shape {code, message}: %w: %s", err, r)
	}
	return e.Code, e.Message, nil
}

// do sends one request to the server and reads the whole answer.
func (s *server) do(method, path string, body io.Reader, header map[string]string) apiResponse {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.url(path), body)
	if err != nil {
		s.t.Fatal(err)
	}
	for k, v := range header {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	c := http.DefaultClient
	if s.tls != nil {
		c = s.client()
	}
	resp, err := c.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v\nserver log:\n%s", method, path, err, s.logTail(20))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		s.t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return apiResponse{status: resp.StatusCode, body: string(b), header: resp.Header}
}

// createdSandbox is the part of POST /sandboxes' answer the tests use.
type createdSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

// createSandbox creates a sandbox of template through the REST API.
func (s *server) createSandbox(key, template string) createdSandbox {
	s.t.Helper()
	r := s.do("POST", "/sandboxes", strings.NewReader(`{"templateID":`+strconv.Quote(template)+`,"timeout":600}`),
		map[string]string{"X-API-KEY": key, "Content-Type": "application/json"})
	if r.status != http.StatusCreated {
		s.t.Fatalf("POST /sandboxes %s: %s\nserver log:\n%s", template, r, s.logTail(20))
	}
	var c createdSandbox
	if err := json.Unmarshal([]byte(r.body), &c); err != nil || c.SandboxID == "" {
		s.t.Fatalf("POST /sandboxes answer: %v: %s", err, r)
	}
	return c
}

// envdHeaders address a data-plane request to a sandbox the way the SDK
// does through E2B_SANDBOX_URL.
func envdHeaders(key string, sb createdSandbox) map[string]string {
	h := map[string]string{
		"X-API-KEY":        key,
		"E2b-Sandbox-Id":   sb.SandboxID,
		"E2b-Sandbox-Port": "49983",
	}
	if sb.EnvdAccessToken != "" {
		h["X-Access-Token"] = sb.EnvdAccessToken
	}
	return h
}

// scriptCheck is one check an E2B SDK script reported.
type scriptCheck struct {
	Name  string   `json:"name"`
	OK    bool     `json:"ok"`
	MS    int      `json:"ms"`
	Error string   `json:"error"`
	Notes []string `json:"notes"`
}

var npmOnce sync.Once

// requireSDK fails unless the pinned E2B SDK is installed
// (`make e2b-sdk`, which runs npm ci in integration/e2b).
func requireSDK(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed (scripts/install-deps.sh installs nodejs and npm)")
	}
	var pkg struct {
		Version string `json:"version"`
	}
	b, err := os.ReadFile(filepath.Join(e2bDir, "node_modules", "e2b", "package.json"))
	if err == nil {
		err = json.Unmarshal(b, &pkg)
	}
	if err != nil {
		t.Fatalf("the E2B SDK is not installed in integration/e2b (run `make e2b-sdk`): %v", err)
	}
	npmOnce.Do(func() { t.Logf("E2B SDK e2b@%s, %s", pkg.Version, node) })
	return node
}

// runScript runs an E2B SDK script against s with the SDK's four variables
// (the API key is key) plus extra, and reports each check the script made as
// a subtest named after it. It returns the script's `KEEP` line, if any.
func (s *server) runScript(t *testing.T, script, key string, extra map[string]string, timeout time.Duration) string {
	t.Helper()
	return s.runScriptIn(t, e2bDir, script, key, extra, timeout)
}

// runScriptIn is runScript for a script of directory dir (of integration/).
func (s *server) runScriptIn(t *testing.T, dir, script, key string, extra map[string]string, timeout time.Duration) string {
	t.Helper()
	node := requireSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, script))
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+s.url(""),
		"E2B_SANDBOX_URL="+s.url(""),
		"E2B_API_KEY="+key,
		"E2B_DOMAIN="+serveDomain,
		"HUTCH_SERVE_PORT="+strconv.Itoa(s.port),
	)
	if s.tls != nil {
		// What a user of the SDK sets against a real deployment: the
		// key and the domain; names resolve in the namespace's DNS.
		cmd = exec.CommandContext(ctx, "ip", "netns", "exec", s.tls.netns, node, filepath.Join(dir, script))
		cmd.Env = append(withoutEnv(os.Environ(), "E2B_", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"),
			"E2B_API_KEY="+key, "E2B_DOMAIN="+serveDomain, "NODE_EXTRA_CA_CERTS="+s.tls.caFile)
	}
	for k, v := range extra {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return runNodeChecks(t, ctx, cmd, script, timeout, func() string { return s.logTail(15) })
}

// runNodeChecks runs cmd, a node script of CHECK lines (e2b/lib.mjs),
// and reports each check as a subtest named after it, with serverLog's
// tail on a failure. It returns the script's `KEEP` line, if any.
func runNodeChecks(t *testing.T, ctx context.Context, cmd *exec.Cmd, script string, timeout time.Duration, serverLog func() string) string {
	t.Helper()
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("node %s: %v", script, err)
	}
	var other []string
	var keep string
	finished := false
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "CHECK "):
			var c scriptCheck
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "CHECK ")), &c); err != nil {
				t.Errorf("%s printed a malformed check line %q: %v", script, line, err)
				continue
			}
			t.Run(c.Name, func(t *testing.T) {
				t.Logf("(%d ms)", c.MS)
				for _, n := range c.Notes {
					t.Log(n)
				}
				if !c.OK {
					t.Errorf("%s (after %d ms)\nserver log:\n%s", c.Error, c.MS, serverLog())
				}
			})
		case strings.HasPrefix(line, "KEEP "):
			keep = strings.TrimPrefix(line, "KEEP ")
		case strings.HasPrefix(line, "DONE "):
			finished = true
		default:
			other = append(other, line)
		}
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Errorf("%s did not finish within %s", script, timeout)
	}
	if !finished {
		t.Errorf("%s ended without finishing its checks (%v)\nstdout:\n%s\nstderr:\n%s", script, err, strings.Join(other, "\n"), stderr.String())
	} else if err != nil && !t.Failed() {
		t.Errorf("%s: %v\nstderr:\n%s", script, err, stderr.String())
	}
	if len(other) > 0 || stderr.Len() > 0 {
		t.Logf("%s output:\n%s\n%s", script, strings.Join(other, "\n"), stderr.String())
	}
	return keep
}

// withoutEnv is env without the variables whose names start with any of
// prefixes.
func withoutEnv(env []string, prefixes ...string) []string {
	var out []string
next:
	for _, kv := range env {
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// auditLines is the server's audit log, one decoded JSON object a line.
func (s *server) auditLines() ([]map[string]any, error) {
	b, err := os.ReadFile(s.audit)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for i, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			return nil, fmt.Errorf("audit log line %d is not JSON: %w: %q", i+1, err, l)
		}
		out = append(out, m)
	}
	return out, nil
}
