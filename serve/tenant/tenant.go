// Package tenant is the tenants file of `hutch serve`: who may call the API,
// with which key, and how much of the host each tenant may hold at once.
//
// The file is JSON, one entry per tenant: a name, the SHA-256 of its API
// key (never the key itself), its quota and when it was added. Writers
// (hutch tenant add and rm) take an flock on a lock file beside it, rewrite
// it whole into a temporary file and rename that over it, so readers never
// see half a file and two concurrent writers never lose an entry. A Store
// that serves requests notices a rewrite on its own, at most a second
// later, without a restart.
//
// The package owns the file and the arithmetic of quotas. It does not know
// what a sandbox is or what a tenant is using: the server counts usage and
// asks Quota.Admit.
package tenant

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/credential"
)

// Quota bounds what one tenant holds at once. A zero field is unlimited.
type Quota struct {
	// MaxSandboxes is the number of sandboxes the tenant may hold at once,
	// as the server counts them.
	MaxSandboxes int `json:"max_sandboxes"`
	// MaxCPUs is the sum of the CPU limits of its sandboxes, in cores.
	MaxCPUs float64 `json:"max_cpus"`
	// MaxMemory is the sum of their memory limits, in bytes.
	MaxMemory int64 `json:"max_memory"`
	// MaxDisk is the sum of their writable layer sizes and of what its
	// snapshots take, in bytes.
	MaxDisk int64 `json:"max_disk"`
	// MaxSnapshots is the number of snapshots (templates of its own) the
	// tenant may keep.
	MaxSnapshots int `json:"max_snapshots,omitempty"`
}

// Tenant is one entry of the tenants file, without its key's hash.
type Tenant struct {
	Name    string    `json:"name"`
	Quota   Quota     `json:"quota"`
	Created time.Time `json:"created"`
}

// Usage is what a tenant holds, or asks for, in the units of Quota.
type Usage struct {
	Sandboxes int
	CPUs      float64
	Memory    int64
	Disk      int64
	Snapshots int
}

// Add is u and v together.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		Sandboxes: u.Sandboxes + v.Sandboxes, CPUs: u.CPUs + v.CPUs, Memory: u.Memory + v.Memory,
		Disk: u.Disk + v.Disk, Snapshots: u.Snapshots + v.Snapshots,
	}
}

// Sub is u without v.
func (u Usage) Sub(v Usage) Usage {
	return Usage{
		Sandboxes: u.Sandboxes - v.Sandboxes, CPUs: u.CPUs - v.CPUs, Memory: u.Memory - v.Memory,
		Disk: u.Disk - v.Disk, Snapshots: u.Snapshots - v.Snapshots,
	}
}

// record is a tenant as the file stores it.
type record struct {
	Name string `json:"name"`
	// KeySHA256 is the hex SHA-256 of the tenant's first API key (made by
	// Add); empty once that key is revoked (RevokeKey).
	KeySHA256 string `json:"key_sha256"`
	// KeySuffix is the first key's last characters, for its mask.
	KeySuffix string `json:"key_suffix,omitempty"`
	// Keys are the keys the tenant made itself (AddKey).
	Keys    []storedKey `json:"keys,omitempty"`
	Quota   Quota       `json:"quota"`
	Created time.Time   `json:"created"`
}

// storedKey is a tenant's further API key as the file stores it.
type storedKey struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	KeySHA256 string    `json:"key_sha256"`
	KeySuffix string    `json:"key_suffix"`
	Created   time.Time `json:"created"`
}

func (r record) tenant() Tenant { return Tenant{Name: r.Name, Quota: r.Quota, Created: r.Created} }

// file is the tenants file's content.
type file struct {
	Tenants []record `json:"tenants"`
}

// KeyPrefix starts every API key, as E2B's keys do.
const KeyPrefix = credential.APIKeyPrefix

// checkEvery is how often Authenticate looks at the file for changes.
const checkEvery = time.Second

