// Package agentnet is the wire protocol of the agent's network endpoint
// ("hutch-init listen"): the way a server that is not on the sandbox's host
// (hutch serve placing sandboxes as Kubernetes pods) runs commands in a
// sandbox over the pod network instead of through runsc exec or the
// Kubernetes API's pods/exec.
//
// Each sandbox has its own 32-byte key, which the agent gets at start
// and never writes anywhere. A connection starts with a mutual
// challenge-response over fresh nonces: the agent sends Hello and its
// nonce Ns; the client answers with its nonce Nc and HMAC-SHA256(key,
// "hutch-agent client" Ns Nc); the agent, if that matches, answers
// HMAC-SHA256(key, "hutch-agent server" Ns Nc). Neither the key nor any
// token crosses the wire, and a recorded connection replays nothing (a
// new Ns each time). After it, every frame is sealed with AES-256-GCM
// under a key per direction derived with HKDF from the key and both
// nonces, and a counter as the GCM nonce: the stream is private, and a
// frame injected, dropped, reordered or replayed ends the connection.
//
// A frame is a 4-byte big-endian length and that many sealed bytes; the
// plaintext is a channel byte and its payload. The client's first frame
// is ChanRequest (a JSON Request: one command, as runsc exec or pods/exec
// run one); then ChanStdin data and ChanStdinClose one way, ChanStdout
// and ChanStderr data and one ChanStatus (a JSON Status) the other; the
// agent closes the connection after the status. A request for a Port
// instead joins the connection to that TCP port of the sandbox's
// loopback: ChanConnected (or a ChanStatus with the error), then the
// bytes each way as ChanStdin and ChanStdout, ChanStdinClose closing the
// client's direction and a ChanStatus after the port's end of its own.
package agentnet

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Port is the agent's TCP port on the pod network (E2B's envd's).
const Port = 49983

// EnvKey is the variable that gives the agent its key (64 hex digits);
// the agent removes it from its environment before anything runs.
const EnvKey = "HUTCH_AGENT_KEY"

// KeySize is the size of a sandbox's key.
const KeySize = 32

// Hello starts every connection, from the agent.
const Hello = "HUTCHA1\n"

const nonceSize = 32

// Channels of a frame.
const (
	ChanStdin      byte = 0
	ChanStdout     byte = 1
	ChanStderr     byte = 2
	ChanStatus     byte = 3
	ChanStdinClose byte = 4
	ChanRequest    byte = 5
	ChanConnected  byte = 6
)

// MaxPayload is the largest payload of one frame.
const MaxPayload = 32 << 10

// HandshakeTimeout bounds the handshake on either side.
const HandshakeTimeout = 10 * time.Second

// ErrAuth is a handshake whose proof did not match the key.
var ErrAuth = errors.New("agent endpoint: authentication failed")

// Request is a command for the agent to run.
type Request struct {
	// Args is the command line; Args[0] is looked up on the agent's PATH.
	Args []string `json:"args"`
	// Stdin: the client sends input (else the command reads /dev/null).
	Stdin bool `json:"stdin,omitempty"`
	// Port, instead of Args, asks for a connection to that TCP port on
	// the sandbox's loopback.
	Port int `json:"port,omitempty"`
}

// Status is how a command ended.
type Status struct {
	// Code is its exit status (128+N when signal N killed it).
	Code int `json:"code"`
	// Error, if set, is why it could not start: it never ran.
	Error string `json:"error,omitempty"`
}

// Conn is an authenticated connection.
type Conn struct {
	c          net.Conn
	seal, open cipher.AEAD
	wmu        sync.Mutex
	wctr, rctr uint64
	rbuf       []byte
}

func mac(key []byte, label string, ns, nc []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(ns)
	m.Write(nc)
	return m.Sum(nil)
}

