// Package credential is what `hutch serve` takes as proof of who calls it:
// API keys (the operator's, a tenant's, the one key of a server without
// tenants) and the tokens it derives for one sandbox and one purpose
// (envd's data plane, port previews, and the purposes reserved for a
// stream URL and MCP over HTTP). docs/credentials.md says who holds each,
// what it opens and how it expires and is revoked.
//
// The package makes, reads, derives and compares credentials. It does not
// know what a tenant or a sandbox is, nor which route a credential opens:
// the server decides that. It imports nothing of hutch.
package credential

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// Principal is who a presented API key is: the operator, a tenant, or
// both (the one key of a server without tenants).
type Principal struct {
	// Tenant is the tenant the key acts as; empty for the operator's
	// own key, which acts as no tenant.
	Tenant string
	// Operator says the key opens the operator's view: /metrics, and
	// what names every tenant.
	Operator bool
}

// APIKeyPrefix starts every API key hutch makes, as E2B's keys do.
const APIKeyPrefix = "e2b_"

// apiKeyBytes is the random part of a key: 160 bits, as 40 hex digits.
const apiKeyBytes = 20

// NewAPIKey is a fresh API key: APIKeyPrefix and 40 hex digits from
// crypto/rand.
func NewAPIKey() string {
	b := make([]byte, apiKeyBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand.Read panics instead)
	return APIKeyPrefix + hex.EncodeToString(b)
}

// maxAPIKeyFile bounds what ReadAPIKey reads: a key is one short line.
const maxAPIKeyFile = 4096

// ReadAPIKey reads the API key in the file at path: one line of at least
// 20 printable characters without spaces. The file must be a regular file
// that only its owner may read or write (mode 0600 or stricter).
func ReadAPIKey(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("API key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("API key file %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("API key file %s: not a regular file: %w", path, errdefs.ErrInvalidArgument)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("API key file %s: mode %04o lets others read or write it: want 0600 (chmod 600 %s): %w", path, fi.Mode().Perm(), path, errdefs.ErrInvalidArgument)
	}
	if fi.Size() > maxAPIKeyFile {
		return "", fmt.Errorf("API key file %s: %d bytes, want one line: %w", path, fi.Size(), errdefs.ErrInvalidArgument)
	}
	b := make([]byte, maxAPIKeyFile)
	n, _ := f.Read(b)
	key := strings.TrimSpace(string(b[:n]))
	if err := checkAPIKey(key); err != nil {
		return "", fmt.Errorf("API key file %s: %w", path, err)
	}
	return key, nil
}

