package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"hutch.dev/hutch/client"
)

// A client calling a server in a sandbox over and over through the port
// routing (the code interpreter, a dev server) has its requests carried
// on kept-alive connections into the sandbox, and never pays for that
// with a failed request: not when the server restarts, not across a
// pause and resume.
func TestServePortConnectionsKeptAlive(t *testing.T) {
	requiresRoot(t)
	s := newServer(t, baseArchive(t))
	key := s.tenantAdd("acme")
	s.serve()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	sb := s.createSandbox(key, "base")
	api := (&client.Client{APIURL: s.url(""), APIKey: key}).Sandbox(sb.SandboxID, sb.EnvdAccessToken)
	// The server answers with its process ID and how many connections it
	// has answered requests on.
	mustRun(ctx, t, api, `cat > /tmp/srv.py <<'PY'
import os
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
conns = 0
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        global conns
        if not getattr(self, "counted", False):
            conns, self.counted = conns + 1, True
        b = ("%d %d\n" % (os.getpid(), conns)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
PY`)
	startServer := func() {
		t.Helper()
		mustRun(ctx, t, api, `python3 /tmp/srv.py >/dev/null 2>&1 & echo $! > /tmp/srv.pid; i=0; until python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000), 1)' 2>/dev/null; do i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.1; done`)
	}
	header := envdHeaders(key, sb)
	header["E2b-Sandbox-Port"] = "8000"
	get := func(n int) (pids map[string]bool, conns string) {
		t.Helper()
		pids = map[string]bool{}
		for i := 0; i < n; i++ {
			req, err := http.NewRequestWithContext(ctx, "GET", s.url("/"), nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range header {
				req.Header.Set(k, v)
			}
			resp, err := httpClient.Do(req)
			if err != nil {
				t.Fatalf("request %d through the port routing: %v", i+1, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d through the port routing: %s %s\nserver log:\n%s", i+1, resp.Status, b, s.logTail(20))
			}
			f := strings.Fields(string(b))
			if len(f) != 2 {
				t.Fatalf("request %d: answer %q", i+1, b)
			}
			pids[f[0]] = true
			conns = f[1]
		}
		return pids, conns
	}

	startServer()
	if _, conns := get(20); conns != "1" {
		t.Errorf("20 requests one after another reached the server on %s connections, want 1 kept alive", conns)
	}

	// The server restarts: the connection it held closes, and the next
	// request goes on a new one.
	mustRun(ctx, t, api, `kill $(cat /tmp/srv.pid); while kill -0 $(cat /tmp/srv.pid) 2>/dev/null; do sleep 0.05; done`)
	startServer()
	pids, _ := get(5)
	if len(pids) != 1 {
		t.Errorf("after the restart the answers came from %d processes, want the new one alone", len(pids))
	}

	// Paused and resumed, the sandbox's connections are new ones.
	jsonKey := map[string]string{"X-API-Key": key, "Content-Type": "application/json"}
	if r := s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil, jsonKey); r.status != http.StatusNoContent {
		t.Fatalf("pause: %s", r)
	}
	if r := s.do("POST", "/sandboxes/"+sb.SandboxID+"/connect", strings.NewReader(`{"timeout":300}`), jsonKey); r.status != http.StatusOK && r.status != http.StatusCreated {
		t.Fatalf("connect: %s", r)
	}
	after, _ := get(5)
	if fmt.Sprint(after) != fmt.Sprint(pids) {
		t.Errorf("after pause and resume the answers came from %v, want the same server %v", after, pids)
	}
}
