package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/miekg/dns"

	"hutch.dev/hutch/serve/envdpb/processpb"
	"hutch.dev/hutch/serve/envdpb/processpb/processpbconnect"
)

// tlsWorld is where a test's SDK runs against a server over TLS as it
// would against E2B's cloud: a network namespace of the test's own, linked
// to the host by a veth pair, whose resolver (/etc/netns/NAME/resolv.conf,
// which `ip netns exec` puts in place) is a DNS server of the test's that
// answers serveDomain, its sandbox hosts and wrongName with the host side
// of the link, where the server listens. The host's resolver is never
// touched.
type tlsWorld struct {
	ns, hostIf string
	// server is the host side's address: the server listens on it.
	server string
}

// wrongName resolves to the server, but no certificate of the tests
// names it.
const wrongName = "wrong-name.test"

func newTLSWorld(t *testing.T) *tlsWorld {
	t.Helper()
	n := mrand.IntN(200) + 20
	w := &tlsWorld{ns: fmt.Sprintf("hutchtls-%d", n), hostIf: fmt.Sprintf("tlstest%d", n), server: fmt.Sprintf("10.98.%d.1", n)}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	etc := filepath.Join("/etc/netns", w.ns)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", w.hostIf).Run()
		exec.Command("ip", "netns", "del", w.ns).Run()
		os.RemoveAll(etc)
	})
	ip("netns", "add", w.ns)
	ip("link", "add", w.hostIf, "type", "veth", "peer", "name", "eth0", "netns", w.ns)
	ip("addr", "add", w.server+"/30", "dev", w.hostIf)
	ip("link", "set", w.hostIf, "up")
	ip("-n", w.ns, "addr", "add", fmt.Sprintf("10.98.%d.2/30", n), "dev", "eth0")
	ip("-n", w.ns, "link", "set", "eth0", "up")
	ip("-n", w.ns, "link", "set", "lo", "up")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver "+w.server+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The namespace's view of the hosts file: only loopback.
	if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ours := func(name string) bool {
		name = strings.TrimSuffix(strings.ToLower(name), ".")
		return name == serveDomain || strings.HasSuffix(name, "."+serveDomain) || name == wrongName
	}
	handler := dns.HandlerFunc(func(rw dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		switch {
		case len(q.Question) != 1 || !ours(q.Question[0].Name):
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
				A:   net.ParseIP(w.server),
			})
		}
		rw.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", net.JoinHostPort(w.server, "53"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: handler}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return w
}

// nodeFetch is what Node's fetch made of one request, run in the world's
// namespace: a status and body, or the code of the error Node reports.
type nodeFetch struct {
	Status  int    `json:"status"`
	Body    string `json:"body"`
	Error   string `json:"error"`
	Message string `json:"message"`
}

// probe fetches url with Node from the namespace, trusting caFile if set.
func (w *tlsWorld) probe(t *testing.T, url, caFile string) nodeFetch {
	t.Helper()
	return fetchWithNode(t, w.ns, url, caFile)
}

// fetchWithNode fetches url with Node, in network namespace ns if it is
// not empty, trusting caFile if set.
func fetchWithNode(t *testing.T, ns, url, caFile string) nodeFetch {
	t.Helper()
	node := requireSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := []string{node, filepath.Join(e2bDir, "tls-probe.mjs"), url}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = withoutEnv(os.Environ(), "NODE_EXTRA_CA_CERTS", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
	if caFile != "" {
		cmd.Env = append(cmd.Env, "NODE_EXTRA_CA_CERTS="+caFile)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node tls-probe.mjs %s: %v: %s", url, err, out)
	}
	var p nodeFetch
	if err := json.Unmarshal(bytes.TrimSpace(out), &p); err != nil {
		t.Fatalf("node tls-probe.mjs %s printed %q: %v", url, out, err)
	}
	return p
}

// tlsCA is a certificate authority of a test.
type tlsCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// file holds the CA's certificate (PEM); pool has it.
	file string
	pool *x509.CertPool
}

