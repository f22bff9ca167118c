package tenant

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/credential"
)

// APIKey is one of a tenant's API keys, as it lists them: never the key,
// only its mask.
type APIKey struct {
	ID      string
	Name    string
	Suffix  string
	Created time.Time
}

// FirstKeyName names the key `hutch tenant add` made.
const FirstKeyName = "first key"

// firstKeyID is the ID of a tenant's first key: a UUID taken from its
// hash, the same in every listing.
func firstKeyID(hash string) string {
	h := sha256.Sum256([]byte("first key " + hash))
	return uuidOf(h[:16])
}

func uuidOf(b []byte) string {
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	x := hex.EncodeToString(b)
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

// maxKeys bounds a tenant's keys.
const maxKeys = 64

func checkKeyName(name string) error {
	if strings.TrimSpace(name) == "" || len(name) > 200 || strings.ContainsAny(name, "\x00\n\r") {
		return fmt.Errorf("name %q: want a name of 1 to 200 characters on one line: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Keys lists tenant name's API keys, oldest first.
func (s *Store) Keys(name string) ([]APIKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.refreshLocked(true); err != nil {
		return nil, err
	}
	for _, r := range s.records {
		if r.Name != name {
			continue
		}
		var out []APIKey
		if r.KeySHA256 != "" {
			out = append(out, APIKey{ID: firstKeyID(r.KeySHA256), Name: FirstKeyName, Suffix: r.KeySuffix, Created: r.Created})
		}
		for _, k := range r.Keys {
			out = append(out, APIKey{ID: k.ID, Name: k.Name, Suffix: k.KeySuffix, Created: k.Created})
		}
		return out, nil
	}
	return nil, fmt.Errorf("tenant %q: %w", name, errdefs.ErrNotFound)
}

// AddKey gives tenant name another API key, named keyName, and returns
// it: the only time the key exists outside the caller.
func (s *Store) AddKey(name, keyName string) (string, APIKey, error) {
	if err := checkKeyName(keyName); err != nil {
		return "", APIKey{}, err
	}
	key := credential.NewAPIKey()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", APIKey{}, err
	}
	k := storedKey{ID: uuidOf(b), Name: keyName, KeySHA256: hashKey(key), KeySuffix: key[len(key)-4:], Created: time.Now().UTC().Truncate(time.Second)}
	err := s.updateTenant(name, func(r *record) error {
		if len(r.Keys) >= maxKeys {
			return fmt.Errorf("tenant %q has %d keys, the most it may: revoke one first: %w", name, maxKeys, errdefs.ErrResourceExhausted)
		}
		r.Keys = append(r.Keys, k)
		return nil
	})
	if err != nil {
		return "", APIKey{}, err
	}
	return key, APIKey{ID: k.ID, Name: k.Name, Suffix: k.KeySuffix, Created: k.Created}, nil
}

// RenameKey renames tenant name's key id.
func (s *Store) RenameKey(name, id, keyName string) error {
	if err := checkKeyName(keyName); err != nil {
		return err
	}
	return s.updateTenant(name, func(r *record) error {
		for i := range r.Keys {
			if r.Keys[i].ID == id {
				r.Keys[i].Name = keyName
				return nil
			}
		}
		if r.KeySHA256 != "" && firstKeyID(r.KeySHA256) == id {
			return fmt.Errorf("the first key keeps its name (%q): %w", FirstKeyName, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("API key %q not found: %w", id, errdefs.ErrNotFound)
	})
}

// RevokeKey removes tenant name's key id: from then on it opens nothing
// here, and within a second for the other servers on the file. A
// tenant's last key is not revoked: it would lock the tenant out.
func (s *Store) RevokeKey(name, id string) error {
	return s.updateTenant(name, func(r *record) error {
		n := len(r.Keys)
		if r.KeySHA256 != "" {
			n++
		}
		found := false
		if r.KeySHA256 != "" && firstKeyID(r.KeySHA256) == id {
			found = true
		}
		for _, k := range r.Keys {
			found = found || k.ID == id
		}
		if !found {
			return fmt.Errorf("API key %q not found: %w", id, errdefs.ErrNotFound)
		}
		if n == 1 {
			return fmt.Errorf("API key %q is the tenant's last: make another before revoking it: %w", id, errdefs.ErrConflict)
		}
		if r.KeySHA256 != "" && firstKeyID(r.KeySHA256) == id {
			r.KeySHA256, r.KeySuffix = "", ""
			return nil
		}
		for i, k := range r.Keys {
			if k.ID == id {
				r.Keys = append(r.Keys[:i], r.Keys[i+1:]...)
				break
			}
		}
		return nil
	})
}

// updateTenant applies change to tenant name's record.
func (s *Store) updateTenant(name string, change func(*record) error) error {
	return s.update(func(recs []record) ([]record, error) {
		for i := range recs {
			if recs[i].Name == name {
				if err := change(&recs[i]); err != nil {
					return nil, err
				}
				return recs, nil
			}
		}
		return nil, fmt.Errorf("tenant %q: %w", name, errdefs.ErrNotFound)
	})
}