// nameRE leaves the length to ValidateName: a bounded repetition is a
// large compile at every process start.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// ValidateName checks a tenant name: a lower-case letter or digit, then up
// to 62 lower-case letters, digits, '_' or '-'.
func ValidateName(name string) error {
	if len(name) > 63 || !nameRE.MatchString(name) {
		return fmt.Errorf("%w: tenant name %q: want a lower-case letter or digit, then up to 62 of a-z, 0-9, '_' and '-'", errdefs.ErrInvalidArgument, name)
	}
	return nil
}

// Validate checks that no limit is negative (or, for CPUs, not a number).
func (q Quota) Validate() error {
	var errs []error
	if q.MaxSandboxes < 0 {
		errs = append(errs, fmt.Errorf("max-sandboxes %d: must not be negative", q.MaxSandboxes))
	}
	if q.MaxCPUs < 0 || math.IsNaN(q.MaxCPUs) || math.IsInf(q.MaxCPUs, 0) {
		errs = append(errs, fmt.Errorf("max-cpus %v: want a non-negative number of cores", q.MaxCPUs))
	}
	if q.MaxMemory < 0 {
		errs = append(errs, fmt.Errorf("max-memory %d: must not be negative", q.MaxMemory))
	}
	if q.MaxDisk < 0 {
		errs = append(errs, fmt.Errorf("max-disk %d: must not be negative", q.MaxDisk))
	}
	if q.MaxSnapshots < 0 {
		errs = append(errs, fmt.Errorf("max-snapshots %d: must not be negative", q.MaxSnapshots))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: quota: %w", errdefs.ErrInvalidArgument, errors.Join(errs...))
}

// hashKey is the hex SHA-256 of an API key.
//
// A key is 160 random bits, so a fast hash is enough: nobody can guess a
// key from its hash by trying likely keys, as they could a password. A slow
// password hash (bcrypt, argon2) would add nothing but its cost, paid on
// every request.
func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// fileID tells one version of the file from another without reading it.
type fileID struct {
	exists bool
	dev    uint64
	ino    uint64
	size   int64
	mtime  time.Time
	ctime  time.Time
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fileID{}, nil
	}
	if err != nil {
		return fileID{}, fmt.Errorf("tenants file %s: %w", path, err)
	}
	id := fileID{exists: true, size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), st.Ino
		id.ctime = time.Unix(st.Ctim.Unix())
	}
	return id, nil
}

// Store is a tenants file. It is safe for concurrent use, and several
// Stores (in one process or several) may share one file.
type Store struct {
	path string
	// checkEvery is how often Authenticate stats the file (tests set 0).
	checkEvery time.Duration

	// mu guards the fields below: the last good content of the file.
	mu      sync.Mutex
	records []record
	id      fileID
	checked time.Time
	// failing says the last look failed, at the version badID: each
	// failing version is logged once rather than at every look.
	failing bool
	badID   fileID
}

// Open loads the tenants file at path. A missing file is an empty store; a
// file that is not a valid tenants file is an error naming the file and
// what is wrong with it.
func Open(path string) (*Store, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: tenants file: no path", errdefs.ErrInvalidArgument)
	}
	s := &Store{path: path, checkEvery: checkEvery}
	id, err := statID(path)
	if err != nil {
		return nil, err
	}
	recs, err := readFile(path)
	if err != nil {
		return nil, err
	}
	s.records, s.id, s.checked = recs, id, time.Now()
	return s, nil
}

// Path is the tenants file's path.
func (s *Store) Path() string { return s.path }

// Authenticate is the tenant whose API key is key, if any. It first
// reloads the file if it changed (looking at most once a second); if the
// new file is not valid, it logs why and keeps the last good tenants.
func (s *Store) Authenticate(key string) (Tenant, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.refreshLocked(false) // logged; the last good tenants stay
	if key == "" {
		return Tenant{}, false
	}
	h := []byte(hashKey(key))
	var found Tenant
	ok := 0
	// Compare with every key, in constant time, without stopping early.
	for _, r := range s.records {
		if subtle.ConstantTimeCompare(h, []byte(r.KeySHA256)) == 1 {
			found, ok = r.tenant(), 1
		}
		for _, k := range r.Keys {
			if subtle.ConstantTimeCompare(h, []byte(k.KeySHA256)) == 1 {
				found, ok = r.tenant(), 1
			}
		}
	}
	return found, ok == 1
}

