package agent

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"strconv"
	"sync"

	"github.com/hashicorp/yamux"
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
func portmuxMain(args []string) int {
	if len(args) != 0 {
		return usage("portmux")
	}
	return serveSession(PortMuxConfig(), serveStream)
}

// serveSession serves a yamux session on stdin/stdout, each stream with
// serve, until the host closes it.
func serveSession(cfg *yamux.Config, serve func(net.Conn)) int {
	sess, err := yamux.Server(stdio{out: CoalesceFrames(os.Stdout)}, cfg)
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
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(binary.BigEndian.Uint16(hdr[:])))))
	if err != nil {
		st.Close() // the host sees the connection closed at once
		return
	}
	Join(c.(*net.TCPConn), st)
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
