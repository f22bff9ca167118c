package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestParseAllow(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want: the rule's String(); empty: an error
	}{
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.1.2.3/8", "10.0.0.0/8"},
		{"10.1.2.3", "10.1.2.3/32"},
		{"10.1.2.3:443", "10.1.2.3/32:443"},
		{"192.168.0.0/16:53", "192.168.0.0/16:53"},
		{"Example.COM", "example.com"},
		{"example.com.", "example.com"},
		{"example.com:443", "example.com:443"},
		{"*.example.com", "*.example.com"},
		{"*.example.com:8080", "*.example.com:8080"},
		{"", ""},
		{"example", ""},
		{"10.0.0.0/33", ""},
		{"10.0.0.1:0", ""},
		{"10.0.0.1:65536", ""},
		{"10.0.0.1:http", ""},
		{"[::1]:80", ""},
		{"fd00::1", ""},
		{"::/0", ""},
		{"a.*.example.com", ""},
		{"*example.com", ""},
		{"-bad.example.com", ""},
		{"exa mple.com", ""},
		{"example.com:", ""},
	} {
		r, err := ParseAllow(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("ParseAllow(%q) = %v, want an error", tc.in, r)
			} else if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.in) {
				t.Errorf("ParseAllow(%q) error %q: want invalid argument naming the input", tc.in, err)
			}
			continue
		}
		if err != nil || r.String() != tc.want {
			t.Errorf("ParseAllow(%q) = %v, %v; want %s", tc.in, r, err, tc.want)
		}
	}
}

func FuzzParseAllow(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "1.2.3.4:80", "example.com", "*.example.com:443", "[::1]:1", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseAllow(s)
		if err != nil {
			return
		}
		if r.IsDomain() == r.Prefix.IsValid() {
			t.Fatalf("ParseAllow(%q) = %+v: exactly one of domain and prefix must be set", s, r)
		}
		again, err := ParseAllow(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseAllow(%q) = %v does not round-trip: %v, %v", s, r, again, err)
		}
	})
}

func TestMatchName(t *testing.T) {
	exact, _ := ParseAllow("example.com")
	wild, _ := ParseAllow("*.example.com")
	for _, tc := range []struct {
		rule AllowRule
		name string
		want bool
	}{
		{exact, "example.com.", true},
		{exact, "EXAMPLE.com", true},
		{exact, "www.example.com.", false},
		{exact, "badexample.com.", false},
		{wild, "www.example.com.", true},
		{wild, "a.b.example.com.", true},
		{wild, "example.com.", false},
		{wild, "wwwexample.com.", false},
		{wild, "example.com.evil.", false},
	} {
		if got := tc.rule.MatchName(tc.name); got != tc.want {
			t.Errorf("%s matches %q = %v, want %v", tc.rule, tc.name, got, tc.want)
		}
	}
}

func TestValidateNetwork(t *testing.T) {
	rule, _ := ParseAllow("example.com")
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"open", Request{Network: NetOpen}, ""},
		{"allow with rules", Request{Network: NetAllow, Allow: []AllowRule{rule}}, ""},
		{"rules without network", Request{Allow: []AllowRule{rule}}, "--allow needs"},
		{"rootless open", Request{Network: NetOpen, Rootless: true}, ""},
		{"rootless allow", Request{Network: NetAllow, Allow: []AllowRule{rule}, Rootless: true}, ""},
		{"bad dns", Request{Network: NetOpen, DNS: []string{"dns.example"}}, "--dns"},
		{"unknown", Request{Network: "wide"}, "wide"},
	} {
		_, err := Validate(tc.req)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate error = %v, want %q", tc.name, err, tc.want)
		}
	}
}

// The rendered firewall names the sandbox's link in every base chain and
// lets DNS through only to the resolver, only when the mode has a network.
func TestRenderFirewall(t *testing.T) {
	cfg := FirewallConfig{Table: "hutch_t", HostIf: "hutcht", Mode: NetNone}
	none := RenderFirewall(cfg)
	if strings.Contains(none, "dport 53 accept") || strings.Contains(none, "@denied reject") {
		t.Fatalf("mode none must pass nothing:\n%s", none)
	}
	cfg.Mode = NetOpen
	if open := RenderFirewall(cfg); !strings.Contains(open, "ip daddr @denied reject") {
		t.Fatalf("mode open must reject the denied ranges:\n%s", open)
	}
	if RenderFirewall(cfg) != RenderFirewall(cfg) {
		t.Fatal("rendering is not deterministic")
	}
}