// Reload reads the file again now if it changed, as Authenticate does at
// most once a second. A file that fails to load leaves the last good
// tenants in place, and is the error.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refreshLocked(true)
}

// List is the tenants, by name, as the file holds them now.
func (s *Store) List() ([]Tenant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.refreshLocked(true); err != nil {
		return nil, err
	}
	out := make([]Tenant, 0, len(s.records))
	for _, r := range s.records {
		out = append(out, r.tenant())
	}
	slices.SortFunc(out, func(a, b Tenant) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Add adds tenant name with quota q and returns its new API key: the only
// time the key exists outside the caller, since the file keeps its hash.
// A name already in the file is errdefs.ErrAlreadyExists.
func (s *Store) Add(name string, q Quota) (key string, err error) {
	if err := ValidateName(name); err != nil {
		return "", err
	}
	if err := q.Validate(); err != nil {
		return "", err
	}
	key = credential.NewAPIKey()
	err = s.update(func(recs []record) ([]record, error) {
		for _, r := range recs {
			if r.Name == name {
				return nil, fmt.Errorf("tenant %q: %w", name, errdefs.ErrAlreadyExists)
			}
		}
		return append(recs, record{
			Name:      name,
			KeySHA256: hashKey(key),
			KeySuffix: key[len(key)-4:],
			Quota:     q,
			Created:   time.Now().UTC().Truncate(time.Second),
		}), nil
	})
	if err != nil {
		return "", err
	}
	return key, nil
}

// SetQuota changes tenant name's quota to what set makes of it (an error
// of set changes nothing); the running servers apply it within a second.
// A name not in the file is errdefs.ErrNotFound.
func (s *Store) SetQuota(name string, set func(*Quota) error) (Quota, error) {
	var q Quota
	err := s.update(func(recs []record) ([]record, error) {
		i := slices.IndexFunc(recs, func(r record) bool { return r.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("tenant %q: %w", name, errdefs.ErrNotFound)
		}
		q = recs[i].Quota
		if err := set(&q); err != nil {
			return nil, err
		}
		if err := q.Validate(); err != nil {
			return nil, err
		}
		recs[i].Quota = q
		return recs, nil
	})
	return q, err
}

// Remove removes tenant name; its key stops working at once in this Store
// and within a second in others. A name not in the file is
// errdefs.ErrNotFound.
func (s *Store) Remove(name string) error {
	return s.update(func(recs []record) ([]record, error) {
		i := slices.IndexFunc(recs, func(r record) bool { return r.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("tenant %q: %w", name, errdefs.ErrNotFound)
		}
		return slices.Delete(recs, i, i+1), nil
	})
}

// refreshLocked reloads the file if it changed since the last look, which
// is skipped if it was less than checkEvery ago unless force is set. A
// file that fails to load leaves the last good tenants in place: the error
// is logged, and returned.
func (s *Store) refreshLocked(force bool) error {
	now := time.Now()
	if !force && now.Sub(s.checked) < s.checkEvery {
		return nil
	}
	s.checked = now
	id, err := statID(s.path)
	if err == nil && id == s.id {
		return nil
	}
	var recs []record
	if err == nil {
		recs, err = readFile(s.path)
	}
	if err != nil {
		if !s.failing || id != s.badID {
			slog.Error("tenants file not reloaded, keeping the last good tenants", "path", s.path, "error", err)
		}
		s.failing, s.badID = true, id
		return err
	}
	if !id.exists && s.id.exists {
		slog.Warn("tenants file removed: no tenant can authenticate", "path", s.path)
	}
	slog.Info("tenants file reloaded", "path", s.path, "tenants", len(recs))
	s.records, s.id, s.failing = recs, id, false
	return nil
}

// update applies change to the file's current content under the file
// lock, writes the result, and makes it this Store's content.
func (s *Store) update(change func([]record) ([]record, error)) error {
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("tenants file %s: %w", s.path, err)
	}
	unlock, err := lockFile(s.path + ".lock")
	if err != nil {
		return err
	}
	defer unlock()
	recs, err := readFile(s.path)
	if err != nil {
		return err
	}
	if recs, err = change(recs); err != nil {
		return err
	}
	if err := writeFile(s.path, recs); err != nil {
		return err
	}
	id, err := statID(s.path)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.records, s.id, s.checked, s.failing = recs, id, time.Now(), false
	s.mu.Unlock()
	return nil
}

// lockFile takes an exclusive flock on path, creating it. The lock file
// stays: removing it would let a writer lock a file another has replaced.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("tenants lock file: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("tenants lock file %s: flock: %w", path, err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// readFile parses and checks the tenants file at path; a missing file has
// no tenants.
func readFile(path string) ([]record, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tenants file %s: %w", path, err)
	}
	recs, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("%w: tenants file %s: %w", errdefs.ErrInvalidArgument, path, err)
	}
	return recs, nil
}

// parse decodes and checks a tenants file's content.
func parse(b []byte) ([]record, error) {
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var f file
	if err := dec.Decode(&f); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			line, col := position(b, syn.Offset)
			return nil, fmt.Errorf("line %d, column %d: %w", line, col, err)
		}
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			line, col := position(b, typ.Offset)
			field := typ.Field
			if field == "" {
				field = "the file"
			}
			return nil, fmt.Errorf("line %d, column %d: %s: want a JSON %s, not %s", line, col, field, jsonKind(typ.Type), typ.Value)
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, errors.New("the JSON ends early (truncated file?)")
		}
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("unexpected content after the JSON object")
	}
	names := map[string]bool{}
	hashes := map[string]bool{}
	for i, r := range f.Tenants {
		where := fmt.Sprintf("tenants[%d]", i)
		if r.Name != "" {
			where += fmt.Sprintf(" (%q)", r.Name)
		}
		if err := ValidateName(r.Name); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if names[r.Name] {
			return nil, fmt.Errorf("%s: name listed twice", where)
		}
		names[r.Name] = true
		all := []string{r.KeySHA256}
		if r.KeySHA256 == "" {
			if len(r.Keys) == 0 {
				return nil, fmt.Errorf("%s: no key: key_sha256 is empty and keys lists none", where)
			}
			all = nil
		}
		ids := map[string]bool{}
		for j, k := range r.Keys {
			if k.ID == "" || ids[k.ID] {
				return nil, fmt.Errorf("%s: keys[%d]: id %q missing or listed twice", where, j, k.ID)
			}
			ids[k.ID] = true
			all = append(all, k.KeySHA256)
		}
		for _, kh := range all {
			if h, err := hex.DecodeString(kh); err != nil || len(h) != sha256.Size || kh != strings.ToLower(kh) {
				return nil, fmt.Errorf("%s: key_sha256 %q: want 64 lower-case hex digits", where, kh)
			}
			if hashes[kh] {
				return nil, fmt.Errorf("%s: key_sha256 listed twice", where)
			}
			hashes[kh] = true
		}
		if err := r.Quota.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	return f.Tenants, nil
}

// jsonKind names the JSON value that decodes into t.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int64, reflect.Float64:
		return "number"
	}
	return t.String()
}

// position is the 1-based line and column of byte offset off in b.
func position(b []byte, off int64) (line, col int) {
	off = min(max(off, 0), int64(len(b)))
	before := b[:off]
	line = 1 + strings.Count(string(before), "\n")
	col = int(off) - strings.LastIndexByte(string(before), '\n')
	return line, col
}

// writeFile replaces the tenants file at path with recs: a new file, mode
// 0600, synced and renamed over the old one.
func writeFile(path string, recs []record) (err error) {
	if recs == nil {
		recs = []record{}
	}
	b, err := json.MarshalIndent(file{Tenants: recs}, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("tenants file %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("tenants file %s: %w", path, err)
	}
	if _, err = tmp.Write(b); err != nil {
		return fmt.Errorf("tenants file %s: %w", path, err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("tenants file %s: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("tenants file %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("tenants file %s: %w", path, err)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync() // the rename survives a crash
		d.Close()
	}
	return nil
}
