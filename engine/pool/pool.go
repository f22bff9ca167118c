// Package pool holds the warm pools of a state root: each pool's
// definition, the index of its ready sandboxes, its locks, and when and
// where its filler runs. What a pool's sandboxes are, how one is booted,
// claimed or removed, is the engine's.
//
// A warm pool keeps sandboxes of one class booted and unused, so that a
// create that matches the class takes one instead of booting its own
// (docs/decisions/0023-warm-pool.md). A pool's definition is
// <root>/pools/NAME/pool.json; its members/ directory indexes its
// sandboxes, and its boot/ directory holds those its filler is booting.
// Locks: fill.lock is held by the one filler of a pool; lock guards the
// definition and the index against pool rm; fillers.lock is held shared
// by every filler, started or waiting to start, and exclusively by pool
// rm.
package pool

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// MaxSize bounds a pool's size.
const MaxSize = 256

// Def is a pool's definition, pool.json.
type Def struct {
	// Gen tells a pool from a later one of the same name.
	Gen      string   `json:"gen"`
	Name     string   `json:"name"`
	Size     int      `json:"size"`
	Image    string   `json:"image"`
	CPUs     float64  `json:"cpus,omitempty"`
	Memory   int64    `json:"memory,omitempty"`
	Pids     int64    `json:"pids,omitempty"`
	Disk     int64    `json:"disk,omitempty"`
	Network  string   `json:"network,omitempty"`
	Allow    []string `json:"allow,omitempty"`
	DNS      []string `json:"dns,omitempty"`
	Explicit []string `json:"explicit,omitempty"`
	// Docker: the pool's sandboxes are Docker sandboxes.
	Docker  bool      `json:"docker,omitempty"`
	Created time.Time `json:"created"`
}

// nameRE bounds no length: a bounded repetition costs every hutch process
// a large compile at start. ValidName checks the length.
var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// ValidName reports whether n can name a pool: 1-63 of [a-zA-Z0-9_.-],
// starting with a letter or digit.
func ValidName(n string) bool { return len(n) <= 63 && nameRE.MatchString(n) }

// Pools are the pools under one directory, <root>/pools.
type Pools struct{ dir string }

// At is the pools under dir.
func At(dir string) Pools { return Pools{dir: dir} }

// Dir is pool name's directory.
func (p Pools) Dir(name string) string { return filepath.Join(p.dir, name) }

func (p Pools) membersDir(name string) string { return filepath.Join(p.Dir(name), "members") }

func (p Pools) file(name, f string) string { return filepath.Join(p.Dir(name), f) }

// Create makes pool d.Name's directory, index, locks and definition. It
// fails with errdefs.ErrAlreadyExists if the pool exists, and leaves
// nothing on any failure.
func (p Pools) Create(d *Def) error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(p.Dir(d.Name), 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("pool %q exists: %w", d.Name, errdefs.ErrAlreadyExists)
		}
		return err
	}
	if err := os.Mkdir(p.membersDir(d.Name), 0o700); err != nil {
		os.RemoveAll(p.Dir(d.Name))
		return err
	}
	for _, f := range []string{"lock", "fill.lock", "fillers.lock"} {
		if err := os.WriteFile(p.file(d.Name, f), nil, 0o600); err != nil {
			os.RemoveAll(p.Dir(d.Name))
			return err
		}
	}
	if err := writeJSON(p.file(d.Name, "pool.json"), d); err != nil {
		os.RemoveAll(p.Dir(d.Name))
		return err
	}
	return nil
}

// Load reads pool name's definition: errdefs.ErrNotFound if there is
// none (the pool is gone, or being removed).
func (p Pools) Load(name string) (*Def, error) {
	b, err := os.ReadFile(p.file(name, "pool.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no such pool: %s: %w", name, errdefs.ErrNotFound)
		}
		return nil, err
	}
	var d Def
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("pool %s: corrupt definition: %w", name, err)
	}
	return &d, nil
}

