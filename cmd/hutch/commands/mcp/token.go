package mcp

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"hutch.dev/hutch/credential"
)

// tokenFile is the HTTP transport's bearer token, in the server's state
// directory, for the owner's clients to read; keyFile is the key it is
// derived from.
const (
	tokenFile = "token"
	keyFile   = "token.key"
)

// tokenLen is the token's length in bytes: 40 hex digits.
const tokenLen = 20

// mcpServer is the name the token is derived for: the host's one server,
// not a sandbox.
const mcpServer = "hutch-mcp"

// token is the bearer credential of `hutch mcp --transport http` on TCP:
// a request without it is refused. It is the token of purpose
// credential.MCP derived from the key in the state directory (0600, in a
// 0700 directory), written beside it (0600) for the owner's clients to
// read; a restarted server gives the same token, and removing the key
// file revokes it at the next start.
type token struct {
	value string
	// file holds the value, for the messages that point to it.
	file string
}

// loadToken derives dir's token from its key, making the key on first
// use, and keeps the token file in step with it.
func loadToken(dir string) (token, error) {
	key, err := credential.LoadKey(filepath.Join(dir, keyFile))
	if err != nil {
		return token{}, err
	}
	v := key.Token(credential.MCP, mcpServer, 0)
	p := filepath.Join(dir, tokenFile)
	if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == v {
		return token{value: v, file: p}, nil
	}
	// Written whole under another name, then renamed: a client never
	// reads half a token.
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(v+"\n"), 0o600); err != nil {
		return token{}, err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return token{}, err
	}
	return token{value: v, file: p}, nil
}

// verify is the SDK's bearer-token check of a presented token, compared
// in constant time.
func (t token) verify(_ context.Context, got string, _ *http.Request) (*auth.TokenInfo, error) {
	if t.value == "" || subtle.ConstantTimeCompare([]byte(t.value), []byte(got)) != 1 {
		return nil, fmt.Errorf("the bearer token is not this server's (its owner finds it in %s): %w", t.file, auth.ErrInvalidToken)
	}
	return &auth.TokenInfo{UserID: "owner"}, nil
}

// require refuses, 401, a request without the token.
func (t token) require(h http.Handler) http.Handler {
	return auth.RequireBearerToken(t.verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
}
