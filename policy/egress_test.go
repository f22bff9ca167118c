package policy

import (
	"strings"
	"testing"
)

func TestDecideWeb(t *testing.T) {
	allow, err := ParseAllowList([]string{"allowed.test", "*.wild.test:443", "10.1.2.0/24:80"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		port uint16
		rule string // "" means refused
	}{
		{"allowed.test", 443, "allowed.test"},
		{"ALLOWED.test.", 80, "allowed.test"},
		{"api.wild.test", 443, "*.wild.test:443"},
		{"api.wild.test", 80, ""},
		{"wild.test", 443, ""},
		{"denied.test", 443, ""},
		{"", 443, ""},
		{"10.1.2.3", 80, "10.1.2.0/24:80"},
		{"10.1.2.3", 443, ""},
		{"203.0.113.7", 443, ""},
		{"allowed.test.evil.test", 443, ""},
	} {
		d := DecideWeb(allow, c.name, c.port)
		if d.Allowed != (c.rule != "") || d.Rule != c.rule || (!d.Allowed && d.Reason == "") {
			t.Errorf("DecideWeb(%q, %d) = %+v, want rule %q", c.name, c.port, d, c.rule)
		}
	}
}

func FuzzDecideWeb(f *testing.F) {
	allow, _ := ParseAllowList([]string{"allowed.test", "*.wild.test"})
	for _, s := range []string{"allowed.test", "x.wild.test", "", "1.2.3.4", "[::1]", "a..b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		d := DecideWeb(allow, name, 443)
		if d.Allowed && d.Rule == "" {
			t.Fatalf("%q allowed without a rule", name)
		}
	})
}

// In mode allow with a gateway, web ports go to the gateway's listeners,
// except to what an address rule names on them; the gateway's listeners
// are open to the sandbox only then.
func TestRenderFirewallGateway(t *testing.T) {
	allow, _ := ParseAllowList([]string{"allowed.test", "10.1.0.0/16:443", "10.2.0.1", "10.3.0.1:22"})
	cfg := FirewallConfig{Table: "t", HostIf: "h", Mode: NetAllow, Allow: allow, Gateway: true}
	fw := RenderFirewall(cfg)
	for _, want := range []string{
		"tcp dport 80 redirect to :15080", "tcp dport 443 redirect to :15443",
		"ip daddr 10.1.0.0/16 tcp dport 443 return", "ip daddr 10.2.0.1/32 return",
		"tcp dport { 15080, 15443 } accept",
		"meta l4proto { tcp, udp } th dport { 80, 443 } reject",
	} {
		if !strings.Contains(fw, want) {
			t.Errorf("firewall lacks %q:\n%s", want, fw)
		}
	}
	web := strings.Index(fw, "th dport { 80, 443 } reject")
	if addr, dns := strings.Index(fw, "ip daddr 10.1.0.0/16 meta l4proto { tcp, udp } th dport 443 accept"), strings.Index(fw, "ip daddr @dns_any accept"); addr < 0 || addr > web || web > dns {
		t.Errorf("the web ports' reject must come after the address rules and before admitted addresses:\n%s", fw)
	}
	if strings.Contains(fw, "10.3.0.1/32 tcp dport 22 return") {
		t.Errorf("an address rule on another port is exempted from the gateway:\n%s", fw)
	}
	for _, c := range []FirewallConfig{{Mode: NetOpen, Gateway: true}, {Mode: NetNone, Gateway: true}, {Mode: NetAllow}} {
		if fw := RenderFirewall(c); strings.Contains(fw, "redirect") || strings.Contains(fw, "15443") || strings.Contains(fw, "th dport { 80, 443 }") {
			t.Errorf("mode %s, gateway %v: redirects:\n%s", c.Mode, c.Gateway, fw)
		}
	}
}
