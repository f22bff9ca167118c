package integration

import (
	"net"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// serveEvilDNS is the attacker's nameserver, at the test host's public
// address: it answers every A query for a name under evil.test with the
// address the attacker picked, and the TTL the attacker picked.
func (w *testWorld) serveEvilDNS(names map[string]string, ttl uint32) string {
	w.t.Helper()
	conn := w.listenInNetns("udp", net.JoinHostPort(w.public, "53"))
	srv := &dns.Server{PacketConn: conn.(net.PacketConn), Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		ip, ok := names[strings.ToLower(q.Question[0].Name)]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
				A:   net.ParseIP(ip),
			})
		}
		rw.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	w.t.Cleanup(func() { srv.Shutdown() })
	return w.public
}

// DNS rebinding: a name the policy allows answers the cloud metadata
// address or a private address. In every mode the denied ranges win over
// what a DNS answer admits; only an address rule opens them.
func TestHostileDNSRebinding(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	ns := w.serveEvilDNS(map[string]string{
		"meta.evil.test.": w.metadata,
		"priv.evil.test.": w.testHost,
		"pub.evil.test.":  w.public,
	}, 30)

	for _, mode := range []string{"allow", "open"} {
		id := e.create("--net", mode, "--dns", ns, "--allow", "*.evil.test:80", "--allow", "*.evil.test:8080")
		if r := e.run(nil, "exec", id, "--", "nslookup", "meta.evil.test"); r.code != 0 || !strings.Contains(r.stdout, w.metadata) {
			t.Fatalf("mode %s: the attacker's answer did not come through: %s", mode, r)
		}
		mustNotReach(t, e, id, "meta.evil.test", "80")
		mustNotReach(t, e, id, w.metadata, "80")
		mustNotReach(t, e, id, "priv.evil.test", "80")
		mustNotReach(t, e, id, "priv.evil.test", "8080")
		mustReach(t, e, id, "pub.evil.test", "80")

		// An address rule is the one way to open a private address.
		e.ok("update", id, "--allow", "*.evil.test:80", "--allow", w.testHost+":8080")
		mustReach(t, e, id, "priv.evil.test", "8080")
		mustNotReach(t, e, id, "priv.evil.test", "80")
		e.ok("rm", "-f", id)
	}
}

// An answer with a TTL of 2^31-1 s still resolves and connects (its
// admission is capped instead of refused by nftables).
func TestHostileDNSHugeTTL(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	ns := w.serveEvilDNS(map[string]string{"long.evil.test.": w.public}, 1<<31-1)
	id := e.create("--net", "allow", "--dns", ns, "--allow", "long.evil.test")
	if r := e.run(nil, "exec", id, "--", "nslookup", "long.evil.test"); r.code != 0 || !strings.Contains(r.stdout, w.public) {
		t.Fatalf("a name answered with TTL 2^31-1 did not resolve: %s", r)
	}
	mustReach(t, e, id, "long.evil.test", "80")
}

// A wildcard rule right below a public suffix is refused at create.
func TestHostilePublicSuffixWildcard(t *testing.T) {
	e := newEnv(t)
	r := e.run(nil, "create", "--image", "busybox", "--net", "allow", "--allow", "*.co.uk")
	if r.code == 0 || !strings.Contains(r.stderr, "public suffix") {
		t.Fatalf("create with --allow *.co.uk: %s", r)
	}
}