func checkAPIKey(key string) error {
	if len(key) < 20 {
		return fmt.Errorf("want one key of at least 20 characters, has %d: %w", len(key), errdefs.ErrInvalidArgument)
	}
	for _, c := range key {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("the key holds a space, a control or a non-ASCII character: %w", errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// LoadAPIKey reads the API key at path, making the file (mode 0600, a new
// key from NewAPIKey) if it does not exist; created says it did not. Of two
// processes that make it at once, one key wins and both read it.
func LoadAPIKey(path string) (key string, created bool, err error) {
	key, err = ReadAPIKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", false, fmt.Errorf("API key file: %w", err)
	}
	key = NewAPIKey()
	if err := writeExclusive(path, []byte(key+"\n")); errors.Is(err, fs.ErrExist) {
		key, err = ReadAPIKey(path)
		return key, false, err
	} else if err != nil {
		return "", false, fmt.Errorf("API key file: %w", err)
	}
	return key, true, nil
}

// writeExclusive makes the file at path (mode 0600) with b, failing with
// fs.ErrExist if it is there; a failed write leaves no file.
func writeExclusive(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// Presented is the API key a request carries: E2B's X-API-Key header
// (what the SDKs send), else an Authorization: Bearer token. Empty: none.
func Presented(h http.Header) string {
	if k := h.Get("X-API-Key"); k != "" {
		return k
	}
	if auth := h.Get("Authorization"); len(auth) > len("Bearer ") && strings.EqualFold(auth[:len("Bearer ")], "Bearer ") {
		return strings.TrimSpace(auth[len("Bearer "):])
	}
	return ""
}

// Match compares a presented secret with the expected one in constant
// time (for secrets of the same length). An empty expected secret matches
// nothing.
func Match(want, got string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}

// Purpose is what a derived token opens. A token of one purpose opens
// nothing of another.
type Purpose string

const (
	// Envd is a sandbox's data plane (envd's X-Access-Token): its
	// processes and files.
	Envd Purpose = "envd"
	// Traffic is a private sandbox's port previews
	// (E2b-Traffic-Access-Token).
	Traffic Purpose = "traffic"
	// Stream is reserved for a URL that opens a sandbox's browser
	// (DevTools) or desktop stream.
	Stream Purpose = "stream"
	// MCP is reserved for a sandbox's MCP server over HTTP.
	MCP Purpose = "mcp"
	// Volume is a volume's token for E2B's volume content API.
	Volume Purpose = "volume"
	// Upload is an upload URL of a template build's files, for one
	// tenant and one files hash (expiring).
	Upload Purpose = "template-upload"
)

// KeySize is the size of a Key.
const KeySize = 32

// Key is the secret a server derives its tokens with, kept in a file only
// the server reads. A token is an HMAC-SHA256 under it of the purpose, the
// sandbox and the sandbox's generation, so the server stores no token yet
// gives a sandbox's tokens again on connect and fork. Replacing the key
// file revokes every token at once; raising a sandbox's generation
// revokes that sandbox's.
type Key []byte

// LoadKey reads the key at path, making it (mode 0600, from crypto/rand)
// on first use. Of two servers starting at once, one key wins.
func LoadKey(path string) (Key, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("server state: %w", err)
	}
	k, err := os.ReadFile(path)
	if err == nil {
		if len(k) != KeySize {
			return nil, fmt.Errorf("%s: want %d bytes, has %d (remove it to make a new one, revoking every token)", path, KeySize, len(k))
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	k = make([]byte, KeySize)
	_, _ = rand.Read(k) // never fails (crypto/rand.Read panics instead)
	if err := writeExclusive(path, k); errors.Is(err, fs.ErrExist) {
		return LoadKey(path)
	} else if err != nil {
		return nil, err
	}
	return k, nil
}

// tokenBytes is how much of the HMAC a token keeps: 160 bits.
const tokenBytes = 20

func (k Key) mac(parts ...string) string {
	m := hmac.New(sha256.New, k)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(m.Sum(nil)[:tokenBytes])
}

// Token is the token of purpose p for sandbox at generation gen. It does
// not expire: it lasts as long as the sandbox, its generation and the key
// (what E2B's envd and traffic tokens are to its SDKs). Generation 0 is a
// sandbox's first.
func (k Key) Token(p Purpose, sandbox string, gen uint64) string {
	if gen == 0 {
		return k.mac(string(p), sandbox)
	}
	return k.mac(string(p), sandbox, strconv.FormatUint(gen, 10))
}

// Expiring is a token of purpose p for sandbox at generation gen that
// lapses at until: the expiry, in Unix seconds, then '.' and the HMAC over
// all of it. A URL handed to a browser carries one.
func (k Key) Expiring(p Purpose, sandbox string, gen uint64, until time.Time) string {
	exp := strconv.FormatInt(until.Unix(), 10)
	return exp + "." + k.mac(string(p), sandbox, strconv.FormatUint(gen, 10), "expires", exp)
}

// ErrExpired is an expiring token presented after its expiry.
var ErrExpired = errors.New("token expired")

// CheckExpiring checks an expiring token of purpose p for sandbox at
// generation gen at time now. A token that is not one is
// errdefs.ErrUnauthenticated; one that lapsed is ErrExpired too.
func (k Key) CheckExpiring(p Purpose, sandbox string, gen uint64, token string, now time.Time) error {
	exp, _, ok := strings.Cut(token, ".")
	until, err := strconv.ParseInt(exp, 10, 64)
	if !ok || err != nil || !Match(k.Expiring(p, sandbox, gen, time.Unix(until, 0)), token) {
		return fmt.Errorf("invalid %s token: %w", p, errdefs.ErrUnauthenticated)
	}
	if !now.Before(time.Unix(until, 0)) {
		return fmt.Errorf("%s token: %w: %w", p, ErrExpired, errdefs.ErrUnauthenticated)
	}
	return nil
}
