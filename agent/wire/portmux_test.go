package wire

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
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
