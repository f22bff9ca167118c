package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestSandboxOf(t *testing.T) {
	s := &Server{cfg: Config{Domain: "hutch.example.test"}}
	id := strings.Repeat("ab", 16)
	for _, tc := range []struct {
		host    string
		headers map[string]string
		id      string
		port    int
		ok      bool
	}{
		{host: "8000-" + id + ".hutch.example.test", id: id, port: 8000, ok: true},
		{host: "8000-" + id + ".HUTCH.example.test:3000", id: id, port: 8000, ok: true},
		{host: "49983-" + id + ".hutch.example.test", id: id, port: 49983, ok: true},
		{host: "127.0.0.1:3000", ok: false},
		{host: "8000-" + id + ".other.test", ok: false},
		{host: "x-" + id + ".hutch.example.test", ok: false},
		{host: "hutch.example.test", ok: false},
		{host: "127.0.0.1:3000", headers: map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"}, id: id, port: 49983, ok: true},
		// A bad port is the sandbox's request all the same, refused later.
		{host: "127.0.0.1:3000", headers: map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "x"}, id: id, port: -1, ok: true},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = tc.host
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		gotID, gotPort, ok := s.sandboxOf(r)
		if ok != tc.ok || gotID != tc.id || gotPort != tc.port {
			t.Errorf("host %q headers %v: got (%q, %d, %v), want (%q, %d, %v)", tc.host, tc.headers, gotID, gotPort, ok, tc.id, tc.port, tc.ok)
		}
	}
}

func TestNetworkPolicy(t *testing.T) {
	yes, no := true, false
	s := &Server{}
	for _, tc := range []struct {
		name     string
		internet *bool
		net      *networkJSON
		def      string
		mode     string
		allow    []string
		err      error
	}{
		{name: "nothing takes the default", def: "none", mode: "none"},
		{name: "nothing takes an open default", def: "open", mode: "open"},
		{name: "internet on", internet: &yes, def: "none", mode: "open"},
		{name: "internet off keeps a link", internet: &no, def: "open", mode: "allow"},
		{name: "deny all", net: &networkJSON{DenyOut: []string{"0.0.0.0/0"}}, def: "open", mode: "allow"},
		{name: "deny all but some", net: &networkJSON{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"pypi.org:443", "10.0.0.0/8"}}, def: "open", mode: "allow", allow: []string{"pypi.org:443", "10.0.0.0/8"}},
		{name: "allow list on a none default", net: &networkJSON{AllowOut: []string{"1.2.3.4"}}, def: "none", mode: "allow", allow: []string{"1.2.3.4"}},
		{name: "partial deny unsupported", net: &networkJSON{DenyOut: []string{"8.8.8.8/32"}}, def: "open", err: errdefs.ErrNotImplemented},
		{name: "rules unsupported", net: &networkJSON{Rules: json.RawMessage(`{"a":1}`)}, def: "open", err: errdefs.ErrNotImplemented},
		{name: "empty rules are no rules", net: &networkJSON{Rules: json.RawMessage(`{}`)}, def: "open", mode: "open"},
		{name: "mask unsupported", net: &networkJSON{MaskRequestHost: "x"}, def: "open", err: errdefs.ErrNotImplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode, allow, err := s.networkPolicy(tc.internet, tc.net, tc.def)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || mode != tc.mode || !reflect.DeepEqual(allow, tc.allow) {
				t.Fatalf("got (%q, %v, %v), want (%q, %v)", mode, allow, err, tc.mode, tc.allow)
			}
		})
	}
}

func TestCheckTimeout(t *testing.T) {
	v := func(n int64) *int64 { return &n }
	for _, tc := range []struct {
		in   *int64
		want string
		ok   bool
	}{
		{nil, "15s", true}, {v(0), "0s", true}, {v(300), "5m0s", true}, {v(86400), "24h0m0s", true},
		{v(-1), "", false}, {v(86401), "", false},
	} {
		d, err := checkTimeout(tc.in, defaultTimeout)
		if tc.ok != (err == nil) || (tc.ok && d.String() != tc.want) {
			t.Errorf("checkTimeout(%v) = %v, %v; want %s ok=%v", tc.in, d, err, tc.want, tc.ok)
		}
		if err != nil && (!errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "timeout")) {
			t.Errorf("error %v should name the timeout and be invalid argument", err)
		}
	}
}

func TestMetadataQuery(t *testing.T) {
	r := httptest.NewRequest("GET", "/v2/sandboxes?metadata=user%3Dalice%26app%3Dmy%2520app", nil)
	got, err := metadataQuery(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"user": "alice", "app": "my app"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	r = httptest.NewRequest("GET", "/v2/sandboxes?metadata=novalue", nil)
	if _, err := metadataQuery(r); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a pair without = : err = %v", err)
	}
}

func TestDecodeBody(t *testing.T) {
	var v newSandboxJSON
	for _, tc := range []struct{ body, want string }{
		{`{"templateID":`, "unexpected EOF"},
		{`{"templateID":"base","bogus":1}`, `unknown field "bogus"`},
		{`{"templateID":"base"} {}`, "more than one JSON value"},
		{`{"timeout":"x"}`, "timeout"},
	} {
		r := httptest.NewRequest("POST", "/v2/sandboxes", strings.NewReader(tc.body))
		err := decodeBody(r, &v)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("body %s: err = %v, want invalid argument naming %q", tc.body, err, tc.want)
		}
	}
	r := httptest.NewRequest("POST", "/v2/sandboxes", strings.NewReader(""))
	if err := decodeBody(r, &v); err != nil {
		t.Errorf("empty body: %v", err)
	}
}

func TestMessage(t *testing.T) {
	err := fmt.Errorf("template %q not found: %w", "x", errdefs.ErrNotFound)
	if got := message(err); got != `template "x" not found` {
		t.Errorf("message = %q", got)
	}
	if got := message(errors.New("plain")); got != "plain" {
		t.Errorf("message = %q", got)
	}
}

func TestTemplateID(t *testing.T) {
	for _, ok := range []string{"base", "busybox", "snap-0123abcd", "my.img:v1"} {
		if err := checkTemplateID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "../etc", "tenants/other/x", "Upper", "a b", "/abs", "x:"} {
		if err := checkTemplateID(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q accepted", bad)
		}
	}
}