func newTLSCA(t *testing.T, name string) *tlsCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(mrand.Int64()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	ca := &tlsCA{key: key, file: filepath.Join(t.TempDir(), "ca.pem"), pool: x509.NewCertPool()}
	if ca.cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	ca.pool.AddCert(ca.cert)
	if err := os.WriteFile(ca.file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return ca
}

// issue writes a server certificate for serveDomain and *.serveDomain,
// valid from notBefore to notAfter, and its key, to certFile and keyFile,
// and returns the certificate.
func (ca *tlsCA) issue(t *testing.T, certFile, keyFile string, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(mrand.Int64()), Subject: pkix.Name{CommonName: serveDomain},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{serveDomain, "*." + serveDomain},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// As an operator's renewal does: each file replaced whole.
	writeAtomic(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	writeAtomic(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func writeAtomic(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// servedCert is the certificate a new TLS connection to addr for host
// gets (not verified).
func servedCert(t *testing.T, addr, host string) *x509.Certificate {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{ServerName: host, InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS to %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0]
}

// envdClient is a Connect client of a sandbox's envd at its own host,
// https://49983-ID.serveDomain, over s's TLS, recording the protocol of
// every answer in protos.
func (s *server) envdClient(sb createdSandbox, protos chan<- string) processpbconnect.ProcessClient {
	hc := s.client()
	inner := hc.Transport
	hc.Timeout = 0 // streams last as long as their commands
	hc.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.Header.Set("X-Access-Token", sb.EnvdAccessToken)
		r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
		resp, err := inner.RoundTrip(r)
		if err == nil {
			select {
			case protos <- resp.Proto:
			default:
			}
		}
		return resp, err
	})
	return processpbconnect.NewProcessClient(hc, "https://49983-"+sb.SandboxID+"."+serveDomain)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// startCommand starts cmd in the sandbox through envd's Start stream and
// returns its pid and the stream's stdout, chunk by chunk.
func startCommand(t *testing.T, ctx context.Context, c processpbconnect.ProcessClient, cmd string, stdin bool) (uint32, <-chan string) {
	t.Helper()
	st, err := c.Start(ctx, connect.NewRequest(&processpb.StartRequest{
		Process: &processpb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}}, Stdin: &stdin,
	}))
	if err != nil {
		t.Fatalf("Start %q: %v", cmd, err)
	}
	if !st.Receive() {
		t.Fatalf("Start %q: no start event: %v", cmd, st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		t.Fatalf("Start %q: first event %v, want its start", cmd, st.Msg())
	}
	out := make(chan string, 64)
	go func() {
		defer close(out)
		for st.Receive() {
			if d := st.Msg().GetEvent().GetData(); d != nil && len(d.GetStdout()) > 0 {
				out <- string(d.GetStdout())
			}
		}
	}()
	return pid, out
}

// readUntil reads chunks from out until their concatenation contains
// want, for at most d.
func readUntil(t *testing.T, out <-chan string, want string, d time.Duration) string {
	t.Helper()
	var got strings.Builder
	timeout := time.After(d)
	for !strings.Contains(got.String(), want) {
		select {
		case s, ok := <-out:
			if !ok {
				t.Fatalf("the command's stream ended with %q, before %q", got.String(), want)
			}
			got.WriteString(s)
		case <-timeout:
			t.Fatalf("no %q within %s; got %q", want, d, got.String())
		}
	}
	return got.String()
}

// The E2B SDK with nothing but E2B_API_KEY and E2B_DOMAIN, over TLS on
// port 443 with a certificate from a CA of the test: create, commands,
// files, getHost over https, pause and connect. Connect's HTTP/2 carries
// a StreamInput client stream. Node reports a wrong name, an untrusted or
// expired certificate and plain HTTP to the TLS port as it does for any
// server. The certificate is swapped on disk and SIGHUP: new connections
// get the new one while an open command stream goes on.
func TestServeTLS(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	base := baseArchive(t)
	w := newTLSWorld(t)
	trusted, untrusted := newTLSCA(t, "hutch test CA"), newTLSCA(t, "another CA")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	now := time.Now()
	first := trusted.issue(t, certFile, keyFile, now.Add(-time.Hour), now.Add(24*time.Hour))

	s := newServer(t, base)
	key := s.tenantAdd("tls")
	s.listen = net.JoinHostPort(w.server, "443")
	s.tls = &tlsClient{roots: trusted.pool, caFile: trusted.file, netns: w.ns}
	s.flags = []string{"--tls-cert", certFile, "--tls-key", keyFile}
	s.serve()
	api := "https://api." + serveDomain

	t.Run("the E2B SDK with only E2B_API_KEY and E2B_DOMAIN", func(t *testing.T) {
		s.runScript(t, "tls.mjs", key, nil, 6*time.Minute)
	})

	sb := s.createSandbox(key, "base")
	protos := make(chan string, 1000)
	envd := s.envdClient(sb, protos)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("HTTP/2 by ALPN carries a StreamInput stream to a command", func(t *testing.T) {
		pid, out := startCommand(t, ctx, envd, "cat", true)
		in := envd.StreamInput(ctx)
		sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
		if err := in.Send(&processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Start{Start: &processpb.StreamInputRequest_StartEvent{Process: sel}}}); err != nil {
			t.Fatal(err)
		}
		// Each line is sent while the stream stays open, and comes back
		// through cat before the next is sent: input flows as it is
		// written, not when the request ends.
		for _, line := range []string{"one\n", "two\n", "three\n"} {
			if err := in.Send(&processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Data{Data: &processpb.StreamInputRequest_DataEvent{
				Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte(line)}},
			}}}); err != nil {
				t.Fatal(err)
			}
			readUntil(t, out, line, 20*time.Second)
		}
		if _, err := in.CloseAndReceive(); err != nil {
			t.Fatalf("StreamInput: %v", err)
		}
		if _, err := envd.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel})); err != nil {
			t.Fatal(err)
		}
		for range out {
		}
		n := 0
		for more := true; more; {
			select {
			case p := <-protos:
				n++
				if p != "HTTP/2.0" {
					t.Fatalf("an envd call was answered over %s, want HTTP/2.0", p)
				}
			default:
				more = false
			}
		}
		if n < 3 {
			t.Fatalf("%d envd calls answered, want Start, StreamInput and CloseStdin", n)
		}
	})

	t.Run("what Node reports for a wrong name, an untrusted CA and plain HTTP", func(t *testing.T) {
		if p := w.probe(t, api+"/health", trusted.file); p.Status != http.StatusOK {
			t.Fatalf("GET %s/health: %+v, want 200", api, p)
		}
		if p := w.probe(t, "https://"+wrongName+"/health", trusted.file); p.Error != "ERR_TLS_CERT_ALTNAME_INVALID" {
			t.Errorf("a name the certificate does not cover: %+v, want ERR_TLS_CERT_ALTNAME_INVALID", p)
		}
		if p := w.probe(t, api+"/health", ""); p.Error != "UNABLE_TO_VERIFY_LEAF_SIGNATURE" {
			t.Errorf("without trusting the CA: %+v, want UNABLE_TO_VERIFY_LEAF_SIGNATURE", p)
		}
		p := w.probe(t, "http://api."+serveDomain+":443/health", "")
		if p.Status != http.StatusBadRequest || !strings.Contains(p.Body, "HTTP request to an HTTPS server") {
			t.Errorf("plain HTTP to the TLS port: %+v, want 400 Client sent an HTTP request to an HTTPS server", p)
		}
	})

	t.Run("SIGHUP serves a certificate swapped on disk; an open command stream goes on", func(t *testing.T) {
		_, ticks := startCommand(t, ctx, envd, "for i in $(seq 1 1200); do echo tick $i; sleep 0.1; done", false)
		readUntil(t, ticks, "tick 2\n", 20*time.Second)
		host := "api." + serveDomain
		swap := func(what string, issue func()) *x509.Certificate {
			t.Helper()
			issue()
			want, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if got := servedCert(t, s.addr(), host); got.Equal(want.Leaf) {
					return got
				}
			}
			t.Fatalf("%s: new connections still get the old certificate 10 s after SIGHUP\nserver log:\n%s", what, s.logTail(10))
			return nil
		}
		second := swap("a renewed certificate", func() { trusted.issue(t, certFile, keyFile, now.Add(-time.Hour), now.Add(48*time.Hour)) })
		if second.Equal(first) {
			t.Fatal("the renewed certificate is the first one")
		}
		if p := w.probe(t, api+"/health", trusted.file); p.Status != http.StatusOK {
			t.Errorf("after the renewal: %+v, want 200", p)
		}
		// The command's stream, opened on a connection made before the
		// swap, still gets the command's output.
		drain(ticks)
		readUntil(t, ticks, "\n", 20*time.Second)

		swap("an expired certificate", func() { trusted.issue(t, certFile, keyFile, now.Add(-48*time.Hour), now.Add(-24*time.Hour)) })
		if p := w.probe(t, api+"/health", trusted.file); p.Error != "CERT_HAS_EXPIRED" {
			t.Errorf("an expired certificate: %+v, want CERT_HAS_EXPIRED", p)
		}
		swap("a certificate from a CA the client does not trust", func() { untrusted.issue(t, certFile, keyFile, now.Add(-time.Hour), now.Add(24*time.Hour)) })
		if p := w.probe(t, api+"/health", trusted.file); p.Error != "UNABLE_TO_VERIFY_LEAF_SIGNATURE" {
			t.Errorf("a certificate of another CA: %+v, want UNABLE_TO_VERIFY_LEAF_SIGNATURE", p)
		}
		good := swap("the renewed certificate again", func() { trusted.issue(t, certFile, keyFile, now.Add(-time.Hour), now.Add(24*time.Hour)) })

		// A key that is not the certificate's: the reload fails, and the
		// server goes on with the certificate it had.
		other := filepath.Join(t.TempDir(), "other")
		trusted.issue(t, other+".pem", other+".key", now.Add(-time.Hour), now.Add(24*time.Hour))
		b, err := os.ReadFile(other + ".key")
		if err != nil {
			t.Fatal(err)
		}
		writeAtomic(t, keyFile, b, 0o600)
		if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitForLog(t, s, "the TLS certificate did not reload", 10*time.Second)
		if got := servedCert(t, s.addr(), host); !got.Equal(good) {
			t.Error("after a SIGHUP with a mismatched key, the server no longer serves its certificate")
		}
		if p := w.probe(t, api+"/health", trusted.file); p.Status != http.StatusOK {
			t.Errorf("after a failed reload: %+v, want 200", p)
		}
		drain(ticks)
		readUntil(t, ticks, "\n", 20*time.Second)
	})
	cancel()
	if r := s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, map[string]string{"X-API-KEY": key}); r.status != http.StatusNoContent {
		t.Errorf("DELETE the sandbox: %s", r)
	}
	s.stopAndCheckClean()
}

