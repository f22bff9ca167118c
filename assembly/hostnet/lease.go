package hostnet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/errdefs"
)

// A lease is the file LeaseDir/INDEX, holding the ID it is leased to; the
// index gives the /30. LeaseDir/by-id/KEY, KEY a hash of the ID, is a
// symbolic link to INDEX: finding an ID's lease reads one link and one
// lease, not every lease (a read of all 500 leases took 1.8 ms, and every
// networked create, resume, update and removal looks its lease up). A
// link is trusted only when the lease it names holds its ID.
//
// Leases made without links (by an earlier hutch, their sandboxes still
// running) are linked once, by the first lookup that finds no
// LeaseDir/by-id/.complete.

func byIDDir() string { return filepath.Join(LeaseDir, "by-id") }

func byIDPath(id string) string { return filepath.Join(byIDDir(), idHash(id)[:32]) }

func leasePath(i int) string { return filepath.Join(LeaseDir, strconv.Itoa(i)) }

// holds reports whether lease i is id's.
func holds(i int, id string) bool {
	b, err := os.ReadFile(leasePath(i))
	return err == nil && string(b) == id
}

// leaseOf finds the lease index id holds.
func leaseOf(id string) (int, bool) {
	linkUnlinked()
	t, err := os.Readlink(byIDPath(id))
	if err != nil {
		return 0, false
	}
	i, err := strconv.Atoi(t)
	if err != nil || !holds(i, id) {
		return 0, false
	}
	return i, true
}

// linkUnlinked links every lease, once per LeaseDir: leases made since
// are linked by allocate.
func linkUnlinked() {
	complete := filepath.Join(byIDDir(), ".complete")
	if _, err := os.Stat(complete); err == nil {
		return
	}
	if os.MkdirAll(byIDDir(), 0o700) != nil {
		return
	}
	ents, _ := os.ReadDir(LeaseDir)
	for _, e := range ents {
		i, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(leasePath(i)); err == nil && len(b) > 0 {
			link(string(b), i) //nolint:errcheck // its lookup then fails, as it did
		}
	}
	if f, err := os.OpenFile(complete, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		f.Close()
	}
}

// link points id's link at lease i, in place of where it pointed.
func link(id string, i int) error {
	p := byIDPath(id)
	tmp := fmt.Sprintf("%s.%d.tmp", p, os.Getpid())
	os.Remove(tmp)
	if err := os.Symlink(strconv.Itoa(i), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// allocate takes the lowest free /30 of the pool for id, or the one id
// already holds (a paused sandbox keeps its address for its resume).
func allocate(id string) (int, error) {
	if err := os.MkdirAll(byIDDir(), 0o700); err != nil {
		return 0, err
	}
	if i, ok := leaseOf(id); ok {
		return i, nil
	}
	slots := 1 << (32 - Pool.Bits() - 2)
	for i := 1; i < slots; i++ {
		f, err := os.OpenFile(leasePath(i), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		_, err = f.WriteString(id)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = link(id, i)
		}
		if err != nil {
			os.Remove(leasePath(i))
			return 0, err
		}
		return i, nil
	}
	return 0, fmt.Errorf("address pool %s exhausted: %w", Pool, errdefs.ErrUnavailable)
}

// release frees the lease held by id, if any, and its link.
func release(id string) error {
	var err error
	if i, ok := leaseOf(id); ok {
		err = os.Remove(leasePath(i))
	}
	if rerr := os.Remove(byIDPath(id)); err == nil && rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = rerr
	}
	return err
}