// Defs reads every pool's definition, by name.
func (p Pools) Defs() ([]*Def, error) {
	ents, err := os.ReadDir(p.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Def
	for _, ent := range ents {
		d, err := p.Load(ent.Name())
		if err != nil {
			continue // being created or removed
		}
		out = append(out, d)
	}
	return out, nil
}

// Undefine removes pool name's definition, under its lock: from then on
// no filler adds a sandbox to it, and no claim finds it.
func (p Pools) Undefine(name string) error {
	unlock, err := p.Lock(name)
	if err != nil {
		return err
	}
	defer unlock()
	return os.Remove(p.file(name, "pool.json"))
}

// Remove removes what is left of pool name.
func (p Pools) Remove(name string) error { return os.RemoveAll(p.Dir(name)) }

// Members lists pool name's index, oldest first.
func (p Pools) Members(name string) []string {
	ents, err := os.ReadDir(p.membersDir(name))
	if err != nil {
		return nil
	}
	type member struct {
		id string
		t  time.Time
	}
	var ms []member
	for _, ent := range ents {
		if fi, err := ent.Info(); err == nil {
			ms = append(ms, member{ent.Name(), fi.ModTime()})
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].t.Before(ms[j].t) })
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.id
	}
	return out
}

// AddMember adds sandbox id to pool name's index.
func (p Pools) AddMember(name, id string) error {
	return os.WriteFile(filepath.Join(p.membersDir(name), id), nil, 0o600)
}

// DropMember removes sandbox id from pool name's index.
func (p Pools) DropMember(name, id string) { os.Remove(filepath.Join(p.membersDir(name), id)) }

// BootDir is the directory of sandbox id while pool name's filler boots
// it.
func (p Pools) BootDir(name, id string) string { return filepath.Join(p.Dir(name), "boot", id) }

// Booting lists the sandboxes in pool name's boot directory.
func (p Pools) Booting(name string) []string {
	ents, _ := os.ReadDir(filepath.Join(p.Dir(name), "boot"))
	out := make([]string, 0, len(ents))
	for _, ent := range ents {
		out = append(out, ent.Name())
	}
	return out
}

// Lock takes pool name's lock, which guards its definition and index.
func (p Pools) Lock(name string) (unlock func(), err error) {
	return lockFile(p.file(name, "lock"), unix.LOCK_EX)
}

// LockFill waits for pool name's fill.lock, held by its one filler.
func (p Pools) LockFill(name string) (unlock func(), err error) {
	return lockFile(p.file(name, "fill.lock"), unix.LOCK_EX)
}

// TryLockFill takes pool name's fill.lock without waiting; ok is false
// if another filler holds it.
func (p Pools) TryLockFill(name string) (unlock func(), ok bool, err error) {
	return tryLockFile(p.file(name, "fill.lock"))
}

// LockFillers waits for every filler of pool name, started or waiting to
// start, and keeps new ones from starting (pool rm).
func (p Pools) LockFillers(name string) (unlock func(), err error) {
	return lockFile(p.file(name, "fillers.lock"), unix.LOCK_EX)
}

// HoldFillers takes pool name's fillers.lock shared, waiting for a pool
// rm, for a filler of this process; ok is false if the pool is gone.
func (p Pools) HoldFillers(name string) (release func(), ok bool, err error) {
	f, err := os.Open(p.file(name, "fillers.lock"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil // removed
	}
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return nil, false, err
	}
	return func() { f.Close() }, true, nil
}

// shareFillers opens pool name's fillers.lock and takes it shared,
// without waiting: pool rm holds it exclusively while it removes the pool.
func (p Pools) shareFillers(name string) (*os.File, error) {
	f, err := os.Open(p.file(name, "fillers.lock"))
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// IsFillersLock reports whether held is pool name's fillers.lock (and not
// that of a pool removed since, or of one made again).
func (p Pools) IsFillersLock(name string, held *os.File) (bool, error) {
	hfi, err := held.Stat()
	if err != nil {
		return false, fmt.Errorf("pool %s: the filler's lock: %w", name, err)
	}
	fi, err := os.Stat(p.file(name, "fillers.lock"))
	return err == nil && os.SameFile(fi, hfi), nil
}

// SetError records err as pool name's filler's last failure, or with nil
// that its last attempt succeeded.
func (p Pools) SetError(name string, err error) {
	if err != nil {
		os.WriteFile(p.file(name, "error"), []byte(err.Error()), 0o600) //nolint:errcheck // best effort report
	} else {
		os.Remove(p.file(name, "error"))
	}
}

// Error is pool name's filler's last failure, or "".
func (p Pools) Error(name string) string {
	b, err := os.ReadFile(p.file(name, "error"))
	if err != nil {
		return ""
	}
	return string(b)
}

// writeJSON writes v to path atomically, owner-only.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// lockFile takes a flock (how) on path, made if missing.
func lockFile(path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// tryLockFile takes an exclusive flock on existing file path without
// waiting; ok is false if another holds it.
func tryLockFile(path string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return func() { f.Close() }, true, nil
}
