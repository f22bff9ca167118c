package integration

import (
	"testing"
	"time"
)

// hutch serve's terminals (the E2B SDK's sandbox.pty) are the sandbox's
// own: see integration/e2b/pty.mjs.
func TestServePty(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	s := newServer(t, baseArchive(t))
	key := s.tenantAdd("pty-tenant")
	s.serve()
	s.runScript(t, "pty.mjs", key, nil, 3*time.Minute)
}
