package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"hutch.dev/hutch/policy"
)

// The server name is read from the ClientHello as crypto/tls parses it,
// and the bytes read are the ClientHello itself, for the upstream.
func TestClientHello(t *testing.T) {
	for _, sni := range []string{"allowed.test", ""} {
		a, b := net.Pipe()
		go func() {
			tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake() //nolint:errcheck // ends with the pipe
		}()
		name, hello, err := clientHello(b)
		if err != nil || name != sni || len(hello) < 5 || hello[0] != 0x16 {
			t.Errorf("SNI %q: clientHello = %q, %d bytes (first %x), %v", sni, name, len(hello), hello[:min(1, len(hello))], err)
		}
		a.Close()
		b.Close()
	}
	a, b := net.Pipe()
	go func() { io.WriteString(a, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); a.Close() }() //nolint:errcheck // a test peer
	if _, _, err := clientHello(b); err == nil {
		t.Error("plain HTTP parsed as a ClientHello")
	}
}

// A plain HTTP connection is refused with a 403 naming why, unless its
// Host is allowed; a later request on it for another host ends it before
// that request reaches the upstream.
func TestServeHTTP(t *testing.T) {
	up, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	seen := make(chan []string, 1)
	go func() {
		c, err := up.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var got []string
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				seen <- got
				return
			}
			got = append(got, req.Host+" "+req.Header.Get("User-Agent"))
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n") //nolint:errcheck // a test peer
		}
	}()
	allow, _ := policy.ParseAllowList([]string{"127.0.0.1"})
	g := &Gateway{cfg: Config{Policy: func() *Policy { return &Policy{Mode: policy.NetAllow, Allow: allow} }}}
	_, port, _ := net.SplitHostPort(up.Addr().String())
	p, _ := strconv.Atoi(port)
	// The test's upstream stands for port 80.
	g.upstreamPorts = map[uint16]uint16{80: uint16(p)}
	serve := func(req string) (string, Entry) {
		a, b := net.Pipe()
		e := Entry{Port: 80}
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.serveHTTP(context.Background(), b, &e)
			b.Close()
		}()
		go io.WriteString(a, req) //nolint:errcheck // a test peer
		out, _ := io.ReadAll(a)
		<-done
		return string(out), e
	}
	out, e := serve("GET /x HTTP/1.1\r\nHost: denied.test\r\n\r\n")
	if !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "host denied.test port 80 is not allowed") || e.Decision != Deny || e.Path != "/x" {
		t.Errorf("denied Host: %q, %+v", out, e)
	}
	out, e = serve("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n")
	hosts := <-seen
	if strings.Count(out, "200 OK") != 2 || len(hosts) != 2 || hosts[0] != "127.0.0.1 " || e.Decision != Deny || !strings.Contains(e.Reason, "denied.test") {
		t.Errorf("a later request for another host: sandbox got %q, upstream saw %q, entry %+v", out, hosts, e)
	}
}

// The log rotates past MaxLogSize and reads back oldest first.
func TestLogRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.log")
	l, err := OpenLog(path)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 1000)
	n := 3 * MaxLogSize / 1000
	for i := range n {
		l.Write(Entry{Host: long, Port: uint16(i)})
	}
	l.Close()
	got, err := ReadLog(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || len(got) >= n || got[len(got)-1].Port != uint16(n-1) || got[0].Port >= got[len(got)-1].Port {
		t.Fatalf("after %d entries the log holds %d, the last port %d", n, len(got), got[len(got)-1].Port)
	}
}

// The gateway CA vouches for the hosts it was made for and nothing else.
func TestCANameConstraints(t *testing.T) {
	certPEM, bundle, err := NewCA("sandbox-id", []string{"api.test"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(path)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	for host, ok := range map[string]bool{"api.test": true, "other.test": false} {
		leaf, err := ca.leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots})
		if (err == nil) != ok {
			t.Errorf("a certificate for %s verifies: %v, want %v", host, err, ok)
		}
	}
}
