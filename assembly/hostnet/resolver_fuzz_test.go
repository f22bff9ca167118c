package hostnet

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"hutch.dev/hutch/policy"
)

// The resolver's message path takes packets from inside a sandbox: any
// packet that parses gets exactly one reply with its ID, non-queries and
// other classes never reach an upstream, and no answer admits a denied
// address. No upstream is configured, so nothing leaves the process.
func FuzzResolverMessage(f *testing.F) {
	for _, m := range []*dns.Msg{
		new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA),
		new(dns.Msg).SetQuestion("allowed.test.", dns.TypeAAAA),
		new(dns.Msg).SetAxfr("example.com."),
		new(dns.Msg).SetNotify("example.com."),
		func() *dns.Msg {
			m := new(dns.Msg).SetQuestion("allowed.test.", dns.TypeA)
			rr, _ := dns.NewRR("allowed.test. 2147483647 IN A 169.254.169.254")
			m.Answer = append(m.Answer, rr)
			return m
		}(),
	} {
		b, _ := m.Pack()
		f.Add(b)
	}
	allow, err := policy.ParseAllowList([]string{"allowed.test", "*.wild.test:443"})
	if err != nil {
		f.Fatal(err)
	}
	configs := []ResolverConfig{
		{Mode: policy.NetNone},
		{Mode: policy.NetOpen},
		{Mode: policy.NetAllow, Allow: allow},
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		q := new(dns.Msg)
		if q.Unpack(b) != nil {
			return
		}
		for _, c := range configs {
			r := &resolver{cfg: &c, path: "/nonexistent"}
			m := r.answer(q, "udp")
			if m == nil {
				t.Fatalf("no reply to %v under mode %s", q, c.Mode)
			}
			if m.Id != q.Id {
				t.Fatalf("reply ID %d, query ID %d", m.Id, q.Id)
			}
			if q.Opcode != dns.OpcodeQuery && m.Rcode != dns.RcodeNotImplemented {
				t.Fatalf("opcode %d answered with rcode %d", q.Opcode, m.Rcode)
			}
			if m.Rcode == dns.RcodeSuccess && len(m.Answer) > 0 {
				t.Fatalf("an answer without an upstream: %v", m)
			}
		}
		// The same bytes as an upstream's answer.
		for _, a := range admitAddrs(allow, q) {
			addr, _ := netip.AddrFromSlice(a.A)
			if policy.Denied(addr.Unmap()) {
				t.Fatalf("admitted denied address %s", addr)
			}
		}
		_ = admitTTL(0)
	})
}
