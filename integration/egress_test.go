package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// siteCert is a TLS certificate for the DNS names, signed by the CA.
func (ca *testCA) siteCert(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: names, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serveSites runs an HTTPS server on port 443 of every address of the
// test host, as a CDN's edge does: one certificate for every test name,
// and an answer saying which address was reached and which server name
// and Host the request carried.
func serveSites(t *testing.T, w *testWorld, ca *testCA) {
	t.Helper()
	l := w.listenInNetns("tcp", "0.0.0.0:443").(net.Listener)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
			ip, _, _ := net.SplitHostPort(local.String())
			fmt.Fprintf(rw, "site=%s sni=%s host=%s auth=%s key=%s\n", ip, r.TLS.ServerName, r.Host,
				digestOf(r.Header.Get("Authorization")), digestOf(r.Header.Get("X-Key")))
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.siteCert(t, "allowed.test", "neighbour.test", "denied.test")}},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go srv.ServeTLS(l, "", "") //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
}

// digestOf is how the test servers show a header's value: a digest, so
// that a secret's value never travels back into the sandbox.
func digestOf(v string) string {
	if v == "" {
		return "-"
	}
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:8])
}

// buildWebProbe builds integration/webprobe, static, for the sandbox.
func buildWebProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "webprobe")
	cmd := exec.Command("go", "build", "-o", out, "./webprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build webprobe: %v: %s", err, b)
	}
	return out
}

// webProbe runs webprobe inside sandbox id and returns what it printed.
func webProbe(e *env, id, mode, addr, sni, host string) string {
	e.t.Helper()
	r := e.run(nil, "exec", "--timeout", "20s", id, "--", "/webprobe", mode, addr, sni, host)
	return r.stdout + r.stderr
}

// egressEntry is the part of an egress log entry the tests read.
type egressEntry struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Decision string `json:"decision"`
	Rule     string `json:"rule"`
	Reason   string `json:"reason"`
	Upstream string `json:"upstream"`
	BytesIn  int64  `json:"bytes_in"`
}

