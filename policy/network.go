package policy

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/net/publicsuffix"
)

// Network modes beyond NetNone.
const (
	// NetOpen: egress anywhere except DeniedRanges and the host itself,
	// unless an allow rule names them.
	NetOpen = "open"
	// NetAllow: egress only to what the allow rules name.
	NetAllow = "allow"
)

// NetworkModes lists the valid --net values.
var NetworkModes = []string{NetNone, NetOpen, NetAllow}

// DeniedRanges are unreachable in every mode unless an address rule names
// them, whatever a DNS answer says: link-local (cloud metadata lives at
// 169.254.169.254), private and shared address space (Alibaba's metadata
// at 100.100.100.200 is in 100.64.0.0/10), loopback, non-unicast ranges,
// and Azure's wireserver and metadata proxy at 168.63.129.16.
var DeniedRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("168.63.129.16/32"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// DeniedRanges6 are the IPv6 counterparts of DeniedRanges: unique local
// (AWS's metadata at fd00:ec2::254), link-local, loopback, unspecified,
// IPv4-mapped and NAT64 addresses, and multicast. A sandbox has no IPv6
// route at all; the list keeps DNS answers from admitting them should it
// ever get one.
var DeniedRanges6 = []netip.Prefix{
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// Denied reports whether a is in DeniedRanges or DeniedRanges6.
func Denied(a netip.Addr) bool {
	ranges := DeniedRanges
	if a.Is6() && !a.Is4In6() {
		ranges = DeniedRanges6
	}
	a = a.Unmap()
	for _, p := range ranges {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// AllowsAddr reports whether one of the address rules among rules names a
// (on any port or one): such a rule is the only way to reach a denied
// address.
func AllowsAddr(rules []AllowRule, a netip.Addr) bool {
	a = a.Unmap()
	for _, r := range rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(a) {
			return true
		}
	}
	return false
}

// AllowsAddrPort reports whether one of the address rules among rules
// names a on port (the rule on that port or on any).
func AllowsAddrPort(rules []AllowRule, a netip.Addr, port uint16) bool {
	a = a.Unmap()
	for _, r := range rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(a) && (r.Port == 0 || r.Port == port) {
			return true
		}
	}
	return false
}

// AllowRule is one --allow entry: a CIDR or a domain name, optionally
// limited to one port (TCP and UDP).
type AllowRule struct {
	// Prefix is set for address rules.
	Prefix netip.Prefix `json:"prefix,omitzero"`
	// Domain is set for name rules: "example.com" or "*.example.com"
	// (any name below example.com, not example.com itself).
	Domain string `json:"domain,omitempty"`
	// Port limits the rule to one port; 0 means any.
	Port uint16 `json:"port,omitempty"`
}

func (r AllowRule) String() string {
	s := r.Domain
	if r.Prefix.IsValid() {
		s = r.Prefix.String()
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	return s
}

// IsDomain reports whether r names a domain rather than addresses.
func (r AllowRule) IsDomain() bool { return r.Domain != "" }

// MatchName reports whether the DNS name (with or without the final dot)
// falls under r. Names compare label by label: a name whose labels are not
// plain hostname labels (an escaped dot as in `x.evil\.example.com`, a
// byte outside [a-z0-9_-]) matches no rule.
func (r AllowRule) MatchName(name string) bool {
	if r.Domain == "" {
		return false
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if checkDomain(name) != nil || strings.Contains(name, "*") {
		return false
	}
	labels := strings.Split(name, ".")
	if base, ok := strings.CutPrefix(r.Domain, "*."); ok {
		want := strings.Split(base, ".")
		return len(labels) > len(want) && equalLabels(labels[len(labels)-len(want):], want)
	}
	return equalLabels(labels, strings.Split(r.Domain, "."))
}

func equalLabels(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ParseAllow parses an --allow entry: CIDR[:PORT], IP[:PORT],
// DOMAIN[:PORT] or *.DOMAIN[:PORT].
func ParseAllow(s string) (AllowRule, error) {
	bad := func(why string) (AllowRule, error) {
		return AllowRule{}, fmt.Errorf("%w: --allow %q: %s", errdefs.ErrInvalidArgument, s, why)
	}
	if s == "" {
		return bad("empty rule")
	}
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") > 1 {
		return bad("IPv6 is not supported: sandboxes have IPv4 only")
	}
	host, portStr, hasPort := strings.Cut(s, ":")
	var r AllowRule
	if hasPort {
		p, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || p == 0 {
			return bad("port must be 1-65535")
		}
		r.Port = uint16(p)
	}
	if strings.Contains(host, "/") {
		p, err := netip.ParsePrefix(host)
		if err != nil || !p.Addr().Is4() {
			return bad("not an IPv4 CIDR")
		}
		r.Prefix = p.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return bad("IPv6 is not supported: sandboxes have IPv4 only")
		}
		r.Prefix = netip.PrefixFrom(a, 32)
		return r, nil
	}
	d := strings.ToLower(strings.TrimSuffix(host, "."))
	if err := checkDomain(strings.TrimPrefix(d, "*.")); err != nil {
		return bad(err.Error())
	}
	if strings.Contains(strings.TrimPrefix(d, "*."), "*") {
		return bad("a wildcard may only be a leading \"*.\"")
	}
	if base, ok := strings.CutPrefix(d, "*."); ok {
		// *.co.uk or *.github.io would allow every registrant below
		// the suffix, so anyone can make such a name answer anything.
		if ps, _ := publicsuffix.PublicSuffix(base); ps == base {
			return bad(fmt.Sprintf("%q is a public suffix: a wildcard below it allows names anyone can register", base))
		}
	}
	r.Domain = d
	return r, nil
}

// checkDomain validates a DNS name of at least two labels.
func checkDomain(d string) error {
	if len(d) > 253 {
		return fmt.Errorf("domain name too long")
	}
	labels := strings.Split(d, ".")
	if len(labels) < 2 {
		return fmt.Errorf("not an address, CIDR or domain name (a domain needs a dot)")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("bad domain label %q", l)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '*') {
				return fmt.Errorf("bad character %q in domain", c)
			}
		}
	}
	return nil
}

// ParseAllowList parses every entry, failing on the first bad one.
func ParseAllowList(entries []string) ([]AllowRule, error) {
	var out []AllowRule
	for _, e := range entries {
		r, err := ParseAllow(e)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// checkNetwork is the validator's network rule: a known mode, and allow
// rules only where they mean something.
func checkNetwork(r Request) error {
	switch r.Network {
	case NetNone:
		if len(r.Allow) > 0 {
			return fmt.Errorf("--allow needs --net open or allow")
		}
	case NetOpen, NetAllow:
	default:
		return fmt.Errorf("--net %q: want one of %s", r.Network, strings.Join(NetworkModes, ", "))
	}
	for _, d := range r.DNS {
		if a, err := netip.ParseAddr(d); err != nil || !a.Is4() {
			return fmt.Errorf("--dns %q: want an IPv4 address", d)
		}
	}
	return nil
}

// FirewallConfig is what RenderFirewall needs to know of one sandbox.
type FirewallConfig struct {
	// Table is the nftables table (family inet) that holds every rule of
	// the sandbox, so that deleting it removes them all.
	Table string
	// HostIf is the host side of the sandbox's veth pair.
	HostIf string
	// HostIP is the host's address on that link: the sandbox's gateway
	// and DNS resolver. SandboxIP is the sandbox's.
	HostIP, SandboxIP netip.Addr
	Mode              string
	Allow             []AllowRule
	// Gateway: in mode allow, the sandbox's web connections (WebPorts)
	// go to the egress gateway on HostIP, which judges each by the name
	// it asks for; connections to what an address rule names keep the
	// address rules.
	Gateway bool
}

// gateway reports whether c's web connections go to the gateway.
func (c FirewallConfig) gateway() bool { return c.Gateway && c.Mode == NetAllow }

// Names of the sets the DNS resolver fills with the addresses it answers
// for allowed domains (with the answer's TTL as timeout).
const (
	DNSSetAny  = "dns_any"  // ipv4_addr: a domain allowed on any port
	DNSSetPort = "dns_port" // ipv4_addr . inet_service: a domain allowed on one port
)

// RenderFirewall renders the sandbox's nftables table as an nft script that
// replaces any earlier version atomically. Denials reject rather than
// drop, so a denied connect fails at once instead of hanging.
//
// Traffic from the sandbox to the host itself (any of its addresses) meets
// the input chain: only DNS to the resolver passes. Traffic through the
// host meets the forward chain: the mode and allow rules decide. Nothing
// may open a connection into the sandbox.
func RenderFirewall(c FirewallConfig) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	// "add" then "delete" makes the script work whether or not the table
	// exists; the whole script is one transaction.
	w("add table inet %s", c.Table)
	w("delete table inet %s", c.Table)
	w("table inet %s {", c.Table)
	w("\tset %s { type ipv4_addr; flags timeout; }", DNSSetAny)
	w("\tset %s { type ipv4_addr . inet_service; flags timeout; }", DNSSetPort)
	w("\tset denied { type ipv4_addr; flags interval; elements = { %s } }", joinPrefixes(DeniedRanges))
	w("\tchain input {")
	w("\t\ttype filter hook input priority filter; policy accept;")
	w("\t\tiifname %q jump from_sandbox_to_host", c.HostIf)
	w("\t}")
	w("\tchain from_sandbox_to_host {")
	w("\t\tct state established,related accept")
	if c.Mode != NetNone {
		w("\t\tip daddr %s meta l4proto { tcp, udp } th dport 53 accept", c.HostIP)
	}
	if c.gateway() {
		w("\t\tip daddr %s tcp dport { %d, %d } accept", c.HostIP, GatewayHTTPPort, GatewayTLSPort)
	}
	rejectAll(w)
	w("\t}")
	w("\tchain forward {")
	w("\t\ttype filter hook forward priority filter; policy accept;")
	w("\t\tiifname %q jump egress", c.HostIf)
	w("\t\toifname %q jump ingress", c.HostIf)
	w("\t}")
	w("\tchain ingress {")
	w("\t\tct state established,related accept")
	rejectAll(w)
	w("\t}")
	w("\tchain egress {")
	w("\t\tct state established,related accept")
	w("\t\tmeta nfproto ipv6 reject with icmpx type admin-prohibited")
	w("\t\tip saddr != %s reject with icmpx type admin-prohibited", c.SandboxIP)
	if c.Mode != NetNone {
		for _, r := range sortedRules(c.Allow) {
			if r.IsDomain() {
				continue
			}
			if r.Port != 0 {
				w("\t\tip daddr %s meta l4proto { tcp, udp } th dport %d accept", r.Prefix, r.Port)
			} else {
				w("\t\tip daddr %s accept", r.Prefix)
			}
		}
		// Denied ranges come after the address rules, which may name
		// them, and before what DNS answers admitted, which may not: an
		// allowed name answering 169.254.169.254 opens nothing.
		w("\t\tip daddr @denied reject with icmpx type admin-prohibited")
		if c.gateway() {
			// The web ports are the gateway's, by name: an address
			// a DNS answer admitted opens none of them, neither over
			// TCP (which the redirect took already) nor over UDP
			// (QUIC, whose server name the gateway does not read;
			// clients fall back to TCP).
			w("\t\tmeta l4proto { tcp, udp } th dport { 80, 443 } reject with icmpx type admin-prohibited")
		}
		w("\t\tip daddr @%s accept", DNSSetAny)
		w("\t\tmeta l4proto { tcp, udp } ip daddr . th dport @%s accept", DNSSetPort)
	}
	if c.Mode == NetOpen {
		w("\t\taccept")
	}
	rejectAll(w)
	w("\t}")
	if c.gateway() {
		renderGatewayRedirect(w, c)
	}
	w("\tchain postrouting {")
	w("\t\ttype nat hook postrouting priority srcnat; policy accept;")
	w("\t\tip saddr %s oifname != %q masquerade", c.SandboxIP, c.HostIf)
	w("\t}")
	w("}")
	return b.String()
}

// renderGatewayRedirect sends the sandbox's TCP to the web ports to the
// gateway's listeners, before routing, whatever address it was for: the
// gateway dials the host the connection names, never that address. What
// an address rule names on such a port is left to the address rules.
func renderGatewayRedirect(w func(string, ...any), c FirewallConfig) {
	w("\tchain prerouting {")
	w("\t\ttype nat hook prerouting priority dstnat; policy accept;")
	w("\t\tiifname %q ip saddr %s jump to_gateway", c.HostIf, c.SandboxIP)
	w("\t}")
	w("\tchain to_gateway {")
	for _, r := range sortedRules(c.Allow) {
		if r.IsDomain() {
			continue
		}
		if r.Port == 0 {
			w("\t\tip daddr %s return", r.Prefix)
		} else if _, web := WebPorts[r.Port]; web {
			w("\t\tip daddr %s tcp dport %d return", r.Prefix, r.Port)
		}
	}
	for _, port := range []uint16{80, 443} {
		w("\t\ttcp dport %d redirect to :%d", port, WebPorts[port])
	}
	w("\t}")
}

func rejectAll(w func(string, ...any)) {
	w("\t\tmeta l4proto tcp reject with tcp reset")
	w("\t\treject with icmpx type admin-prohibited")
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// sortedRules orders rules so that rendering is deterministic.
func sortedRules(rs []AllowRule) []AllowRule {
	out := append([]AllowRule(nil), rs...)
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
