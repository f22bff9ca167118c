package wire

import (
	"encoding/binary"
	"io"
	"net"
	"sync"

	"github.com/hashicorp/yamux"
)

// The port forwarder ("hutch-init portmux") serves a yamux session on its
// stdin and stdout; every stream opens with a port (2 bytes, big endian)
// and is then joined to a TCP connection to that port on the sandbox's
// 127.0.0.1, each direction's end passed on as a half close.

// PortMuxConfig is the yamux configuration of both ends of a port
// forwarder's stream.
func PortMuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.MaxStreamWindowSize = 1 << 20
	return c
}

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