// The egress gateway, from inside a sandbox in mode allow that may reach
// allowed.test only, against HTTPS and HTTP servers that answer on every
// test address for every name: a connection opens the site its TLS server
// name or HTTP Host names, if a rule allows that name, whatever address
// the sandbox connected to. Each attempt is in the egress log with its
// decision.
func TestEgressGateway(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	serveSites(t, w, newTestCA(t))
	id := e.create("--net", "allow", "--dns", w.testHost, "--allow", "allowed.test")
	e.copyIn(id, buildWebProbe(t), "/webprobe")
	site := func(ip string) string { return "site=" + ip + " " }

	// The allowed name opens its site, over TLS and plain HTTP.
	if out := webProbe(e, id, "tls", "allowed.test:443", "allowed.test", "allowed.test"); !strings.Contains(out, site(w.public)+"sni=allowed.test") {
		t.Fatalf("HTTPS to the allowed name: %s", out)
	}
	if out := webProbe(e, id, "http", "allowed.test:80", "", "allowed.test"); !strings.Contains(out, "testhost") {
		t.Fatalf("HTTP to the allowed name: %s", out)
	}

	// The CDN case: the address is allowed.test's (and the sandbox has
	// just resolved it), the name another site's.
	if out := webProbe(e, id, "tls", "allowed.test:443", "neighbour.test", "neighbour.test"); strings.Contains(out, "site=") {
		t.Errorf("a name no rule allows, on the allowed name's address, opened: %s", out)
	}
	// No server name at all, and an address literal for a Host.
	if out := webProbe(e, id, "tls", w.public+":443", "", w.public); strings.Contains(out, "site=") {
		t.Errorf("a ClientHello without a server name opened a site: %s", out)
	}
	out := webProbe(e, id, "http", w.public+":80", "", w.public)
	if strings.Contains(out, "testhost") || !strings.Contains(out, "403") {
		t.Errorf("HTTP naming an address where the rules name hosts: want 403 from the gateway: %s", out)
	}
	// Domain fronting over HTTP: the allowed name's address, another
	// site's Host.
	out = webProbe(e, id, "http", "allowed.test:80", "", "denied.test")
	if strings.Contains(out, "testhost") || !strings.Contains(out, "host denied.test port 80 is not allowed") {
		t.Errorf("HTTP with the Host of a denied site on the allowed name's address: %s", out)
	}

	// UDP to the web ports (QUIC) of an address the resolver admitted
	// is rejected, since the gateway does not read it; another UDP port
	// of that address still passes, as allowed.test's rule has no port.
	for _, c := range []struct {
		port   string
		arrive bool
	}{{"8443", true}, {"443", false}} {
		conn := w.listenInNetns("udp", net.JoinHostPort(w.public, c.port)).(net.PacketConn)
		webProbe(e, id, "udp", "allowed.test:"+c.port, "-", "quic-"+c.port)
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 64)
		n, _, err := conn.ReadFrom(buf)
		conn.Close()
		if got := err == nil && string(buf[:n]) == "quic-"+c.port; got != c.arrive {
			t.Errorf("UDP to allowed.test:%s arrived: %v, want %v", c.port, got, c.arrive)
		}
	}

	// /etc/hosts inside points the allowed name at another test host: the
	// connection still opens the allowed name's own site, never that
	// host.
	e.ok("exec", id, "--", "sh", "-c", "echo '"+w.other+" allowed.test' > /etc/hosts")
	if out := webProbe(e, id, "tls", "allowed.test:443", "allowed.test", "allowed.test"); !strings.Contains(out, site(w.public)) {
		t.Errorf("with /etc/hosts pointing allowed.test at %s: want the site at %s: %s", w.other, w.public, out)
	}
	if out := webProbe(e, id, "tls", w.other+":443", "allowed.test", "allowed.test"); strings.Contains(out, site(w.other)) {
		t.Errorf("the allowed name's server name sent to another address reached it: %s", out)
	}

	// Every attempt is logged with its decision and, if allowed, its rule.
	var log []egressEntry
	if err := json.Unmarshal([]byte(e.ok("logs", "--egress", "--format", "json", id)), &log); err != nil {
		t.Fatal(err)
	}
	want := []egressEntry{
		{Host: "allowed.test", Port: 443, Decision: "allow", Rule: "allowed.test"},
		{Host: "allowed.test", Port: 80, Decision: "allow", Rule: "allowed.test"},
		{Host: "neighbour.test", Port: 443, Decision: "deny"},
		{Host: "", Port: 443, Decision: "deny"},
		{Host: w.public, Port: 80, Decision: "deny"},
		{Host: "denied.test", Port: 80, Decision: "deny"},
		{Host: "allowed.test", Port: 443, Decision: "allow", Rule: "allowed.test"},
		{Host: "allowed.test", Port: 443, Decision: "allow", Rule: "allowed.test"},
	}
	if len(log) != len(want) {
		t.Fatalf("egress log has %d entries, want %d: %+v", len(log), len(want), log)
	}
	for i, x := range log {
		wx := want[i]
		if x.Host != wx.Host || x.Port != wx.Port || x.Decision != wx.Decision || x.Rule != wx.Rule ||
			(x.Decision == "deny") == (x.Reason == "") {
			t.Errorf("egress log entry %d = %+v, want %+v with a reason if denied", i, x, wx)
		}
		if x.Decision == "allow" && (x.Upstream != net.JoinHostPort(w.public, fmt.Sprint(x.Port)) || x.BytesIn == 0) {
			t.Errorf("egress log entry %d: allowed to upstream %q with %d bytes back, want %s and a response", i, x.Upstream, x.BytesIn, w.public)
		}
	}
	table := e.ok("logs", "--egress", id)
	if !strings.Contains(table, "neighbour.test") || !strings.Contains(table, "deny") {
		t.Errorf("logs --egress:\n%s", table)
	}
	assertOneLineError(t, e.run(nil, "logs", "--egress", "--follow", id), "--follow: not available with --egress")

	// The gateway judges by the policy in force: an update applies to
	// the next connection.
	e.ok("update", id, "--allow", "neighbour.test")
	if out := webProbe(e, id, "tls", w.public+":443", "neighbour.test", "neighbour.test"); !strings.Contains(out, site(w.public)+"sni=neighbour.test") {
		t.Errorf("after update --allow neighbour.test: %s", out)
	}
	if out := webProbe(e, id, "tls", w.public+":443", "allowed.test", "allowed.test"); strings.Contains(out, "site=") {
		t.Errorf("allowed.test opened after an update that no longer allows it: %s", out)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
}

