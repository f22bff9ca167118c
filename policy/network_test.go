package policy

import (
	"errors"
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
		{"rootless open", Request{Network: NetOpen, Rootless: true}, "needs root"},
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
	cfg := FirewallConfig{Table: "sbx_t", HostIf: "sbxt", Mode: NetNone}
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
