package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// testCA is a certificate authority made by the test, unknown to every
// system trust store.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // its certificate, PEM
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "hutch test CA", Organization: []string{"hutch tests"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, file: filepath.Join(t.TempDir(), "test-ca.crt")}
	if err := os.WriteFile(ca.file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return ca
}

// serverCert is a TLS certificate for ip signed by the CA.
func (ca *testCA) serverCert(t *testing.T, ip string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: ip},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP(ip)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// gitRef is the one branch the test server's repository advertises.
const gitRef = "0123456789abcdef0123456789abcdef01234567\trefs/heads/main"

// serveHTTPS serves, on the test host's port 443, "tls-ok" at / and a
// repository over git's dumb HTTP protocol at /repo.git, with a
// certificate of ca.
func serveHTTPS(t *testing.T, w *testWorld, ca *testCA) string {
	t.Helper()
	l := w.listenInNetns("tcp", net.JoinHostPort(w.testHost, "443")).(net.Listener)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "tls-ok") })
	mux.HandleFunc("/repo.git/info/refs", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(rw, gitRef)
	})
	srv := &http.Server{
		Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.serverCert(t, w.testHost)}},
		// Clients that refuse the certificate end their handshakes.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go srv.ServeTLS(l, "", "") //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return "https://" + w.testHost
}

// tlsClients are the programs of the base image that must trust the
// sandbox's CAs: each fetches from url, and certError matches what each
// says when it does not trust the server's certificate.
var tlsClients = []struct {
	name      string
	cmd       func(url string) []string
	want      string
	certError *regexp.Regexp
}{
	{"curl", func(u string) []string { return []string{"curl", "-sS", "--max-time", "10", u + "/"} },
		"tls-ok", regexp.MustCompile(`SSL certificate problem: unable to get local issuer certificate`)},
	{"python urllib", func(u string) []string {
		return []string{"python3", "-c", "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())", u + "/"}
	}, "tls-ok", regexp.MustCompile(`CERTIFICATE_VERIFY_FAILED`)},
	// The base image's requests is pip's own copy, which pip itself uses.
	{"python requests (pip's)", func(u string) []string {
		return []string{"python3", "-c", "import sys; from pip._vendor import requests; print(requests.get(sys.argv[1], timeout=10).text)", u + "/"}
	}, "tls-ok", regexp.MustCompile(`CERTIFICATE_VERIFY_FAILED`)},
	{"node https", func(u string) []string {
		return []string{"node", "-e", `require("https").get(process.argv[1], r => r.pipe(process.stdout)).on("error", e => { console.error(e.code, e.message); process.exit(1) })`, u + "/"}
	}, "tls-ok", regexp.MustCompile(`UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT_LOCALLY`)},
	{"git", func(u string) []string { return []string{"git", "ls-remote", u + "/repo.git"} },
		"refs/heads/main", regexp.MustCompile(`server certificate verification failed|SSL certificate problem`)},
}

// checkTLSClients runs every TLS client in sandbox id against url: each
// must succeed if trusted, else fail with its certificate error.
func checkTLSClients(t *testing.T, e *env, id, url string, trusted bool) {
	t.Helper()
	for _, c := range tlsClients {
		r := e.run(nil, append([]string{"exec", "--timeout", "30s", id, "--"}, c.cmd(url)...)...)
		switch {
		case trusted && (r.code != 0 || !strings.Contains(r.stdout, c.want)):
			t.Errorf("%s with the CA trusted: %s", c.name, r)
		case !trusted && (r.code == 0 || !c.certError.MatchString(r.stderr)):
			t.Errorf("%s without the CA: want a certificate error matching %q: %s", c.name, c.certError, r)
		}
	}
}