// hostTrustWith is a trust bundle of the host's store and ca, for the
// gateway (Go's SSL_CERT_FILE), as an operator adds a CA to the host's.
func hostTrustWith(t *testing.T, ca *testCA) string {
	t.Helper()
	sys, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Fatal(err)
	}
	extra, err := os.ReadFile(ca.file)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "host-trust.crt")
	if err := os.WriteFile(f, append(append(sys, '\n'), extra...), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// Credential injection: the gateway terminates TLS to the one host an
// inject rule names, with a CA made for the sandbox, and adds the header
// from the host's secret store; the sandbox holds only a placeholder,
// which reaches another allowed host as it is. The secret's value is
// nowhere the sandbox can read (its environment, its processes, its
// files, a snapshot of it) nor in the host's logs and records.
func TestEgressInject(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	ca := newTestCA(t)
	serveSites(t, w, ca)
	e.extra = append(e.extra, "SSL_CERT_FILE="+hostTrustWith(t, ca))
	const secret = "sk-egress-test-4f1c9a7e2b"
	if r := e.run(strings.NewReader(secret+"\n"), "secret", "add", "tok"); r.code != 0 || strings.Contains(r.stdout+r.stderr, secret) {
		t.Fatalf("secret add: %s", r)
	}
	if out := e.ok("secret", "ls"); !strings.Contains(out, "tok") || strings.Contains(out, secret) {
		t.Fatalf("secret ls:\n%s", out)
	}
	// A rule naming a secret the store lacks, or a host no rule allows,
	// fails the create with the reason.
	base := []string{"--net", "allow", "--dns", w.testHost, "--allow", "allowed.test", "--allow", "*.wild.test"}
	if r := e.run(nil, append([]string{"create", "--image", "busybox", "--inject", "allowed.test:X-Key=secret:nope"}, base...)...); r.code != 125 || !strings.Contains(r.stderr, "no secret nope") {
		t.Errorf("create with a missing secret: %s", r)
	}
	if r := e.run(nil, append([]string{"create", "--image", "busybox", "--inject", "denied.test:X-Key=secret:tok"}, base...)...); r.code != 125 || !strings.Contains(r.stderr, "no --allow rule allows denied.test") {
		t.Errorf("create injecting into a host not allowed: %s", r)
	}

	for _, c := range []struct{ inject, net, want string }{
		{"allowed.test:Authorization=Bearer plain", "allow", "must be secret:NAME or hold ${secret:NAME}"},
		{"allowed.test:Bad Header=secret:tok", "allow", "is not an HTTP header name"},
		{"allowed.test:X-Key=secret:tok", "open", "--inject needs --net allow"},
	} {
		args := []string{"create", "--image", "busybox", "--net", c.net, "--dns", w.testHost, "--allow", "allowed.test", "--inject", c.inject}
		if r := e.run(nil, args...); r.code != 125 || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, secret) {
			t.Errorf("create --net %s --inject %q: want exit 125 saying %q: %s", c.net, c.inject, c.want, r)
		}
	}
	if r := e.run(strings.NewReader(""), "secret", "add", "empty"); r.code != 125 || !strings.Contains(r.stderr, "empty value") {
		t.Errorf("secret add with no value: %s", r)
	}
	if r := e.run(strings.NewReader("x"), "secret", "add", "../escape"); r.code != 125 || !strings.Contains(r.stderr, "secret name") {
		t.Errorf("secret add ../escape: %s", r)
	}

	id := e.create(append(base, "--inject", "allowed.test:Authorization=Bearer ${secret:tok}", "--inject", "allowed.test:env=API_KEY=secret:tok")...)
	e.copyIn(id, buildWebProbe(t), "/webprobe")
	ph := strings.TrimSpace(e.ok("exec", id, "--", "sh", "-c", "echo $API_KEY"))
	if !strings.HasPrefix(ph, "hutch-placeholder-") {
		t.Fatalf("API_KEY inside is %q, want a placeholder", ph)
	}
	req := func(addr, host string) string {
		r := e.run(nil, "exec", "--timeout", "20s", id, "--", "sh", "-c", `/webprobe https "$0" "$1" "$1" "X-Key: $API_KEY"`, addr, host)
		return r.stdout + r.stderr
	}
	// The sandbox checks the gateway's certificate against its trust
	// store and gets the real host's answer with both headers injected.
	out := req("allowed.test:443", "allowed.test")
	if want := fmt.Sprintf("site=%s sni=allowed.test host=allowed.test auth=%s key=%s", w.public, digestOf("Bearer "+secret), digestOf(secret)); !strings.Contains(out, want) {
		t.Fatalf("HTTPS to the inject rule's host: want %q in:\n%s", want, out)
	}
	// A paused and resumed sandbox keeps its gateway, CA and rules.
	e.ok("pause", id)
	e.ok("resume", id)
	if out := req("allowed.test:443", "allowed.test"); !strings.Contains(out, "key="+digestOf(secret)) {
		t.Fatalf("after pause and resume: %s", out)
	}
	// Another allowed host gets the placeholder, not the secret.
	if r := e.run(nil, "exec", "--timeout", "20s", id, "--", "sh", "-c", `/webprobe tls api.wild.test:443 api.wild.test api.wild.test "X-Key: $API_KEY"`); !strings.Contains(r.stdout, "key="+digestOf(ph)) || !strings.Contains(r.stdout, "auth=-") {
		t.Errorf("another allowed host: want the placeholder and no Authorization: %s%s", r.stdout, r.stderr)
	}
	// On the terminated connection, a request for another host (fronting)
	// is refused, and gets nothing.
	if r := e.run(nil, "exec", "--timeout", "20s", id, "--", "sh", "-c", `/webprobe https allowed.test:443 allowed.test api.wild.test "X-Key: $API_KEY"`); !strings.Contains(r.stdout, "421") || strings.Contains(r.stdout, "site=") {
		t.Errorf("Host of another site on the terminated connection: %s%s", r.stdout, r.stderr)
	}

	// The value is nowhere inside: environment, processes, files.
	inside := e.ok("exec", id, "--", "sh", "-c", "env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline; echo")
	if strings.Contains(inside, secret) || !strings.Contains(inside, ph) {
		t.Errorf("the secret is in the sandbox's environment or processes, or the placeholder is not")
	}
	grepInside := func(id string, want bool) {
		t.Helper()
		// The pattern comes on standard input, never as an argument.
		r := e.run(strings.NewReader(secret+"\n"), "exec", "-i", id, "--", "sh", "-c",
			`read -r p; for d in /*; do case $d in /proc|/sys|/dev) ;; *) printf '%s\n' "$p" | grep -rlF -f - "$d";; esac; done; echo scanned`)
		found := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(r.stdout), "scanned"))
		if !strings.Contains(r.stdout, "scanned") || (found != "") != want {
			t.Errorf("sandbox %s: files holding the secret: %q, want some: %v (%s)", id, found, want, r.stderr)
		}
	}
	// The scan finds the value where it is.
	control := e.create()
	if r := e.run(strings.NewReader(secret), "exec", "-i", control, "--", "sh", "-c", "cat > /tmp/planted"); r.code != 0 {
		t.Fatal(r)
	}
	grepInside(control, true)
	e.ok("rm", "-f", control)
	grepInside(id, false)
	snap := "egress-inject-snap"
	e.ok("snapshot", id, "-t", snap)
	t.Cleanup(func() { e.run(nil, "image", "rm", snap) })
	fromSnap := e.create("--image", snap)
	grepInside(fromSnap, false)

	// The egress log says the connection was terminated, and what it
	// asked for; nothing on the host but the store holds the value.
	log := e.ok("logs", "--egress", "--format", "json", id)
	if !strings.Contains(log, `"terminated": true`) || !strings.Contains(log, `"method": "GET"`) {
		t.Errorf("egress log:\n%s", log)
	}
	hostHolds := func() []string {
		var found []string
		filepath.Walk(e.root, func(p string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() || fi.Size() > 256<<20 || strings.Contains(p, "/egress-secrets/") {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), secret) {
				found = append(found, p)
			}
			return nil
		})
		return found
	}
	if f := hostHolds(); len(f) > 0 {
		t.Errorf("the secret's value is in the host's files outside the store: %v", f)
	}
	e.ok("rm", "-f", id, fromSnap)
	e.assertClean(id)
	e.ok("secret", "rm", "tok")
	if out := e.ok("secret", "ls"); strings.Contains(out, "tok") {
		t.Errorf("secret ls after rm:\n%s", out)
	}
}
