package kubeplace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/agentnet"
)

// fakeAgent answers port requests on loopback as the agent's endpoint
// does (the real one is tested in package agent).
func fakeAgent(t *testing.T, key []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				c, err := agentnet.Server(nc, key)
				if err != nil {
					return
				}
				_, p, _ := c.ReadFrame()
				var req agentnet.Request
				json.Unmarshal(p, &req) //nolint:errcheck // a zero port fails below
				tc, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(req.Port)))
				if err != nil {
					b, _ := json.Marshal(agentnet.Status{Code: -1, Error: err.Error()})
					c.WriteFrame(agentnet.ChanStatus, b) //nolint:errcheck // test
					return
				}
				defer tc.Close()
				c.WriteFrame(agentnet.ChanConnected, nil) //nolint:errcheck // test
				go func() {
					for {
						ch, p, err := c.ReadFrame()
						if err != nil || ch != agentnet.ChanStdin {
							return
						}
						tc.Write(p) //nolint:errcheck // test
					}
				}()
				b := make([]byte, 4096)
				for {
					n, err := tc.Read(b)
					if n > 0 {
						c.WriteFrame(agentnet.ChanStdout, b[:n]) //nolint:errcheck // test
					}
					if err != nil {
						c.WriteFrame(agentnet.ChanStatus, []byte(`{}`)) //nolint:errcheck // test
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A port preview reaches the sandbox's port through its agent; a sandbox
// without network has none; a port nothing listens on is not found.
func TestKubeDialPort(t *testing.T) {
	key := bytes.Repeat([]byte{3}, agentnet.KeySize)
	echo, _ := net.Listen("tcp", "127.0.0.1:0")
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() //nolint:errcheck // test
		}
	}()
	k := &Placement{cfg: &Config{Namespace: "default"}}
	k.remember("a", &kubeEndpoint{addr: fakeAgent(t, key), key: key})
	k.remember("none", &kubeEndpoint{})
	c, err := k.DialPort(context.Background(), "a", uint16(echo.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("ping")) //nolint:errcheck // read back below
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("through the port: %q %v", b, err)
	}
	c.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	if _, err := k.DialPort(context.Background(), "a", closed); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a port nothing listens on: %v, want not found", err)
	}
	if _, err := k.DialPort(context.Background(), "none", 80); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("a sandbox without network: %v, want not implemented", err)
	}
}