func aead(key, ns, nc []byte, info string) (cipher.AEAD, error) {
	k, err := hkdf.Key(sha256.New, key, append(append([]byte(nil), ns...), nc...), info, 32)
	if err != nil {
		return nil, err
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

func newConn(c net.Conn, key, ns, nc []byte, client bool) (*Conn, error) {
	c2s, err := aead(key, ns, nc, "hutch-agent c2s")
	if err != nil {
		return nil, err
	}
	s2c, err := aead(key, ns, nc, "hutch-agent s2c")
	if err != nil {
		return nil, err
	}
	if client {
		return &Conn{c: c, seal: c2s, open: s2c}, nil
	}
	return &Conn{c: c, seal: s2c, open: c2s}, nil
}

// Server authenticates the client on c for the agent with key.
func Server(c net.Conn, key []byte) (*Conn, error) {
	c.SetDeadline(time.Now().Add(HandshakeTimeout)) //nolint:errcheck // a conn without deadlines still works
	defer c.SetDeadline(time.Time{})                //nolint:errcheck // as above
	ns := make([]byte, nonceSize)
	rand.Read(ns) //nolint:errcheck // never fails
	if _, err := c.Write(append([]byte(Hello), ns...)); err != nil {
		return nil, err
	}
	var in [nonceSize + sha256.Size]byte
	if _, err := io.ReadFull(c, in[:]); err != nil {
		return nil, err
	}
	nc := in[:nonceSize]
	if !hmac.Equal(in[nonceSize:], mac(key, "hutch-agent client", ns, nc)) {
		return nil, ErrAuth
	}
	if _, err := c.Write(mac(key, "hutch-agent server", ns, nc)); err != nil {
		return nil, err
	}
	return newConn(c, key, ns, nc, false)
}

// Client authenticates itself and the agent on c with key.
func Client(c net.Conn, key []byte) (*Conn, error) {
	c.SetDeadline(time.Now().Add(HandshakeTimeout)) //nolint:errcheck // a conn without deadlines still works
	defer c.SetDeadline(time.Time{})                //nolint:errcheck // as above
	hello := make([]byte, len(Hello)+nonceSize)
	if _, err := io.ReadFull(c, hello); err != nil {
		return nil, fmt.Errorf("agent endpoint: hello: %w", err)
	}
	if string(hello[:len(Hello)]) != Hello {
		return nil, fmt.Errorf("agent endpoint: not a hutch agent (hello %q)", hello[:len(Hello)])
	}
	ns := hello[len(Hello):]
	nc := make([]byte, nonceSize)
	rand.Read(nc) //nolint:errcheck // never fails
	if _, err := c.Write(append(append([]byte(nil), nc...), mac(key, "hutch-agent client", ns, nc)...)); err != nil {
		return nil, err
	}
	proof := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, proof); err != nil {
		// The agent closes the connection on a wrong key.
		return nil, fmt.Errorf("%w: the agent refused the key (%v)", ErrAuth, err)
	}
	if !hmac.Equal(proof, mac(key, "hutch-agent server", ns, nc)) {
		return nil, fmt.Errorf("%w: the agent does not hold the sandbox's key", ErrAuth)
	}
	return newConn(c, key, ns, nc, true)
}

func gcmNonce(ctr uint64) []byte {
	n := make([]byte, 12)
	binary.BigEndian.PutUint64(n[4:], ctr)
	return n
}

// WriteFrame sends p on channel ch; it splits p into MaxPayload frames.
// It is safe for concurrent use.
func (c *Conn) WriteFrame(ch byte, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for first := true; first || len(p) > 0; first = false {
		n := min(len(p), MaxPayload)
		plain := append([]byte{ch}, p[:n]...)
		p = p[n:]
		buf := make([]byte, 4, 4+len(plain)+c.seal.Overhead())
		buf = c.seal.Seal(buf, gcmNonce(c.wctr), plain, nil)
		c.wctr++
		binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
		if _, err := c.c.Write(buf); err != nil {
			return err
		}
	}
	return nil
}

// ReadFrame reads the next frame. It is not safe for concurrent use.
func (c *Conn) ReadFrame() (byte, []byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(c.c, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < uint32(1+c.open.Overhead()) || n > uint32(1+MaxPayload+c.open.Overhead()) {
		return 0, nil, fmt.Errorf("agent endpoint: frame of %d bytes", n)
	}
	if cap(c.rbuf) < int(n) {
		c.rbuf = make([]byte, n)
	}
	b := c.rbuf[:n]
	if _, err := io.ReadFull(c.c, b); err != nil {
		return 0, nil, err
	}
	plain, err := c.open.Open(b[:0], gcmNonce(c.rctr), b, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("agent endpoint: a frame failed authentication: %w", ErrAuth)
	}
	c.rctr++
	return plain[0], plain[1:], nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// ErrExecFailed wraps a command the agent could not start.
var ErrExecFailed = errors.New("exec failed")

// Exec runs req through the authenticated c, copying stdin to the
// command's input (its end closes it) and the command's output to stdout
// and stderr (nil: discarded). It returns the command's exit status once
// the agent reports it; cancelling ctx cuts the connection (the command
// may go on in the sandbox).
func Exec(ctx context.Context, c *Conn, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.c.Close() })
	defer stop()
	req, err := json.Marshal(Request{Args: args, Stdin: stdin != nil})
	if err != nil {
		return -1, err
	}
	if err := c.WriteFrame(ChanRequest, req); err != nil {
		return -1, err
	}
	if stdin != nil {
		go func() {
			buf := make([]byte, MaxPayload)
			for {
				n, err := stdin.Read(buf)
				if n > 0 {
					if c.WriteFrame(ChanStdin, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					c.WriteFrame(ChanStdinClose, nil) //nolint:errcheck // the connection is gone
					return
				}
			}
		}()
	}
	for {
		ch, p, err := c.ReadFrame()
		if err != nil {
			if ctx.Err() != nil {
				return -1, ctx.Err()
			}
			return -1, fmt.Errorf("agent endpoint: the stream ended without a status: %w", err)
		}
		var w io.Writer
		switch ch {
		case ChanStdout:
			w = stdout
		case ChanStderr:
			w = stderr
		case ChanStatus:
			var st Status
			if err := json.Unmarshal(p, &st); err != nil {
				return -1, fmt.Errorf("agent endpoint: malformed status %q", p)
			}
			if st.Error != "" {
				return -1, fmt.Errorf("agent endpoint: %s: %w", st.Error, ErrExecFailed)
			}
			return st.Code, nil
		default:
			return -1, fmt.Errorf("agent endpoint: unexpected channel %d", ch)
		}
		if w != nil && len(p) > 0 {
			if _, err := w.Write(p); err != nil {
				return -1, err
			}
		}
	}
}

// Dial joins the authenticated c to port on the sandbox's loopback and
// returns it as a connection to that port; nothing listening there is
// an error.
func Dial(c *Conn, port int) (net.Conn, error) {
	req, err := json.Marshal(Request{Port: port})
	if err != nil {
		return nil, err
	}
	if err := c.WriteFrame(ChanRequest, req); err != nil {
		c.Close()
		return nil, err
	}
	ch, p, err := c.ReadFrame()
	switch {
	case err != nil:
		c.Close()
		return nil, err
	case ch == ChanStatus:
		c.Close()
		var st Status
		json.Unmarshal(p, &st) //nolint:errcheck // an empty status says why as well as it can
		return nil, fmt.Errorf("agent endpoint: port %d: %s", port, st.Error)
	case ch != ChanConnected:
		c.Close()
		return nil, fmt.Errorf("agent endpoint: unexpected channel %d", ch)
	}
	return &portConn{Conn: c.c, c: c}, nil
}

// portConn is a connection to a port of the sandbox through the agent.
type portConn struct {
	net.Conn // the transport: addresses, deadlines, Close
	c        *Conn
	// rest is what the last frame carried and Read has not returned.
	rest []byte
	eof  bool
}

func (pc *portConn) Read(p []byte) (int, error) {
	for len(pc.rest) == 0 {
		if pc.eof {
			return 0, io.EOF
		}
		ch, b, err := pc.c.ReadFrame()
		if err != nil {
			return 0, err
		}
		switch ch {
		case ChanStdout:
			pc.rest = append(pc.rest[:0], b...)
		case ChanStatus:
			pc.eof = true
		}
	}
	n := copy(p, pc.rest)
	pc.rest = pc.rest[n:]
	return n, nil
}

func (pc *portConn) Write(p []byte) (int, error) {
	if err := pc.c.WriteFrame(ChanStdin, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseWrite ends the client's direction: the port reads end of file.
func (pc *portConn) CloseWrite() error { return pc.c.WriteFrame(ChanStdinClose, nil) }
