package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/websocket"
)

// fakeExec is an API server's exec endpoint: it echoes its input to
// stdout in upper case until the client closes the input, writes "err"
// on stderr and ends with the exit status the command's first argument
// names.
func fakeExec(t *testing.T) *Client {
	t.Helper()
	srv := websocket.Server{
		Handshake: func(cfg *websocket.Config, r *http.Request) error {
			if !slices.Contains(cfg.Protocol, execProtocol) {
				t.Errorf("exec offered protocols %v, want %s", cfg.Protocol, execProtocol)
			}
			cfg.Protocol = []string{execProtocol}
			return nil
		},
		Handler: func(ws *websocket.Conn) {
			ws.PayloadType = websocket.BinaryFrame
			q := ws.Request().URL.Query()
			if ws.Request().URL.Path != "/api/v1/namespaces/ns/pods/p/exec" || q.Get("container") != "c" || q.Get("stdin") != "true" {
				t.Errorf("exec request %s", ws.Request().URL)
			}
			for {
				var msg []byte
				if err := websocket.Message.Receive(ws, &msg); err != nil {
					t.Errorf("receive: %v", err)
					return
				}
				if msg[0] == chanClose && len(msg) == 2 && msg[1] == chanStdin {
					break
				}
				if msg[0] == chanStdin {
					websocket.Message.Send(ws, append([]byte{chanStdout}, bytes.ToUpper(msg[1:])...)) //nolint:errcheck // the test reads it
				}
			}
			websocket.Message.Send(ws, append([]byte{chanStderr}, "err"...)) //nolint:errcheck // the test reads it
			st := map[string]any{"status": "Success"}
			if code := q["command"][0]; code != "0" {
				st = map[string]any{"status": "Failure", "reason": "NonZeroExitCode", "message": "exit " + code,
					"details": map[string]any{"causes": []map[string]string{{"reason": "ExitCode", "message": code}}}}
			}
			b, _ := json.Marshal(st)
			websocket.Message.Send(ws, append([]byte{chanStatus}, b...)) //nolint:errcheck // the test reads it
		},
	}
	ts := httptest.NewTLSServer(srv)
	t.Cleanup(ts.Close)
	u, _ := url.Parse(ts.URL)
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	return &Client{server: u, tls: &tls.Config{RootCAs: pool}, http: ts.Client()}
}

func TestExec(t *testing.T) {
	c := fakeExec(t)
	for _, code := range []int{0, 7} {
		var stdout, stderr bytes.Buffer
		got, err := c.Exec(context.Background(), ExecRequest{
			Namespace: "ns", Pod: "p", Container: "c", Args: []string{map[int]string{0: "0", 7: "7"}[code]},
			Stdin: strings.NewReader("hello"), Stdout: &stdout, Stderr: &stderr,
		})
		if err != nil || got != code {
			t.Fatalf("Exec = %d, %v; want %d", got, err, code)
		}
		if stdout.String() != "HELLO" || stderr.String() != "err" {
			t.Errorf("stdout %q, stderr %q; want HELLO, err", stdout.String(), stderr.String())
		}
	}
}
