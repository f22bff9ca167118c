package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"

	"github.com/hashicorp/yamux"
)

// recordingConn records the size of every write and whether it began
// with a data frame's header.
type recordingConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
	bare   int // writes that were a data frame's header alone
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	if len(p) == frameHeaderSize && p[1] == frameTypeData && binary.BigEndian.Uint32(p[8:]) > 0 {
		c.bare++
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// Through CoalesceFrames, a yamux session carries the same bytes and
// never writes a data frame's header without its body.
func TestCoalesceFrames(t *testing.T) {
	a, b := net.Pipe()
	rec := &recordingConn{Conn: a}
	type rw struct {
		io.Reader
		io.Writer
		io.Closer
	}
	client, err := yamux.Client(rw{a, CoalesceFrames(rec), a}, PortMuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := yamux.Server(b, PortMuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	want := make([]byte, 3<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	go func() {
		st, err := server.Accept()
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(st)
		got <- b
	}()
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(want); off += 100 << 10 {
		if _, err := st.Write(want[off:min(off+100<<10, len(want))]); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the stream carried %d bytes, not the %d written", len(b), len(want))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.bare != 0 || rec.writes == 0 {
		t.Fatalf("%d of %d writes were a data frame's header alone", rec.bare, rec.writes)
	}
}

// dialLoopback gives a connection that carries both ways and half
// closes, and fails at once on a port where nothing listens.
func TestDialLoopback(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c) // until the client's half close
		got <- string(b)
		c.Write([]byte("answer"))
	}()
	c, err := dialLoopback(uint16(l.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "request" {
		t.Fatalf("the server read %q", s)
	}
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "answer" {
		t.Fatalf("the client read %q, %v", b, err)
	}

	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if c, err := dialLoopback(uint16(port)); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial of a closed port: %v, want connection refused", err)
	}
}
