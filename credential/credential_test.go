package credential

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// The envd and traffic tokens of generation 0 are those serve derived
// before this package: clients holding one keep using it.
func TestTokenIsTheOldDerivation(t *testing.T) {
	k := Key(make([]byte, KeySize))
	old := func(kind, id string) string {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(kind + "\x00" + id))
		return hex.EncodeToString(m.Sum(nil)[:20])
	}
	id := strings.Repeat("a", 32)
	for _, p := range []Purpose{Envd, Traffic} {
		if got, want := k.Token(p, id, 0), old(string(p), id); got != want {
			t.Errorf("%s token %s, want %s", p, got, want)
		}
	}
}

func TestTokensDiffer(t *testing.T) {
	k, err := LoadKey(filepath.Join(t.TempDir(), "token.key"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := strings.Repeat("a", 32), strings.Repeat("b", 32)
	seen := map[string]string{}
	for _, p := range []Purpose{Envd, Traffic, Stream, MCP} {
		for _, id := range []string{a, b} {
			for _, gen := range []uint64{0, 1, 2} {
				tok := k.Token(p, id, gen)
				what := string(p) + " " + id + " " + string(rune('0'+gen))
				if other, ok := seen[tok]; ok {
					t.Errorf("%s and %s share a token", what, other)
				}
				seen[tok] = what
			}
		}
	}
}

func TestLoadKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "serve", "token.key")
	k1, err := LoadKey(p)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadKey(p)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("a", 32)
	if k1.Token(Envd, id, 0) != k2.Token(Envd, id, 0) {
		t.Fatal("a reloaded key derives other tokens")
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi.Mode(), err)
	}
	os.Remove(p)
	if k3, _ := LoadKey(p); k3.Token(Envd, id, 0) == k1.Token(Envd, id, 0) {
		t.Fatal("a new key derives the old tokens: removing the file revokes nothing")
	}
	os.WriteFile(p, []byte("short"), 0o600)
	if _, err := LoadKey(p); err == nil {
		t.Fatal("a truncated key file is accepted")
	}
}

func TestExpiring(t *testing.T) {
	k := Key(make([]byte, KeySize))
	id := strings.Repeat("a", 32)
	now := time.Unix(1_800_000_000, 0)
	tok := k.Expiring(Stream, id, 0, now.Add(time.Minute))
	if err := k.CheckExpiring(Stream, id, 0, tok, now); err != nil {
		t.Fatalf("a fresh token: %v", err)
	}
	if err := k.CheckExpiring(Stream, id, 0, tok, now.Add(time.Minute)); !errors.Is(err, ErrExpired) || !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a lapsed token: %v", err)
	}
	exp, mac, _ := strings.Cut(tok, ".")
	for name, bad := range map[string]string{
		"another purpose":    k.Expiring(MCP, id, 0, now.Add(time.Minute)),
		"another sandbox":    k.Expiring(Stream, strings.Repeat("b", 32), 0, now.Add(time.Minute)),
		"a later generation": k.Expiring(Stream, id, 1, now.Add(time.Minute)),
		"a longer expiry":    "9999999999." + mac,
		"a padded expiry":    "0" + exp + "." + mac,
		"no expiry":          mac,
		"empty":              "",
		"a plain token":      k.Token(Stream, id, 0),
	} {
		err := k.CheckExpiring(Stream, id, 0, bad, now)
		if !errors.Is(err, errdefs.ErrUnauthenticated) || errors.Is(err, ErrExpired) {
			t.Errorf("%s: %v, want an invalid token", name, err)
		}
	}
}

func TestMatch(t *testing.T) {
	if !Match("abc", "abc") || Match("abc", "abd") || Match("abc", "") || Match("", "") || Match("abc", "abcd") {
		t.Fatal("Match")
	}
}

func TestAPIKeyFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "serve", "api.key")
	k1, created, err := LoadAPIKey(p)
	if err != nil || !created {
		t.Fatalf("first load: %v, created %v", err, created)
	}
	if !strings.HasPrefix(k1, APIKeyPrefix) || len(k1) != len(APIKeyPrefix)+40 {
		t.Fatalf("key %q", k1)
	}
	k2, created, err := LoadAPIKey(p)
	if err != nil || created || k2 != k1 {
		t.Fatalf("second load: %q %v %v, want %q", k2, created, err, k1)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi.Mode(), err)
	}
	for name, c := range map[string]struct {
		body string
		mode os.FileMode
	}{
		"readable by others": {k1, 0o644},
		"short":              {"abc", 0o600},
		"two words":          {"e2b_0123456789 abcdefghijkl", 0o600},
		"empty":              {"", 0o600},
	} {
		f := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		os.WriteFile(f, []byte(c.body), c.mode)
		os.Chmod(f, c.mode)
		if _, err := ReadAPIKey(f); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), f) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
	if _, err := ReadAPIKey(dir); err == nil {
		t.Error("a directory is read as a key")
	}
	if _, err := ReadAPIKey(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file is read as a key")
	}
}

func TestPresented(t *testing.T) {
	for _, c := range []struct {
		h    map[string]string
		want string
	}{
		{map[string]string{"X-API-Key": "e2b_x"}, "e2b_x"},
		{map[string]string{"Authorization": "Bearer e2b_y"}, "e2b_y"},
		{map[string]string{"Authorization": "bearer e2b_y"}, "e2b_y"},
		{map[string]string{"X-API-Key": "e2b_x", "Authorization": "Bearer e2b_y"}, "e2b_x"},
		{map[string]string{"Authorization": "Basic dXNlcjo="}, ""},
		{map[string]string{"Authorization": "Bearer "}, ""},
		{nil, ""},
	} {
		h := http.Header{}
		for k, v := range c.h {
			h.Set(k, v)
		}
		if got := Presented(h); got != c.want {
			t.Errorf("%v: %q, want %q", c.h, got, c.want)
		}
	}
}
