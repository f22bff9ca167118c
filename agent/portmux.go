package agent

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
)

func init() { subcommands[wire.ModePortMux] = portmuxMain }

// stdio is the agent's stdin and stdout as one stream; out, if set,
// stands for stdout when writing.
type stdio struct{ out io.Writer }

func (stdio) Read(p []byte) (int, error) { return os.Stdin.Read(p) }
func (s stdio) Write(p []byte) (int, error) {
	if s.out == nil {
		return os.Stdout.Write(p)
	}
	return s.out.Write(p)
}
func (stdio) Close() error { os.Stdin.Close(); return os.Stdout.Close() }

// portmuxMain is "portmux": the sandbox's end of port forwarding. It
// serves a yamux session on stdin/stdout; every stream opens with a port
// (2 bytes, big endian) and is then joined to a TCP connection to that
// port on the sandbox's 127.0.0.1. It needs no network but loopback.
//
// A connection waits on every hop of its bytes, and in gVisor a thread
// that wakes another costs more than the copy: every descriptor is left
// to Go's poller, stdin and stdout too, and one thread runs every
// goroutine (GOMAXPROCS 1), which hands the bytes on without waking
// another. With stdin read by a blocking system call instead, that
// thread would sit in it while connections waited.
func portmuxMain(args []string) int {
	if len(args) != 0 {
		return usage("portmux")
	}
	conn := io.ReadWriteCloser(stdio{out: wire.CoalesceFrames(os.Stdout)})
	if in, out, ok := pollableStdio(); ok {
		runtime.GOMAXPROCS(1)
		conn = struct {
			io.Reader
			io.Writer
			io.Closer
		}{in, wire.CoalesceFrames(out), closers{in, out}}
	}
	return serveSession(conn, wire.PortMuxConfig(), serveStream)
}

// pollableStdio returns stdin and stdout made non-blocking, so that Go's
// poller waits for them and no thread blocks in their system calls.
func pollableStdio() (in, out *os.File, ok bool) {
	if syscall.SetNonblock(0, true) != nil || syscall.SetNonblock(1, true) != nil {
		syscall.SetNonblock(0, false) //nolint:errcheck // back as it was
		return nil, nil, false
	}
	return os.NewFile(0, "stdin"), os.NewFile(1, "stdout"), true
}

// closers closes each of its files.
type closers []*os.File

func (c closers) Close() error {
	for _, f := range c {
		f.Close()
	}
	return nil
}

// serveSession serves a yamux session on conn (the agent's stdin and
// stdout), each stream with serve, until the host closes it.
func serveSession(conn io.ReadWriteCloser, cfg *yamux.Config, serve func(net.Conn)) int {
	sess, err := yamux.Server(conn, cfg)
	if err != nil {
		return fail(err)
	}
	for {
		st, err := sess.Accept()
		if err != nil {
			return 0 // the host closed the session
		}
		go serve(st)
	}
}

func serveStream(st net.Conn) {
	var hdr [2]byte
	if _, err := io.ReadFull(st, hdr[:]); err != nil {
		st.Close()
		return
	}
	c, err := dialLoopback(binary.BigEndian.Uint16(hdr[:]))
	if err != nil {
		st.Close() // the host sees the connection closed at once
		return
	}
	wire.Join(c, st)
}

// dialLoopback connects to port on 127.0.0.1. In gVisor every system
// call costs tens of microseconds, and net.Dial makes a dozen: this
// makes six (socket, TCP_NODELAY, the poller's registration, connect,
// the wait for it, its status). It sets no keep-alive, useless on a connection that never
// leaves the sandbox, and asks for neither address, which no one reads.
// The connection is Go's poller's, as net.Dial's are.
func dialLoopback(port uint16) (*loopConn, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	// As net.Dial's: a small write is sent at once, not held back
	// until the previous one is acknowledged.
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("setsockopt", err)
	}
	f := os.NewFile(uintptr(fd), "127.0.0.1:"+strconv.Itoa(int(port)))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	started := false
	var cerr error
	if err := rc.Write(func(fd uintptr) bool {
		if !started {
			started = true
			cerr = unix.Connect(int(fd), &unix.SockaddrInet4{Port: int(port), Addr: [4]byte{127, 0, 0, 1}})
			if cerr == unix.EINPROGRESS {
				cerr = nil
				return false // wait until it is writable: connected, or failed
			}
			return true
		}
		// Writable: made, or failed. (Were the wake-up early, reads
		// and writes would wait for the connection, and see its
		// failure: net.Dial's extra check is not needed.)
		if n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
			cerr = err
		} else if n != 0 {
			cerr = unix.Errno(n)
		}
		return true
	}); err != nil && cerr == nil {
		cerr = err
	}
	if cerr != nil {
		f.Close()
		return nil, os.NewSyscallError("connect", cerr)
	}
	return &loopConn{File: f, port: int(port)}, nil
}

// loopConn is a connection made by dialLoopback.
type loopConn struct {
	*os.File
	port int
}

func (c *loopConn) LocalAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }
func (c *loopConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: c.port}
}

// CloseWrite sends FIN: the server reads EOF and may still answer.
func (c *loopConn) CloseWrite() error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	return os.NewSyscallError("shutdown", serr)
}