// drain takes what out holds now, without waiting.
func drain(out <-chan string) {
	for {
		select {
		case <-out:
		default:
			return
		}
	}
}

// waitForLog waits until the server's log has a line containing text.
func waitForLog(t *testing.T, s *server, text string, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		f, err := os.Open(s.logPath)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if strings.Contains(sc.Text(), text) {
				f.Close()
				return
			}
		}
		f.Close()
	}
	t.Fatalf("no %q in the server's log within %s:\n%s", text, d, s.logTail(10))
}

// Without a public CA: --tls-self-signed makes a CA and a certificate for
// the domain under the state root, keys 0600, and prints how to trust
// it. Node trusting that CA (as printed) reaches the server; Node without
// it is refused. A restart serves the same CA, and says nothing more.
func TestServeTLSSelfSigned(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	s := newServer(t, "")
	s.noTenants = true
	s.flags = []string{"--tls-self-signed"}
	tlsDir := filepath.Join(s.root, "serve", "tls")
	caFile := filepath.Join(tlsDir, "ca.pem")
	s.tls = &tlsClient{caFile: caFile}
	s.serve()

	log, err := os.ReadFile(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "NODE_EXTRA_CA_CERTS="+caFile) {
		t.Errorf("the first start does not say how to trust its CA (NODE_EXTRA_CA_CERTS=%s):\n%s", caFile, log)
	}
	for name, want := range map[string]os.FileMode{"": 0o700, "ca.key": 0o600, "key.pem": 0o600, "ca.pem": 0o644, "cert.pem": 0o644} {
		st, err := os.Stat(filepath.Join(tlsDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", filepath.Join(tlsDir, name), st.Mode().Perm(), want)
		}
	}
	url := "https://localhost:" + strconv.Itoa(s.port) + "/health"
	if p := fetchWithNode(t, "", url, caFile); p.Status != http.StatusOK {
		t.Errorf("Node trusting the printed CA: %+v, want 200", p)
	}
	if p := fetchWithNode(t, "", url, ""); p.Error != "UNABLE_TO_VERIFY_LEAF_SIGNATURE" {
		t.Errorf("Node without the CA: %+v, want UNABLE_TO_VERIFY_LEAF_SIGNATURE", p)
	}
	// The API's and a sandbox's names, as the SDK addresses them.
	for _, host := range []string{"api." + serveDomain, "49983-0123456789abcdef." + serveDomain} {
		c := s.client()
		req, _ := http.NewRequest("GET", "https://"+host+":"+strconv.Itoa(s.port)+"/health", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET https://%s: %v", host, err)
		}
		resp.Body.Close()
		if resp.Proto != "HTTP/2.0" {
			t.Errorf("GET https://%s answered over %s, want HTTP/2.0", host, resp.Proto)
		}
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	s.stop()
	s.stopped = false
	if err := os.Truncate(s.logPath, 0); err != nil {
		t.Fatal(err)
	}
	s.serve()
	again, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca, again) {
		t.Error("a restart made a new CA: clients that trusted the first are refused")
	}
	if log, _ := os.ReadFile(s.logPath); strings.Contains(string(log), "NODE_EXTRA_CA_CERTS") {
		t.Errorf("a restart printed the trust instructions again:\n%s", log)
	}
	url = "https://localhost:" + strconv.Itoa(s.port) + "/health"
	if p := fetchWithNode(t, "", url, caFile); p.Status != http.StatusOK {
		t.Errorf("after the restart, Node trusting the CA: %+v, want 200", p)
	}
	s.stopAndCheckClean()
}

// serveOverTLS starts hutch serve on root at 443 of a TLS world's server
// address, with a certificate of a test CA for its domain, and two
// tenants: name, whose key is key, and "other". The SDK scripts
// (runScriptIn) then reach it as a user reaches E2B's cloud, with only
// E2B_API_KEY and E2B_DOMAIN.
func serveOverTLS(t *testing.T, root, name string) (s *server, key, other string) {
	t.Helper()
	w := newTLSWorld(t)
	ca := newTLSCA(t, "hutch "+name+" test CA")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	now := time.Now()
	ca.issue(t, certFile, keyFile, now.Add(-time.Hour), now.Add(24*time.Hour))

	s = newServer(t, root)
	key, other = s.tenantAdd(name), s.tenantAdd("other")
	s.listen = net.JoinHostPort(w.server, "443")
	s.tls = &tlsClient{roots: ca.pool, caFile: ca.file, netns: w.ns}
	s.flags = []string{"--tls-cert", certFile, "--tls-key", keyFile}
	s.serve()
	return s, key, other
}
