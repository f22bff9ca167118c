package serve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestFrontHosts(t *testing.T) {
	f, err := newFront("127.0.0.1:3000", "hutch.example.test", []string{"serve.corp.test", "192.0.2.7:8443"})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{
		"127.0.0.1:3000", "localhost:3000", "LOCALHOST:3000", "[::1]:3000",
		"hutch.example.test", "hutch.example.test:443", "49983-abc.hutch.example.test:3000", "8080-ABC.Hutch.Example.Test.",
		"serve.corp.test", "serve.corp.test:3000", "192.0.2.7:8443",
	} {
		if !f.ours(h) {
			t.Errorf("Host %q refused", h)
		}
	}
	for _, h := range []string{
		"", "attacker.test:3000", "127.0.0.1:3001", "localhost", "localhost:80", "127.0.0.2:3000",
		"hutch.example.test.attacker.test", "xhutch.example.test", "192.0.2.7:3000", "192.0.2.7",
		"serve.corp.test.evil", "0.0.0.0:3000",
	} {
		if f.ours(h) {
			t.Errorf("Host %q accepted", h)
		}
	}
	// Without a listen address (an embedder's test server): loopback
	// names at any port.
	f, _ = newFront("", "localhost", nil)
	if !f.ours("127.0.0.1:45678") || f.ours("attacker.test:45678") {
		t.Error("loopback names without a listen address")
	}
	for _, bad := range []string{"", "http://x.test", "x.test/path", "x.test:0", "x.test:99999", "a..b", "x y"} {
		if _, err := newFront("", "localhost", []string{bad}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "host") {
			t.Errorf("--host %q: %v", bad, err)
		}
	}
}

func TestFrontCheck(t *testing.T) {
	f, _ := newFront("127.0.0.1:3000", "hutch.example.test", nil)
	for _, c := range []struct {
		host, origin string
		want         int
	}{
		{"127.0.0.1:3000", "", 0},
		{"127.0.0.1:3000", "http://127.0.0.1:3000", 0},
		{"127.0.0.1:3000", "http://8080-abc.hutch.example.test:3000", 0},
		{"attacker.test:3000", "", http.StatusMisdirectedRequest},
		{"attacker.test:3000", "http://attacker.test:3000", http.StatusMisdirectedRequest},
		{"127.0.0.1:3000", "http://127.0.0.2:8000", http.StatusForbidden},
		{"127.0.0.1:3000", "http://attacker.test:3000", http.StatusForbidden},
		{"127.0.0.1:3000", "null", http.StatusForbidden},
		{"127.0.0.1:3000", "file://", http.StatusForbidden},
	} {
		r := httptest.NewRequest("POST", "/sandboxes", nil)
		r.Host = c.host
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if got, msg := f.check(r); got != c.want {
			t.Errorf("Host %q Origin %q: %d %s, want %d", c.host, c.origin, got, msg, c.want)
		}
	}
}

func TestCheckJSONBody(t *testing.T) {
	for _, c := range []struct {
		ct, body string
		ok       bool
	}{
		{"application/json", "{}", true},
		{"application/json; charset=utf-8", "{}", true},
		{"application/merge-patch+json", "{}", true},
		{"", "", true},
		{"text/plain", "", true},
		{"text/plain", "{}", false},
		{"application/x-www-form-urlencoded", "a=b", false},
		{"multipart/form-data; boundary=x", "--x--", false},
		{"", "{}", false},
	} {
		r := httptest.NewRequest("POST", "/sandboxes", strings.NewReader(c.body))
		if c.ct != "" {
			r.Header.Set("Content-Type", c.ct)
		}
		err := checkJSONBody(r)
		if (err == nil) != c.ok {
			t.Errorf("%q with %q: %v", c.ct, c.body, err)
		}
		if err != nil && httpStatus(err) != http.StatusUnsupportedMediaType {
			t.Errorf("%q: status %d, want 415", c.ct, httpStatus(err))
		}
	}
}

// Past the bound, a new untrusted connection closes the oldest one of
// its address; trusted ones and other addresses' are left alone.
func TestConnLimiter(t *testing.T) {
	l := newConnLimiter(2, nil)
	conn := func(addr string) *fakeConn {
		fc := &fakeConn{}
		fc.tc = &trackedConn{Conn: fc, lim: l, addr: addr}
		l.add(fc.tc)
		return fc
	}
	trusted := conn("10.0.0.1")
	l.trust(connContext(context.Background(), trusted.tc))
	first, second := conn("10.0.0.1"), conn("10.0.0.1")
	other := conn("10.0.0.2")
	third := conn("10.0.0.1")
	if !first.closed {
		t.Error("the oldest untrusted connection is still open")
	}
	for name, c := range map[string]*fakeConn{"trusted": trusted, "second": second, "third": third, "other address's": other} {
		if c.closed {
			t.Errorf("the %s connection was closed", name)
		}
	}
	// A closed connection no longer counts.
	second.tc.Close()
	fourth := conn("10.0.0.1")
	if third.closed {
		t.Error("a closed connection still counted")
	}
	// One being answered is closed after those that are not.
	l.serving(connContext(context.Background(), third.tc), true)
	conn("10.0.0.1")
	if third.closed || !fourth.closed {
		t.Errorf("closed the busy connection (%v) before the idle one (%v)", third.closed, fourth.closed)
	}
}

type fakeConn struct {
	net.Conn
	tc     *trackedConn
	closed bool
}

func (c *fakeConn) Close() error { c.closed = true; return nil }
