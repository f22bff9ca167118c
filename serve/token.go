package serve

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// tokenKey derives each sandbox's access tokens from its ID: an HMAC
// under a key only the server reads. The server thus never stores a
// token, yet gives a sandbox's tokens again to its tenant on connect and
// fork; removing the key file revokes every token at once.
type tokenKey []byte

const tokenKeyFile = "token.key"

// loadTokenKey reads dir's key, making one on first use.
func loadTokenKey(dir string) (tokenKey, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("server state: %w", err)
	}
	p := filepath.Join(dir, tokenKeyFile)
	k, err := os.ReadFile(p)
	if err == nil {
		if len(k) != 32 {
			return nil, fmt.Errorf("%s: want 32 bytes, has %d (remove it to make a new one, revoking every token)", p, len(k))
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	k = make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	// O_EXCL: of two servers starting at once, one key wins.
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return loadTokenKey(dir)
	}
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(k); err != nil {
		f.Close()
		os.Remove(p)
		return nil, err
	}
	return k, f.Close()
}

func (k tokenKey) derive(kind, id string) string {
	m := hmac.New(sha256.New, k)
	m.Write([]byte(kind + "\x00" + id))
	return hex.EncodeToString(m.Sum(nil)[:20])
}

// envd is the token of sandbox id's data plane (X-Access-Token).
func (k tokenKey) envd(id string) string { return k.derive("envd", id) }

// traffic is the token port previews of sandbox id need when its public
// traffic is off (E2b-Traffic-Access-Token).
func (k tokenKey) traffic(id string) string { return k.derive("traffic", id) }

// tokenMatches compares a presented token with the expected one in
// constant time.
func tokenMatches(want, got string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}
