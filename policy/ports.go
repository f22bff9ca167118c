package policy

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// DefaultPortIP is the host address a published port listens on when the
// user names none: the host itself only.
const DefaultPortIP = "127.0.0.1"

// SocketPrefix starts a port mapping published on a UNIX socket rather
// than a TCP port: unix:PATH:PORT.
const SocketPrefix = "unix:"

// maxSocketPath is the longest path a UNIX socket can be bound at
// (sun_path, less its NUL).
const maxSocketPath = 107

// PortMapping publishes a TCP port of a sandbox on the host: on a host
// TCP port, which every local user can connect to, or on a UNIX socket,
// which only its owner can (docs/security.md). It is not egress: the
// sandbox needs no network for it, only a listener on its own loopback.
type PortMapping struct {
	// HostIP is the host address to listen on.
	HostIP string `json:"hostIP,omitempty"`
	// HostPort is the host port; 0 lets the host choose one.
	HostPort uint16 `json:"hostPort,omitempty"`
	// Port is the port inside the sandbox, on its 127.0.0.1.
	Port uint16 `json:"port"`
	// Socket, if set, is the absolute path of the UNIX socket to listen
	// on instead of HostIP and HostPort.
	Socket string `json:"socket,omitempty"`
}

// Network is the network to listen on, as net.Listen takes it: tcp or
// unix.
func (m PortMapping) Network() string {
	if m.Socket != "" {
		return "unix"
	}
	return "tcp"
}

// HostAddr is the host address to listen on, as net.Listen takes it with
// Network.
func (m PortMapping) HostAddr() string {
	if m.Socket != "" {
		return m.Socket
	}
	return net.JoinHostPort(m.HostIP, strconv.Itoa(int(m.HostPort)))
}

// Spec is m as ParsePortMapping reads it.
func (m PortMapping) Spec() string {
	if m.Socket != "" {
		return SocketPrefix + m.Socket + ":" + strconv.Itoa(int(m.Port))
	}
	return m.HostAddr() + ":" + strconv.Itoa(int(m.Port))
}

func (m PortMapping) String() string {
	if m.Socket != "" {
		return SocketPrefix + m.Socket + "->" + strconv.Itoa(int(m.Port))
	}
	return m.HostAddr() + "->" + strconv.Itoa(int(m.Port))
}

// ParsePortMapping parses [IP:]HOSTPORT:PORT, or unix:PATH:PORT for a
// UNIX socket at the absolute PATH; an IPv6 IP is written in brackets
// ([::1]:8080:80).
func ParsePortMapping(s string) (PortMapping, error) {
	bad := func(why string) (PortMapping, error) {
		return PortMapping{}, fmt.Errorf("port mapping %q: %s (want [IP:]HOSTPORT:PORT or unix:PATH:PORT): %w", s, why, errdefs.ErrInvalidArgument)
	}
	if path, ok := strings.CutPrefix(s, SocketPrefix); ok {
		i := strings.LastIndexByte(path, ':')
		if i < 0 {
			return bad("no sandbox port after the socket's path")
		}
		path, port := path[:i], path[i+1:]
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 {
			return bad("sandbox port is not a number from 1 to 65535")
		}
		switch {
		case !strings.HasPrefix(path, "/"):
			return bad("the socket's path is not absolute")
		case filepath.Clean(path) != path || path == "/":
			return bad("the socket's path is not a clean path to a file")
		case len(path) > maxSocketPath:
			return bad(fmt.Sprintf("the socket's path is longer than %d bytes", maxSocketPath))
		case strings.ContainsRune(path, 0):
			return bad("the socket's path holds a NUL byte")
		}
		return PortMapping{Socket: path, Port: uint16(p)}, nil
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
