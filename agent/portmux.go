package agent

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"
)

func init() { subcommands["portmux"] = portmuxMain }

// PortMuxConfig is the yamux configuration of both ends of a port
// forwarder's stream.
func PortMuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.MaxStreamWindowSize = 1 << 20
	return c
}

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

// yamux's frame header (github.com/hashicorp/yamux, const.go): version,
// type, flags, stream ID, length.
const (
	frameHeaderSize = 12
	frameTypeData   = 0
)

// yamuxFrames writes each yamux data frame in one write. yamux writes a
// frame's header and its body in two; each write to a host pipe is a
// system call in gVisor, and each wakes the reader on the other side.
// Only yamux's send loop writes to it, one frame after the other.
type yamuxFrames struct {
	w    io.Writer
	hdr  []byte // a data frame's header, waiting for its body
	buf  []byte
	held bool
}

// CoalesceFrames returns a writer for a yamux session's connection that
// writes each data frame's header and body to w at once.
func CoalesceFrames(w io.Writer) io.Writer {
	return &yamuxFrames{w: w, hdr: make([]byte, frameHeaderSize)}
}

func (f *yamuxFrames) Write(p []byte) (int, error) {
	if f.held {
		f.held = false
		f.buf = append(append(f.buf[:0], f.hdr...), p...)
		if _, err := f.w.Write(f.buf); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if len(p) == frameHeaderSize && p[1] == frameTypeData && binary.BigEndian.Uint32(p[8:]) > 0 {
		// A body follows at once (yamux's sendLoop).
		copy(f.hdr, p)
		f.held = true
		return len(p), nil
	}
	return f.w.Write(p)
}

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
	conn := io.ReadWriteCloser(stdio{out: CoalesceFrames(os.Stdout)})
	if in, out, ok := pollableStdio(); ok {
		runtime.GOMAXPROCS(1)
		conn = struct {
			io.Reader
			io.Writer
			io.Closer
		}{in, CoalesceFrames(out), closers{in, out}}
	}
	return serveSession(conn, PortMuxConfig(), serveStream)
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
	Join(c, st)
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

// HalfCloser is a connection that can end its writing alone, as TCP and
// UNIX stream connections can.
type HalfCloser interface {
	net.Conn
	CloseWrite() error
}

// Join copies between a connection and a stream both ways, passing on
// each direction's end as a half close, and closes both when both
// directions are done.
func Join(c HalfCloser, st io.ReadWriteCloser) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		copyBuffered(st, c)
		// yamux's Close is a half close: it sends FIN, and reading
		// goes on until the other side's.
		st.Close()
	}()
	go func() {
		defer wg.Done()
		copyBuffered(c, st)
		c.CloseWrite()
	}()
	wg.Wait()
	c.Close()
	st.Close()
}

// joinBuf is the size of Join's buffers: a yamux frame carries at most
// one read, and every frame costs the agent a write to its stdout, a
// host pipe, which is a slow system call in gVisor; a smaller buffer
// gives more frames.
const joinBuf = 256 << 10

var joinBufs = sync.Pool{New: func() any { return new([joinBuf]byte) }}

// copyBuffered copies src to dst through a buffer of joinBuf bytes,
// whatever ReadFrom or WriteTo either has (a TCP connection's copy with
// a yamux stream would use 32 KiB).
func copyBuffered(dst io.Writer, src io.Reader) {
	buf := joinBufs.Get().(*[joinBuf]byte)
	defer joinBufs.Put(buf)
	io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf[:]) //nolint:errcheck // either end may go away
}
