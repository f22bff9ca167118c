// Package forward publishes TCP ports of a sandbox on the host. It is not
// egress and needs no network in the sandbox. A sandbox with a link made
// by root (network open or allow, kept by an update to none) is reached
// directly: the forwarder dials the port on the sandbox's own address,
// a connection from the host that the sandbox's firewall lets in as it
// lets in any the host opens, and splices the two connections. Otherwise,
// and for every connection that the sandbox refuses on its address (a
// server listening on its 127.0.0.1 only), the host hands the accepted
// connection to the sandbox's own kernel, which makes the connection to
// the port on its 127.0.0.1 and copies between the two (runsc's port
// forward, one call on the sandbox's control socket per connection;
// docs/decisions/0033, 0034; kernel.go). With a runsc that
// cannot, a connection accepted on the host becomes a stream of one
// yamux session carried over the stdin and stdout of one `runsc exec` of
// the sandbox's agent ("portmux"), which dials the port on the sandbox's
// 127.0.0.1. One exec serves every connection; when it dies (the sandbox
// was paused and resumed, say) the next connection starts another.
// (docs/decisions/0024-direct-forwarding.md)
package forward

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/policy"
)

// Listener is a bound host listener, a *net.TCPListener or a
// *net.UnixListener, and the sandbox port it forwards to.
type Listener struct {
	Listener net.Listener
	Port     uint16
}

// Mapping is the mapping l serves, with the host port it actually got.
func (l Listener) Mapping() policy.PortMapping {
	if a, ok := l.Listener.Addr().(*net.UnixAddr); ok {
		return policy.PortMapping{Socket: a.Name, Port: l.Port}
	}
	a := l.Listener.Addr().(*net.TCPAddr)
	return policy.PortMapping{HostIP: a.IP.String(), HostPort: uint16(a.Port), Port: l.Port}
}

// Listen binds every mapping on the host, or none: on error the ones
// bound are closed. A UNIX socket is made only in a directory no one but
// its owner (this process's user, or root) can write to, and only its
// owner can connect to it (listenSocket).
func Listen(ms []policy.PortMapping) ([]Listener, error) {
	var out []Listener
	for _, m := range ms {
		var l net.Listener
		var err error
		if m.Socket != "" {
			l, err = listenSocket(m)
		} else if l, err = net.Listen("tcp", m.HostAddr()); err != nil {
			err = fmt.Errorf("publish %s: %w: %w", m, err, errdefs.ErrUnavailable)
		}
		if err != nil {
			for _, o := range out {
				o.Listener.Close()
			}
			return nil, err
		}
		out = append(out, Listener{Listener: l, Port: m.Port})
	}
	return out, nil
}

// listenSocket binds m's UNIX socket (ListenSocket).
func listenSocket(m policy.PortMapping) (*net.UnixListener, error) {
	l, err := ListenSocket(m.Socket)
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", m, err)
	}
	return l, nil
}

// ListenSocket binds a UNIX socket at path, mode 0600, for this process's
// user and root only. Its directory must be one that no other user can
// write to, nor any directory above it but for sticky ones such as /tmp,
// all owned by this process's user or root: no one else can then replace
// the socket or move it away. An existing socket there that no one
// listens on is replaced; any other file is refused. The path is bound
// with its directory's symlinks resolved. Until its mode is set, the
// socket's mode is the umask's: its server serves no peer but the owner
// (PeerIsOwner).
func ListenSocket(path string) (*net.UnixListener, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return nil, bad("directory: %v", err)
	}
	if err := checkSocketDir(dir); err != nil {
		return nil, bad("%v", err)
	}
	path = filepath.Join(dir, filepath.Base(path))
	if len(path) > 107 {
		return nil, bad("path %s is too long for a UNIX socket", path)
	}
	switch fi, err := os.Lstat(path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, bad("%v", err)
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, bad("%s exists and is not a socket but %s", path, fileKind(fi.Mode()))
	default:
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("something listens on %s already: %w", path, errdefs.ErrUnavailable)
		}
		// Left by a server that was killed.
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove a stale socket: %w", err)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// fileKind names the type of a file of mode m.
func fileKind(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "a regular file"
	case fs.ModeSymlink:
		return "a symbolic link"
	case fs.ModeDir:
		return "a directory"
	}
	return "a special file (" + m.Type().String() + ")"
}

// checkSocketDir checks that dir, a path without symlinks, and the
// directories above it can be changed by no user but this process's and
// root: dir is writable by its owner only, the others too unless sticky.
func checkSocketDir(dir string) error {
	uid := uint32(os.Geteuid())
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil {
			return fmt.Errorf("directory %s: %w", d, err)
		}
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			return fmt.Errorf("%s is not a directory", d)
		case st.Uid != uid && st.Uid != 0:
			return fmt.Errorf("directory %s is owned by uid %d, not by this user or root", d, st.Uid)
		case d == dir && st.Mode&0o022 != 0:
			return fmt.Errorf("directory %s is writable by other users (mode %04o): want one only its owner can write", d, st.Mode&0o7777)
		case st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0:
			return fmt.Errorf("directory %s above the socket is writable by other users (mode %04o)", d, st.Mode&0o7777)
		}
		if d == "/" {
			return nil
		}
	}
}

// PeerIsOwner reports whether the peer of c, accepted on a UNIX socket, is
// this process's user or root. The socket's mode already keeps others
// out; this holds even if its mode is changed.
func PeerIsOwner(c *net.UnixConn) bool {
	uid, err := PeerUID(c)
	return err == nil && (uid == uint32(os.Geteuid()) || uid == 0)
}

// PeerUID is the user of the peer of c, accepted on a UNIX socket
// (SO_PEERCRED: who connected, whatever it did since).
func PeerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}
