package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
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
			fmt.Fprintf(rw, "site=%s sni=%s host=%s\n", ip, r.TLS.ServerName, r.Host)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.siteCert(t, "allowed.test", "neighbour.test", "denied.test")}},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go srv.ServeTLS(l, "", "") //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
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
	e.ok("rm", "-f", id)
	e.assertClean(id)
}
