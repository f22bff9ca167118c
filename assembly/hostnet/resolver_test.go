package hostnet

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"

	"sbx.dev/sbx/policy"
)

// fakeUpstream answers every A query with addr and the given TTL, from a
// loopback socket, and counts the queries it saw.
func fakeUpstream(t *testing.T, addr string, ttl uint32) (string, *int) {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		n++
		m := new(dns.Msg)
		m.SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
				A:   net.ParseIP(addr),
			})
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String(), &n
}

// recorder is a dns.ResponseWriter that keeps the reply.
type recorder struct {
	dns.ResponseWriter
	msg *dns.Msg
}

func (r *recorder) WriteMsg(m *dns.Msg) error { r.msg = m; return nil }
func (r *recorder) RemoteAddr() net.Addr      { return &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 5353} }

func newTestResolver(t *testing.T, c ResolverConfig) *resolver {
	t.Helper()
	path := filepath.Join(t.TempDir(), "resolver.json")
	if err := WriteResolverConfig(path, c); err != nil {
		t.Fatal(err)
	}
	return &resolver{path: path}
}

func ask(r *resolver, q *dns.Msg) *dns.Msg {
	rec := &recorder{}
	r.ServeDNS(rec, q)
	return rec.msg
}

// Only standard queries of class IN that are not zone transfers reach the
// upstream; the rest are refused without asking it.
func TestResolverRefusesNonQueries(t *testing.T) {
	up, seen := fakeUpstream(t, "203.0.113.9", 30)
	r := newTestResolver(t, ResolverConfig{Upstreams: []string{up}, Mode: policy.NetOpen})

	ok := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	if m := ask(r, ok); m == nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Fatalf("plain query: %v", m)
	}
	for name, tc := range map[string]struct {
		q    *dns.Msg
		want int
	}{
		"notify": {func() *dns.Msg { m := new(dns.Msg).SetNotify("example.com."); return m }(), dns.RcodeNotImplemented},
		"update": {func() *dns.Msg { m := new(dns.Msg).SetUpdate("example.com."); return m }(), dns.RcodeNotImplemented},
		"chaos": {func() *dns.Msg {
			m := new(dns.Msg).SetQuestion("version.bind.", dns.TypeTXT)
			m.Question[0].Qclass = dns.ClassCHAOS
			return m
		}(), dns.RcodeRefused},
		"any class": {func() *dns.Msg {
			m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
			m.Question[0].Qclass = dns.ClassANY
			return m
		}(), dns.RcodeRefused},
		"axfr": {new(dns.Msg).SetAxfr("example.com."), dns.RcodeRefused},
		"ixfr": {new(dns.Msg).SetIxfr("example.com.", 1, "ns.example.com.", "root.example.com."), dns.RcodeRefused},
	} {
		before := *seen
		m := ask(r, tc.q)
		if m == nil || m.Rcode != tc.want {
			t.Errorf("%s: reply %v, want rcode %s", name, m, dns.RcodeToString[tc.want])
		}
		if *seen != before {
			t.Errorf("%s reached the upstream", name)
		}
	}
}

// An answer's TTL is bounded both ways; 2^31-1 s (which nftables refuses)
// becomes an hour.
func TestAdmitTTL(t *testing.T) {
	for ttl, want := range map[uint32]time.Duration{
		0: minAdmit, 1: minAdmit, 30: 30 * time.Second, 3600: time.Hour,
		1<<31 - 1: time.Hour, 1<<32 - 1: time.Hour,
	} {
		if got := admitTTL(ttl); got != want {
			t.Errorf("admitTTL(%d) = %v, want %v", ttl, got, want)
		}
	}
}

// An allowed name answering a denied address (DNS rebinding onto cloud
// metadata or a private service) admits nothing, unless an address rule
// names the address.
func TestAdmitAddrsSkipsDenied(t *testing.T) {
	mk := func(addrs ...string) *dns.Msg {
		m := new(dns.Msg)
		for _, a := range addrs {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "a.example.com.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(a)})
		}
		return m
	}
	name, _ := policy.ParseAllow("*.example.com")
	resp := mk("169.254.169.254", "10.1.2.3", "168.63.129.16", "100.100.100.200", "127.0.0.1", "203.0.113.9")
	got := admitAddrs([]policy.AllowRule{name}, resp)
	if len(got) != 1 || got[0].A.String() != "203.0.113.9" {
		t.Fatalf("admitted %v, want only 203.0.113.9", got)
	}
	addr, _ := policy.ParseAllow("10.1.2.0/24:443")
	got = admitAddrs([]policy.AllowRule{name, addr}, resp)
	if len(got) != 2 || got[0].A.String() != "10.1.2.3" {
		t.Fatalf("with 10.1.2.0/24 allowed, admitted %v, want 10.1.2.3 and 203.0.113.9", got)
	}
}

// The whole path: an allowed wildcard name whose upstream answers the
// metadata address with a TTL of 2^31-1 still resolves (nothing to admit,
// so no firewall change is attempted and no SERVFAIL).
func TestResolverRebindingAnswer(t *testing.T) {
	up, _ := fakeUpstream(t, "169.254.169.254", 1<<31-1)
	name, _ := policy.ParseAllow("*.example.com")
	r := newTestResolver(t, ResolverConfig{Upstreams: []string{up}, Mode: policy.NetAllow, Allow: []policy.AllowRule{name}, Table: "sbx_no_such_table"})
	m := ask(r, new(dns.Msg).SetQuestion("meta.example.com.", dns.TypeA))
	if m == nil || m.Rcode != dns.RcodeSuccess {
		t.Fatalf("reply %v, want NOERROR", m)
	}
	// An escaped dot is no label boundary: not below example.com.
	m = ask(r, new(dns.Msg).SetQuestion(`x.evil\.example.com.`, dns.TypeA))
	if m == nil || m.Rcode != dns.RcodeNameError {
		t.Fatalf(`x.evil\.example.com: reply %v, want NXDOMAIN`, m)
	}
}
