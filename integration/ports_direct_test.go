package integration

import (
	"fmt"
	"strings"
	"testing"
)

// A port published by a sandbox with a network is served over its own
// address, not through the agent: its server sees the connection come
// from the host's end of the link. A server listening on the sandbox's
// 127.0.0.1 only is still reached, through the agent. Forwarding opens
// nothing the other way: the sandbox still cannot connect to the host,
// while forwarded connections are open.
func TestPublishDirect(t *testing.T) {
	e := newEnv(t)
	hostPort := hostListener(t)
	id := e.create("--net", "open", "-p", "0:8080", "-p", "0:8081")
	sb := e.inspect(id)
	rec := e.ports(id)
	if len(rec.Ports) != 2 || sb.IP == "" {
		t.Fatalf("inspect: %+v, address %q", rec, sb.IP)
	}
	sum := e.startHTTPD(id)
	// A CGI script answers with the address the server saw the
	// connection come from; a second server listens on 127.0.0.1 only.
	e.ok("exec", id, "--", "sh", "-c", `mkdir -p /www/cgi-bin && printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho "$REMOTE_ADDR"\n' > /www/cgi-bin/peer && chmod +x /www/cgi-bin/peer`)
	e.ok("exec", "-d", id, "--", "httpd", "-f", "-p", "127.0.0.1:8081", "-h", "/www")
	url := func(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", rec.Ports[i].HostPort) }

	checkServed(t, url(0), id, sum)
	peer, err := get(url(0) + "/cgi-bin/peer")
	if err != nil {
		t.Fatal(err)
	}
	if gw := hostGateway(sb.IP); !strings.Contains(peer, gw) {
		t.Fatalf("the server saw a forwarded connection come from %q, want the host's end of the link %s (the direct path)", strings.TrimSpace(peer), gw)
	}

	checkServed(t, url(1), id, sum)
	if peer, err := get(url(1) + "/cgi-bin/peer"); err != nil || !strings.Contains(peer, "127.0.0.1") {
		t.Fatalf("a server on the sandbox's 127.0.0.1 saw %q, %v; want it reached through the agent, from 127.0.0.1", peer, err)
	}

	// Connections forwarded on the direct path admit nothing back.
	mustNotReach(t, e, id, hostGateway(sb.IP), hostPort)
	mustNotReach(t, e, id, hostGateway(sb.IP), fmt.Sprint(rec.Ports[0].HostPort))
	mustNotReach(t, e, id, "127.0.0.1", hostPort)

	e.ok("rm", "-f", id)
	e.assertClean(id)
}
