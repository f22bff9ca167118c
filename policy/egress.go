package policy

import (
	"fmt"
	"net/netip"
	"strings"
)

// The gateway's listening ports on the host end of a sandbox's link
// (FirewallConfig.HostIP): the firewall redirects the sandbox's web
// connections to them, plain HTTP to GatewayHTTPPort and TLS to
// GatewayTLSPort.
const (
	GatewayHTTPPort = 15080
	GatewayTLSPort  = 15443
)

// WebPorts are the ports whose connections the gateway judges by the
// name they ask for, and the listener each goes to.
var WebPorts = map[uint16]uint16{80: GatewayHTTPPort, 443: GatewayTLSPort}

// WebDecision is the gateway's verdict on one connection: the rule that
// allowed it (Allowed), or why it was refused (Reason).
type WebDecision struct {
	Allowed bool
	Rule    string
	Reason  string
}

// DecideWeb judges a web connection of a sandbox in mode allow by the name
// it asks for (the TLS ClientHello's server name, the HTTP Host) and its
// port. A domain needs a domain rule naming it on that port or on any; an
// address literal needs an address rule naming it; no name at all (a
// ClientHello without SNI, a request without Host) opens nothing, since
// nothing says which site it is for.
func DecideWeb(allow []AllowRule, name string, port uint16) WebDecision {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if name == "" {
		return WebDecision{Reason: "no server name (TLS SNI or HTTP Host): only named hosts are allowed"}
	}
	if a, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		for _, r := range allow {
			if AllowsAddrPort([]AllowRule{r}, a, port) {
				return WebDecision{Allowed: true, Rule: r.String()}
			}
		}
		return WebDecision{Reason: fmt.Sprintf("address %s: the allow rules name hosts, not this address", a)}
	}
	for _, r := range allow {
		if r.IsDomain() && r.MatchName(name) && (r.Port == 0 || r.Port == port) {
			return WebDecision{Allowed: true, Rule: r.String()}
		}
	}
	return WebDecision{Reason: fmt.Sprintf("host %s port %d is not allowed", name, port)}
}