// Names compare on labels: an escaped dot inside a label is not a label
// boundary, so `x.evil\.example.com` (one label "evil.example") is not
// below example.com, and names with bytes no hostname has match nothing.
func TestMatchNameLabels(t *testing.T) {
	wild, _ := ParseAllow("*.example.com")
	exact, _ := ParseAllow("example.com")
	for _, name := range []string{
		`x.evil\.example.com.`, `evil\.example.com.`, `x.evil\046example.com.`,
		"x.evil\x00.example.com.", `*.example.com.`, `x\..example.com.`,
	} {
		if wild.MatchName(name) {
			t.Errorf("%s matches %q", wild, name)
		}
	}
	if exact.MatchName(`example\.com.`) {
		t.Errorf(`example.com matches "example\.com."`)
	}
	if !wild.MatchName("A.Example.COM.") {
		t.Error("names must match case-insensitively")
	}
}

// A wildcard directly below a public suffix would allow names anyone can
// register; below a registrable domain it is fine.
func TestParseAllowPublicSuffix(t *testing.T) {
	for _, s := range []string{"*.co.uk", "*.com.au", "*.github.io", "*.CO.UK:443"} {
		if _, err := ParseAllow(s); err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "public suffix") {
			t.Errorf("ParseAllow(%q) = %v, want a public-suffix error", s, err)
		}
	}
	for _, s := range []string{"*.example.co.uk", "*.bbc.co.uk:443", "co.uk", "*.example.com", "*.wild.test"} {
		if _, err := ParseAllow(s); err != nil {
			t.Errorf("ParseAllow(%q): %v", s, err)
		}
	}
}

func TestDenied(t *testing.T) {
	for _, s := range []string{
		"169.254.169.254", "168.63.129.16", "100.100.100.200", "10.1.2.3",
		"127.0.0.1", "192.168.1.1", "fd00:ec2::254", "::ffff:169.254.169.254", "fe80::1", "::1",
	} {
		if !Denied(netip.MustParseAddr(s)) {
			t.Errorf("%s is not denied", s)
		}
	}
	for _, s := range []string{"203.0.113.7", "8.8.8.8", "168.63.129.17", "2001:db8::1"} {
		if Denied(netip.MustParseAddr(s)) {
			t.Errorf("%s is denied", s)
		}
	}
	// The denied set the firewall renders holds the new addresses too.
	fw := RenderFirewall(FirewallConfig{Table: "t", HostIf: "h", Mode: NetOpen})
	if !strings.Contains(fw, "168.63.129.16/32") {
		t.Errorf("firewall lacks Azure's wireserver:\n%s", fw)
	}
}

// In every mode with a network, the denied ranges are rejected after the
// address rules (which may name them) and before the DNS-admitted sets
// (which may not).
func TestRenderFirewallDeniedBeforeDNS(t *testing.T) {
	rule, _ := ParseAllow("10.9.8.7:8080")
	name, _ := ParseAllow("*.example.com")
	for _, mode := range []string{NetOpen, NetAllow} {
		fw := RenderFirewall(FirewallConfig{Table: "t", HostIf: "h", Mode: mode, Allow: []AllowRule{rule, name}})
		addr := strings.Index(fw, "ip daddr 10.9.8.7/32 meta l4proto { tcp, udp } th dport 8080 accept")
		denied := strings.Index(fw, "ip daddr @denied reject")
		dnsAny := strings.Index(fw, "ip daddr @"+DNSSetAny+" accept")
		dnsPort := strings.Index(fw, "@"+DNSSetPort+" accept")
		if addr < 0 || denied < 0 || dnsAny < 0 || dnsPort < 0 || !(addr < denied && denied < dnsAny && denied < dnsPort) {
			t.Errorf("mode %s: want address rules, then denied, then DNS sets:\n%s", mode, fw)
		}
	}
}

func TestAllowsAddr(t *testing.T) {
	rule, _ := ParseAllow("10.9.0.0/16:80")
	name, _ := ParseAllow("ten.example.com")
	rules := []AllowRule{rule, name}
	if !AllowsAddr(rules, netip.MustParseAddr("10.9.1.1")) {
		t.Error("10.9.1.1 is named by 10.9.0.0/16")
	}
	if AllowsAddr(rules, netip.MustParseAddr("10.8.1.1")) {
		t.Error("10.8.1.1 is named by no address rule")
	}
}
