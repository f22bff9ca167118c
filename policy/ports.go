package policy

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// DefaultPortIP is the host address a published port listens on when the
// user names none: the host itself only.
const DefaultPortIP = "127.0.0.1"

// PortMapping publishes a TCP port of a sandbox on the host. It is not
// egress: the sandbox needs no network for it, only a listener on its own
// loopback.
type PortMapping struct {
	// HostIP is the host address to listen on.
	HostIP string `json:"hostIP"`
	// HostPort is the host port; 0 lets the host choose one.
	HostPort uint16 `json:"hostPort"`
	// Port is the port inside the sandbox, on its 127.0.0.1.
	Port uint16 `json:"port"`
}

// HostAddr is the host address to listen on, as net.Listen takes it.
func (m PortMapping) HostAddr() string {
	return net.JoinHostPort(m.HostIP, strconv.Itoa(int(m.HostPort)))
}

func (m PortMapping) String() string {
	return m.HostAddr() + "->" + strconv.Itoa(int(m.Port))
}

// ParsePortMapping parses [IP:]HOSTPORT:PORT; an IPv6 IP is written in
// brackets ([::1]:8080:80).
func ParsePortMapping(s string) (PortMapping, error) {
	bad := func(why string) (PortMapping, error) {
		return PortMapping{}, fmt.Errorf("port mapping %q: %s (want [IP:]HOSTPORT:PORT): %w", s, why, errdefs.ErrInvalidArgument)
	}
	m := PortMapping{HostIP: DefaultPortIP}
	rest := s
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]:")
		if end < 0 {
			return bad("unterminated [IPv6 address]")
		}
		m.HostIP, rest = rest[1:end], rest[end+2:]
		if a, err := netip.ParseAddr(m.HostIP); err != nil || !a.Is6() || a.Zone() != "" {
			return bad("not an IPv6 address in brackets")
		}
	}
	parts := strings.Split(rest, ":")
	switch {
	case len(parts) == 3 && m.HostIP == DefaultPortIP && !strings.HasPrefix(s, "["):
		a, err := netip.ParseAddr(parts[0])
		if err != nil || !a.Is4() {
			return bad("not an IPv4 address")
		}
		m.HostIP, parts = parts[0], parts[1:]
	case len(parts) != 2:
		return bad("wrong number of fields")
	}
	hp, err := strconv.ParseUint(parts[0], 10, 16)
	if err != nil {
		return bad("host port is not a number from 0 to 65535")
	}
	p, err := strconv.ParseUint(parts[1], 10, 16)
	if err != nil || p == 0 {
		return bad("sandbox port is not a number from 1 to 65535")
	}
	m.HostPort, m.Port = uint16(hp), uint16(p)
	return m, nil
}
