package agent

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
)

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
