package integration

import (
	"testing"
	"time"
)

// The E2B SDK's template tags through hutch serve: builds tagged at build
// and later, listed with their builds, creates of NAME:TAG, removal, and
// another tenant kept out (integration/e2b/tags.mjs).
func TestServeTemplateTags(t *testing.T) {
	requiresRoot(t)
	requireSDK(t)
	base := baseArchive(t)
	s := newServer(t, base)
	key := s.tenantAdd("tagger")
	other := s.tenantAdd("other")
	s.serve()
	s.runScript(t, "tags.mjs", key, map[string]string{"E2B_API_KEY_OTHER": other}, 15*time.Minute)
	s.stopBuilder()
	s.stopAndCheckClean()
}
