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

// stdio is the agent's stdin and stdout as one stream.
type stdio struct{}

func (stdio) Read(p []byte) (int, error)  { return os.Stdin.Read(p) }
func (stdio) Write(p []byte) (int, error) { return os.Stdout.Write(p) }
func (stdio) Close() error                { os.Stdin.Close(); return os.Stdout.Close() }

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
	sess, err := yamux.Server(stdio{}, cfg)
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
		io.Copy(st, c) //nolint:errcheck // either end may go away
		// yamux's Close is a half close: it sends FIN, and reading
		// goes on until the other side's.
		st.Close()
	}()
	go func() {
		defer wg.Done()
		io.Copy(c, st) //nolint:errcheck // either end may go away
		c.CloseWrite()
	}()
	wg.Wait()
	c.Close()
	st.Close()
}
