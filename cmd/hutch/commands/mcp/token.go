package mcp

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// tokenFile is the HTTP transport's bearer token, in the server's state
// directory.
const tokenFile = "token"

// tokenLen is the token's length in bytes: 40 hex digits.
const tokenLen = 20

// token is the bearer credential of `hutch mcp --transport http` on TCP:
// a request without it is refused. It is tokenLen random bytes in lower
// hex, kept in the state directory (0600, in a 0700 directory) so that
// the owner's clients can read it and a restarted server keeps it;
// removing the file revokes it at the next start. That is the shape of
// the tokens `hutch serve` derives from its token key (HMAC-SHA256 of a
// purpose and an ID, cut to 20 bytes), so that it can become the token
// derived for the purpose "mcp" by changing loadToken alone: clients,
// the file and the check stay as they are.
type token struct {
	value string
	// file holds the value, for the messages that point to it.
	file string
}

// loadToken reads dir's token, making one on first use.
func loadToken(dir string) (token, error) {
	p := filepath.Join(dir, tokenFile)
	b, err := os.ReadFile(p)
	if err == nil {
		v := strings.TrimSpace(string(b))
		if d, err := hex.DecodeString(v); err != nil || len(d) != tokenLen || v != strings.ToLower(v) {
			return token{}, fmt.Errorf("%s: want %d hex digits (remove it to make a new token)", p, 2*tokenLen)
		}
		return token{value: v, file: p}, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return token{}, err
	}
	r := make([]byte, tokenLen)
	if _, err := rand.Read(r); err != nil {
		return token{}, err
	}
	v := hex.EncodeToString(r)
	// O_EXCL: of two servers starting at once, one token wins.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return loadToken(dir)
	}
	if err != nil {
		return token{}, err
	}
	if _, err := f.WriteString(v + "\n"); err != nil {
		f.Close()
		os.Remove(p)
		return token{}, err
	}
	if err := f.Close(); err != nil {
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