// A sandbox given --ca-cert reaches an HTTPS server whose certificate
// that CA signed with curl, Python, pip's requests, Node and git; one
// without it fails each with a certificate error; the state root's
// trusted CAs (hutch ca add) reach new sandboxes without the flag.
func TestCACertTrust(t *testing.T) {
	e := newEnv(t)
	e.root = baseArchive(t)
	w := newTestWorld(t)
	ca := newTestCA(t)
	url := serveHTTPS(t, w, ca)
	netFlags := []string{"--image", "base", "--net", "allow", "--allow", w.testHost + ":443"}

	without := e.create(netFlags...)
	with := e.create(append(netFlags, "--ca-cert", ca.file)...)
	t.Run("without", func(t *testing.T) { checkTLSClients(t, e, without, url, false) })
	t.Run("with --ca-cert", func(t *testing.T) { checkTLSClients(t, e, with, url, true) })

	// The image's own authorities stay trusted: the bundle is the
	// image's plus the CA.
	count := func(id string) int {
		var n int
		fmt.Sscan(e.ok("exec", id, "--", "grep", "-c", "BEGIN CERTIFICATE", "/etc/ssl/certs/ca-certificates.crt"), &n)
		return n
	}
	if a, b := count(without), count(with); a < 100 || b != a+1 {
		t.Errorf("system bundle holds %d certificates without --ca-cert and %d with: want the image's plus one", a, b)
	}
	// The sandbox cannot change it, and a snapshot does not keep it.
	if r := e.run(nil, "exec", with, "--", "sh", "-c", "echo x >> /etc/ssl/certs/ca-certificates.crt"); r.code == 0 {
		t.Errorf("the sandbox rewrote its CA bundle: %s", r)
	}
	snap := "ca-trust-snap"
	e.ok("snapshot", with, "-t", snap)
	t.Cleanup(func() { e.run(nil, "image", "rm", snap) })
	fromSnap := e.create("--image", snap, "--net", "allow", "--allow", w.testHost+":443")
	if r := e.run(nil, "exec", fromSnap, "--", "curl", "-sS", "--max-time", "10", url+"/"); r.code == 0 {
		t.Errorf("a snapshot of a sandbox with --ca-cert trusts the CA: %s", r)
	}
	e.ok("rm", "-f", without, with, fromSnap)

	// One command, as the sandbox's init.
	r := e.run(nil, append(append([]string{"run", "--rm"}, netFlags...), "--ca-cert", ca.file, "--", "curl", "-sS", "--max-time", "10", url+"/")...)
	if r.code != 0 || !strings.Contains(r.stdout, "tls-ok") {
		t.Errorf("run --rm --ca-cert: %s", r)
	}

	// The state root's setting.
	if name := strings.TrimSpace(e.ok("ca", "add", "--name", "hutch-test-ca", ca.file)); name != "hutch-test-ca" {
		t.Fatalf("ca add printed %q", name)
	}
	t.Cleanup(func() { e.run(nil, "ca", "rm", "hutch-test-ca") })
	if out := e.ok("ca", "ls"); !strings.Contains(out, "hutch-test-ca") || !strings.Contains(out, "CN=hutch test CA") {
		t.Fatalf("ca ls:\n%s", out)
	}
	rootWide := e.create(netFlags...)
	t.Run("with hutch ca add", func(t *testing.T) { checkTLSClients(t, e, rootWide, url, true) })
	e.ok("ca", "rm", "hutch-test-ca")
	after := e.create(netFlags...)
	if r := e.run(nil, "exec", after, "--", "curl", "-sS", "--max-time", "10", url+"/"); r.code == 0 {
		t.Errorf("a sandbox made after ca rm still trusts the CA: %s", r)
	}
	e.ok("rm", "-f", rootWide, after)
}

// Bad --ca-cert files fail before anything is made, naming the file.
func TestCACertBadInput(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "key.pem")
	os.WriteFile(key, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600)
	large := filepath.Join(dir, "large.crt")
	os.WriteFile(large, make([]byte, 2<<20), 0o644)
	for _, tc := range []struct{ file, want string }{
		{"/nonexistent/ca.crt", "/nonexistent/ca.crt"},
		{"/etc/hostname", "/etc/hostname: no PEM certificate"},
		{key, "is a \"PRIVATE KEY\", not a CERTIFICATE"},
		{large, "larger than 1024 KiB"},
	} {
		for _, args := range [][]string{
			{"create", "--image", "busybox", "--ca-cert", tc.file},
			{"run", "--rm", "--image", "busybox", "--ca-cert", tc.file, "--", "true"},
			{"image", "pull", "--ca-cert", tc.file, "127.0.0.1:1/x:y"},
			{"ca", "add", tc.file},
		} {
			assertOneLineError(t, e.run(nil, args...), tc.want)
		}
	}
	if all := e.list(); len(all) != 0 {
		t.Fatalf("a bad --ca-cert left sandboxes: %+v", all)
	}
	if cas := strings.TrimSpace(e.ok("ca", "ls", "--format", "json")); cas != "[]" {
		t.Fatalf("a bad ca add kept something: %s", cas)
	}
}

