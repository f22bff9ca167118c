package integration

import (
	"strings"
	"testing"
)

// createWithSecret creates a sandbox whose setup writes the secret TOKEN
// (value token) into the filesystem, and returns it with its setup cache
// state.
func (e *env) createWithSecret(token string, args ...string) (string, string) {
	e.t.Helper()
	saved := e.extra
	e.extra = append(append([]string(nil), saved...), "HOSTILE_TOKEN="+token)
	defer func() { e.extra = saved }()
	id := e.create(append([]string{"--secret", "TOKEN=env:HOSTILE_TOKEN", "--setup", `echo "$TOKEN" > /tok; echo "$MIRROR" > /mirror`}, args...)...)
	var rec struct {
		SetupCache string `json:"setupCache"`
	}
	e.inspectInto(id, &rec)
	return id, rec.SetupCache
}

// A setup that writes a secret into the filesystem is cached; a second
// requester with the same image and commands but another secret, or
// another env, must start from a setup run of its own, never from the
// first one's files.
func TestHostileSetupCacheSecrets(t *testing.T) {
	e := newEnv(t)
	a, state := e.createWithSecret("secret-of-a")
	if got := strings.TrimSpace(e.ok("exec", a, "--", "cat", "/tok")); got != "secret-of-a" || state != "ran" {
		t.Fatalf("first create: /tok %q, setup %q", got, state)
	}
	b, state := e.createWithSecret("secret-of-b")
	if got := strings.TrimSpace(e.ok("exec", b, "--", "cat", "/tok")); got != "secret-of-b" || state != "ran" {
		t.Fatalf("a create with another secret value sees /tok %q (setup %q): the first requester's secret leaked", got, state)
	}
	// The same secret and env reuse the cached result.
	_, state = e.createWithSecret("secret-of-a")
	if state != "hit" {
		t.Fatalf("an identical create did not reuse the cached setup: %q", state)
	}
	// An env that changes what setup fetches is part of the key too.
	c, state := e.createWithSecret("secret-of-a", "--env", "MIRROR=https://mirror.invalid")
	if got := strings.TrimSpace(e.ok("exec", c, "--", "cat", "/mirror")); got != "https://mirror.invalid" || state != "ran" {
		t.Fatalf("a create with another env sees /mirror %q (setup %q)", got, state)
	}
}
