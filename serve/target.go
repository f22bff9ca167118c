package serve

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"

	"hutch.dev/hutch/serve/placement"
)

// target is the sandbox a data-plane request is for, as the router
// resolved and authorised it: the request's tenant owns the sandbox, the
// sandbox runs (a paused one was resumed first), and a secure sandbox's
// access token matched.
type target struct {
	// Tenant is the tenant that owns the sandbox.
	Tenant string
	// SandboxID is the engine's ID of the sandbox (E2B's sandboxID).
	SandboxID string
}

type targetKey struct{}

func withTarget(ctx context.Context, t target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

// targetOf is the target the router put in ctx. Handlers of the data
// plane are only reached through the router, so it is always there.
func targetOf(ctx context.Context) target {
	t, _ := ctx.Value(targetKey{}).(target)
	return t
}

// requestUser is the user a data-plane request asks to act as: E2B's SDKs
// send it as HTTP Basic authentication with the user name and an empty
// password. A request without one acts as placement.DefaultUser.
func requestUser(h http.Header) string {
	auth := h.Get("Authorization")
	const prefix = "Basic "
	if !strings.HasPrefix(auth, prefix) {
		return placement.DefaultUser
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, prefix))
	if err != nil {
		return placement.DefaultUser
	}
	user, _, _ := strings.Cut(string(raw), ":")
	if user == "" {
		return placement.DefaultUser
	}
	return user
}