// hutch's registry client trusts --ca-cert and the state root's CAs: a
// registry on loopback with a certificate of the test's own CA is refused
// without them, with a message that says what to pass.
func TestRegistryCACert(t *testing.T) {
	ca := newTestCA(t)
	reg := startRegistry(t, nil)
	srv := httptest.NewUnstartedServer(reg.app)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.serverCert(t, "127.0.0.1")}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "https://")
	ref := host + "/test/busybox:tls"

	pusher := newRegEnv(t)
	if r := pusher.run(nil, "image", "push", "busybox", ref); r.code != 125 || !strings.Contains(r.stderr, "--ca-cert") {
		t.Fatalf("push to an untrusted registry: want exit 125 saying to pass --ca-cert: %s", r)
	}
	pusher.ok("image", "push", "--ca-cert", ca.file, "busybox", ref)

	e := newRegEnv(t)
	r := e.run(nil, "image", "pull", ref)
	if r.code != 125 || !strings.Contains(r.stderr, "hutch ca add") {
		t.Fatalf("pull from an untrusted registry: want exit 125 saying how to trust it: %s", r)
	}
	e.assertNothingPulled()
	e.ok("image", "pull", "--ca-cert", ca.file, ref)
	e.ok("image", "rm", ref)
	e.ok("ca", "add", ca.file)
	e.ok("image", "pull", ref)
	if out := e.ok("run", "--rm", "--image", ref, "--", "echo", "pulled over TLS"); !strings.Contains(out, "pulled over TLS") {
		t.Fatalf("run of the pulled image: %q", out)
	}
	// create --pull trusts the sandbox's --ca-cert.
	e2 := newRegEnv(t)
	e2.extra = append(e2.extra, "HUTCH_PULL=missing")
	id := strings.TrimSpace(e2.ok("create", "--image", ref, "--ca-cert", ca.file))
	e2.ok("rm", "-f", id)
}

// doctor names the CA files the host's administrator added that sandboxes
// do not trust yet, and prints the command that trusts them; after it,
// it finds them trusted.
func TestDoctorHostCAs(t *testing.T) {
	e := newEnv(t)
	files, _ := filepath.Glob("/usr/local/share/ca-certificates/*.crt")
	out := e.ok("doctor")
	if len(files) == 0 {
		if !strings.Contains(out, "ok    host CAs   none") {
			t.Fatalf("doctor on a host without extra CAs:\n%s", out)
		}
		return
	}
	m := regexp.MustCompile(`(?m)^\s+(hutch( --root \S+)? ca add .*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("doctor does not say how to trust the host's CAs %v:\n%s", files, out)
	}
	for _, cmd := range strings.Split(m[1], " && ") {
		args := strings.Fields(cmd)[1:]
		if args[0] == "--root" {
			args = args[2:]
		}
		e.ok(args...)
	}
	if out := e.ok("doctor"); !strings.Contains(out, "ok    host CAs") || !strings.Contains(out, "are trusted by sandboxes") {
		t.Fatalf("doctor after running its command:\n%s", out)
	}
}

// A rootless sandbox trusts --ca-cert and the user's own root's CAs, in
// an image without a bundle of its own.
func TestCACertRootless(t *testing.T) {
	e := newRootlessEnv(t)
	ca := newTestCA(t)
	file := filepath.Join(e.bin, "test-ca.crt")
	copyFile(t, ca.file, file)
	pemBytes, err := os.ReadFile(ca.file)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(pemBytes))
	r := e.run(nil, "run", "--rm", "--image", "busybox", "--ca-cert", file, "--", "sh", "-c", `cat "$SSL_CERT_FILE"`)
	if r.code != 0 || strings.TrimSpace(r.stdout) != want {
		t.Fatalf("rootless run --ca-cert: want the CA in $SSL_CERT_FILE: %s", r)
	}
	e.ok("ca", "add", file)
	id := e.create()
	if out := e.ok("exec", id, "--", "cat", "/etc/ssl/certs/ca-certificates.crt"); strings.TrimSpace(out) != want {
		t.Fatalf("rootless sandbox after ca add: bundle %q", out)
	}
	e.ok("rm", "-f", id)
}
