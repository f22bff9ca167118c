package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hutch.dev/hutch/agent/agentnet"
)

// endpoint serves the agent's network endpoint with key on loopback.
func endpoint(t *testing.T, key []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveEndpoint(ln, key)
	return ln.Addr().String()
}

func dialExec(t *testing.T, addr string, key []byte, args []string, stdin string) (int, string, string, error) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentnet.Client(nc, key)
	if err != nil {
		nc.Close()
		return -1, "", "", err
	}
	var in *strings.Reader
	if stdin != "" {
		in = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	var code int
	if in != nil {
		code, err = agentnet.Exec(context.Background(), c, args, in, &out, &errb)
	} else {
		code, err = agentnet.Exec(context.Background(), c, args, nil, &out, &errb)
	}
	return code, out.String(), errb.String(), err
}

func TestEndpointRunsCommands(t *testing.T) {
	key := bytes.Repeat([]byte{7}, agentnet.KeySize)
	addr := endpoint(t, key)
	code, out, errs, err := dialExec(t, addr, key, []string{"/bin/sh", "-c", "cat; echo oops >&2; exit 3"}, "from stdin\n")
	if err != nil || code != 3 || out != "from stdin\n" || errs != "oops\n" {
		t.Fatalf("exec: %d %q %q %v; want 3, the input, oops", code, out, errs, err)
	}
	big := strings.Repeat("0123456789abcdef", 20000)
	code, out, _, err = dialExec(t, addr, key, []string{"/bin/sh", "-c", "cat"}, big)
	if err != nil || code != 0 || out != big {
		t.Fatalf("exec of 320 KB through cat: %d, %d bytes, %v", code, len(out), err)
	}
	code, _, _, err = dialExec(t, addr, key, []string{"/bin/sh", "-c", "kill -9 $$"}, "")
	if err != nil || code != 137 {
		t.Fatalf("a command killed by SIGKILL: %d %v, want 137", code, err)
	}
	if _, _, _, err = dialExec(t, addr, key, []string{"/no/such/exe"}, ""); !errors.Is(err, agentnet.ErrExecFailed) {
		t.Fatalf("a missing executable: %v, want ErrExecFailed", err)
	}
}

func TestEndpointRefusesWrongKey(t *testing.T) {
	key := bytes.Repeat([]byte{7}, agentnet.KeySize)
	addr := endpoint(t, key)
	mark := filepath.Join(t.TempDir(), "ran")
	wrong := bytes.Repeat([]byte{8}, agentnet.KeySize)
	_, _, _, err := dialExec(t, addr, wrong, []string{"/bin/sh", "-c", "touch " + mark}, "")
	if !errors.Is(err, agentnet.ErrAuth) {
		t.Fatalf("a client with another key: %v, want ErrAuth", err)
	}
	// A client that skips the handshake and sends a request in the clear.
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.Write(bytes.Repeat([]byte(`{"args":["/bin/sh","-c","touch `+mark+`"]}`), 4)) //nolint:errcheck // checked by the mark
	buf := make([]byte, 4096)
	n, _ := nc.Read(buf)
	for {
		k, err := nc.Read(buf[n:])
		n += k
		if err != nil {
			break
		}
	}
	nc.Close()
	if n != len(agentnet.Hello)+32 {
		t.Errorf("the agent sent %d bytes to a client without the key, want only its hello", n)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("a client without the key ran a command")
	}
	// The right key still works after.
	if code, _, _, err := dialExec(t, addr, key, []string{"/bin/true"}, ""); err != nil || code != 0 {
		t.Fatalf("the right key: %d %v", code, err)
	}
}

// A port request joins the connection to a port on the loopback, as a
// port preview needs; a port nothing listens on is an error.
func TestEndpointJoinsPort(t *testing.T) {
	key := bytes.Repeat([]byte{7}, agentnet.KeySize)
	addr := endpoint(t, key)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	dial := func(port int) (net.Conn, error) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		c, err := agentnet.Client(nc, key)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return agentnet.Dial(c, port)
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       func(context.Context, string, string) (net.Conn, error) { return dial(port) },
		DisableKeepAlives: true,
	}}
	for i := range 3 {
		resp, err := hc.Post("http://sandbox/p", "text/plain", strings.NewReader(strings.Repeat("b", 100000*i)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := "POST /p " + strings.Repeat("b", 100000*i); string(b) != want {
			t.Fatalf("through the port: %d bytes, want %d", len(b), len(want))
		}
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if c, err := dial(closed); err == nil {
		c.Close()
		t.Fatal("a port nothing listens on: connected")
	}
}
