package hostnet

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"hutch.dev/hutch/policy"
)

// fakeUpstream answers every A query with addr and the given TTL, from a
// loopback socket, and counts the queries it saw.
func fakeUpstream(t *testing.T, addr string, ttl uint32) (string, *atomic.Int64) {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		n.Add(1)
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
	return newResolver(path)
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
		before := seen.Load()
		m := ask(r, tc.q)
		if m == nil || m.Rcode != tc.want {
			t.Errorf("%s: reply %v, want rcode %s", name, m, dns.RcodeToString[tc.want])
		}
		if seen.Load() != before {
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
	r := newTestResolver(t, ResolverConfig{Upstreams: []string{up}, Mode: policy.NetAllow, Allow: []policy.AllowRule{name}, Table: "hutch_no_such_table"})
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

// slowUpstream answers A queries with addr once release is closed.
func slowUpstream(t *testing.T, addr string, release <-chan struct{}) string {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		<-release
		m := new(dns.Msg)
		m.SetReply(q)
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A:   net.ParseIP(addr),
		})
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// A name revoked by an update while its query is in flight is not
// admitted when the answer comes back: the sandbox gets NXDOMAIN, and the
// firewall is never asked to admit its address (the resolver under test
// has no netlink connection: asking would fail the test).
func TestResolverUpdateRevokesInFlight(t *testing.T) {
	release := make(chan struct{})
	up := slowUpstream(t, "203.0.113.9", release)
	name, _ := policy.ParseAllow("revoked.example.com")
	c := ResolverConfig{Upstreams: []string{up}, Mode: policy.NetAllow, Allow: []policy.AllowRule{name}, Table: "hutch_no_such_table"}
	r := newTestResolver(t, c)
	got := make(chan *dns.Msg, 1)
	go func() { got <- ask(r, new(dns.Msg).SetQuestion("revoked.example.com.", dns.TypeA)) }()
	time.Sleep(100 * time.Millisecond) // the query is at the upstream
	c.Allow = nil
	applied := false
	if err := UpdatePolicy(r.path, c, func() error { applied = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if !applied {
		t.Fatal("the firewall was not replaced")
	}
	close(release)
	select {
	case m := <-got:
		if m == nil || m.Rcode != dns.RcodeNameError {
			t.Fatalf("answer after the name was revoked: %v, want NXDOMAIN", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer")
	}
}

// A failed firewall replacement leaves the resolver's policy as it was.
func TestUpdatePolicyRollsBack(t *testing.T) {
	name, _ := policy.ParseAllow("kept.example.com")
	c := ResolverConfig{Mode: policy.NetAllow, Allow: []policy.AllowRule{name}}
	r := newTestResolver(t, c)
	next := c
	next.Mode = policy.NetOpen
	if err := UpdatePolicy(r.path, next, func() error { return errors.New("nft failed") }); err == nil {
		t.Fatal("a failed apply was not reported")
	}
	if got := r.current(); got.Mode != policy.NetAllow {
		t.Fatalf("mode after a failed update: %s", got.Mode)
	}
}

// A flood is bounded: beyond the queries in flight, queries are dropped
// unanswered, and beyond the rate they are refused without reaching the
// upstream.
func TestResolverBounds(t *testing.T) {
	release := make(chan struct{})
	up := slowUpstream(t, "203.0.113.9", release)
	r := newTestResolver(t, ResolverConfig{Upstreams: []string{up}, Mode: policy.NetOpen})
	var wg sync.WaitGroup
	for i := 0; i < maxInFlight; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); ask(r, new(dns.Msg).SetQuestion("busy.example.com.", dns.TypeA)) }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(r.slots) < maxInFlight && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if m := ask(r, new(dns.Msg).SetQuestion("one.more.example.com.", dns.TypeA)); m != nil {
		t.Fatalf("a query beyond %d in flight was answered: %v", maxInFlight, m)
	}
	close(release)
	wg.Wait()

	// A flood of queries is refused past the rate limit. The askers run
	// at once and until enough are refused, so that a slow machine still
	// asks faster than queryRate; what reached the upstream is bounded by
	// the burst plus what the rate allowed in the time the flood took.
	up2, seen := fakeUpstream(t, "203.0.113.9", 30)
	r = newTestResolver(t, ResolverConfig{Upstreams: []string{up2}, Mode: policy.NetOpen})
	var refused, sent atomic.Int64
	start := time.Now()
	for i := 0; i < maxInFlight/4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for refused.Load() < 50 && sent.Add(1) <= 50_000 && time.Since(start) < 20*time.Second {
				if m := ask(r, new(dns.Msg).SetQuestion("flood.example.com.", dns.TypeA)); m != nil && m.Rcode == dns.RcodeRefused {
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	allowed := queryBurst + int64(queryRate*elapsed.Seconds()) + 50
	if refused.Load() < 50 || seen.Load() > allowed {
		t.Fatalf("a flood of %d queries in %s: %d refused, %d reached the upstream (at most %d may)", sent.Load(), elapsed, refused.Load(), seen.Load(), allowed)
	}
}

// Interface and table names are short, but two IDs that share a long
// prefix still get names of their own, within the kernel's 15 bytes.
func TestNamesHashWholeID(t *testing.T) {
	a, b := names("collide-0123456789abcdef-first"), names("collide-0123456789abcdef-second")
	if a.HostIf == b.HostIf || a.Table == b.Table || a.NetnsName == b.NetnsName {
		t.Fatalf("shared names: %+v %+v", a, b)
	}
	for _, n := range []*Network{a, b, names("0123456789abcdef0123456789abcdef")} {
		if len(n.HostIf) > 15 {
			t.Fatalf("interface name %q is longer than 15 bytes", n.HostIf)
		}
	}
}

// The resolver's log stays under logMax however often the sandbox makes
// it report (here, answers it will not admit), counting what the file
// held already.
func TestResolverLogBounded(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "resolver.log")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, logMax/2)); err != nil {
		t.Fatal(err)
	}
	logMu.Lock()
	logOut, logLeft = f, -1
	logMu.Unlock()
	t.Cleanup(func() {
		logMu.Lock()
		logOut, logLeft = os.Stderr, -1
		logMu.Unlock()
	})
	for i := 0; i < 100000; i++ {
		logf("not admitting 169.254.169.254 for r%d.evil.example.: a denied address\n", i)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > logMax {
		t.Fatalf("log grew to %d bytes, bound %d", fi.Size(), logMax)
	}
	if fi.Size() < logMax-200 {
		t.Fatalf("log stopped early at %d bytes", fi.Size())
	}
	tail := make([]byte, 64)
	if _, err := f.ReadAt(tail, fi.Size()-64); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(tail), "log full") {
		t.Fatalf("the log does not say it is full: %q", tail)
	}
}
