package integration

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

// Where the E2B SDK can tell `hutch serve` from E2B's cloud, it does not
// (integration/e2b/exact.mjs): a paused sandbox is not running and its
// health check leaves it paused unless it was made with auto-resume; a
// killed one is "killed or reached its end of life", and its 502 is the
// one a wrong token gets; signed file URLs open their file by host name
// and nothing else; a default user's upload makes its parents; lists
// and metrics honour their parameters. Over TLS with only E2B_API_KEY
// and E2B_DOMAIN, as against E2B's cloud, so that sandbox hosts are
// routed by name.
func TestServeE2BExact(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	base := baseArchive(t)
	w := newTLSWorld(t)
	ca := newTLSCA(t, "hutch test CA")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca.issue(t, certFile, keyFile, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))

	s := newServer(t, base)
	key := s.tenantAdd("exact")
	s.listen = net.JoinHostPort(w.server, "443")
	s.tls = &tlsClient{roots: ca.pool, caFile: ca.file, netns: w.ns}
	s.flags = []string{"--tls-cert", certFile, "--tls-key", keyFile}
	s.serve()
	s.runScript(t, "exact.mjs", key, nil, 10*time.Minute)
	s.stopAndCheckClean()
}
