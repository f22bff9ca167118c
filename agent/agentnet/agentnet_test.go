package agentnet

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
)

var testKey = bytes.Repeat([]byte{1}, KeySize)

// pair is an authenticated client and server on one connection.
func pair(t *testing.T) (*Conn, *Conn, net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := Server(b, testKey); ch <- res{c, err} }()
	cc, err := Client(a, testKey)
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return cc, r.c, a
}

func TestFrames(t *testing.T) {
	cc, sc, _ := pair(t)
	big := bytes.Repeat([]byte("x"), MaxPayload+10)
	go func() {
		cc.WriteFrame(ChanStdin, []byte("hi")) //nolint:errcheck // read below
		cc.WriteFrame(ChanStdin, big)          //nolint:errcheck // read below
	}()
	var got []byte
	for len(got) < 2+len(big) {
		ch, p, err := sc.ReadFrame()
		if err != nil || ch != ChanStdin {
			t.Fatalf("frame: %d %v", ch, err)
		}
		got = append(got, p...)
	}
	if !bytes.Equal(got, append([]byte("hi"), big...)) {
		t.Fatal("frames did not carry the bytes in order")
	}
}

// An agent that does not hold the key cannot answer the client's
// challenge: the client refuses it before sending anything else.
func TestClientRefusesImpostor(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		defer b.Close()
		ns := make([]byte, nonceSize)
		b.Write(append([]byte(Hello), ns...)) //nolint:errcheck // the client reads it
		io.ReadFull(b, make([]byte, nonceSize+32))
		proof := make([]byte, 32)
		rand.Read(proof) //nolint:errcheck // never fails
		b.Write(proof)   //nolint:errcheck // the client reads it
	}()
	if _, err := Client(a, testKey); !errors.Is(err, ErrAuth) {
		t.Fatalf("client to an agent without the key: %v, want ErrAuth", err)
	}
}

// A frame changed on the wire fails its tag and ends the stream.
func TestTamperedFrame(t *testing.T) {
	_, sc, a := pair(t)
	// A frame sealed under the right key but written by a third party
	// cannot be made: the closest is a frame of valid length and junk.
	go func() {
		junk := make([]byte, 4+1+16+3)
		junk[3] = byte(len(junk) - 4)
		a.Write(junk) //nolint:errcheck // the server reads it
	}()
	if _, _, err := sc.ReadFrame(); !errors.Is(err, ErrAuth) {
		t.Fatalf("a forged frame: %v, want ErrAuth", err)
	}
}
