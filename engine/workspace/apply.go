package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// Apply copies d's changes to its workspace's host directory: additions,
// changes (content, mode, symlink targets) and deletions.
//
// It never follows a symlink, in the sandbox's layer or in the host
// directory: a symlink the sandbox made is copied as a symlink, and a
// path whose way goes through one is refused. A file is replaced
// whole (a new file renamed over the old), so the host never sees a
// half-written file. New files take the owner of their host directory,
// changed ones keep theirs; set-user-ID and set-group-ID bits are
// dropped. Devices, FIFOs and sockets are not copied.
func Apply(ctx context.Context, d Diff) error {
	if len(d.Changes) == 0 {
		return nil
	}
	upper, err := openLayer(d.ws.upper())
	if err != nil {
		return err
	}
	defer upper.close()
	host, err := openLayer(d.Source)
	if err != nil {
		return err
	}
	defer host.close()
	a := &applier{upper: upper, host: host}
	// Deletions first, deepest first; then the rest, parents first.
	for i := len(d.Changes) - 1; i >= 0; i-- {
		if c := d.Changes[i]; c.Kind == ChangeDeleted {
			if err := a.remove(c.rel); err != nil {
				return fmt.Errorf("%s: %w", c.Path, err)
			}
		}
	}
	for _, c := range d.Changes {
		if c.Kind == ChangeDeleted {
			continue
		}
		if c.Type == "other" {
			log.G(ctx).WithField("path", c.Path).Warn("not applied: not a file, directory or symlink")
			continue
		}
		if err := a.put(c); err != nil {
			return fmt.Errorf("%s: %w", c.Path, err)
		}
	}
	return nil
}

type applier struct{ upper, host *layer }

// parent opens the host directory holding rel, making missing
// directories on the way as the upper layer has them.
func (a *applier) parent(rel string) (*os.File, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	d, err := a.host.open(dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) && dir != "" {
		if err := a.put(Change{rel: dir, Type: "dir", Mode: 0o755}); err != nil {
			return nil, "", err
		}
		d, err = a.host.open(dir, unix.O_RDONLY|unix.O_DIRECTORY)
	}
	if err != nil {
		return nil, "", err
	}
	return d, base, nil
}

// remove deletes host rel and, for a directory, what it holds.
func (a *applier) remove(rel string) error {
	d, base, err := a.parentNoCreate(rel)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone already, with a deleted parent
		}
		return err
	}
	defer d.Close()
	return removeAt(int(d.Fd()), base)
}

func (a *applier) parentNoCreate(rel string) (*os.File, string, error) {
	dir, base := path.Split(rel)
	d, err := a.host.open(strings.TrimSuffix(dir, "/"), unix.O_RDONLY|unix.O_DIRECTORY)
	return d, base, err
}

// removeAt removes name in directory dirfd, never following a symlink.
func removeAt(dirfd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dirfd, name, 0)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// put makes host c.rel what the upper layer has.
func (a *applier) put(c Change) error {
	d, base, err := a.parent(c.rel)
	if err != nil {
		return err
	}
	defer d.Close()
	dfd := int(d.Fd())
	var old unix.Stat_t
	exists := unix.Fstatat(dfd, base, &old, unix.AT_SYMLINK_NOFOLLOW) == nil
	var dirSt unix.Stat_t
	if err := unix.Fstat(dfd, &dirSt); err != nil {
		return err
	}
	uid, gid := int(dirSt.Uid), int(dirSt.Gid)
	if exists && old.Mode&unix.S_IFMT == unix.S_IFMT&uint32(typeBits(c.Type)) {
		uid, gid = int(old.Uid), int(old.Gid)
	}
	mode := uint32(c.Mode.Perm())
	if c.Mode&os.ModeSticky != 0 {
		mode |= unix.S_ISVTX
	}
	switch c.Type {
	case "dir":
		if exists && old.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := removeAt(dfd, base); err != nil {
				return err
			}
			exists = false
		}
		if !exists {
			if err := unix.Mkdirat(dfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
				return err
			}
			if err := unix.Fchownat(dfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
		return unix.Fchmodat(dfd, base, mode, 0)
	case "symlink":
		link, err := a.upper.readlink(c.rel)
		if err != nil {
			return err
		}
		return a.replace(dfd, base, exists && old.Mode&unix.S_IFMT == unix.S_IFDIR, func(tmp string) error {
			if err := unix.Symlinkat(link, dfd, tmp); err != nil {
				return err
			}
			return unix.Fchownat(dfd, tmp, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		})
	case "file":
		src, err := a.upper.open(c.rel, unix.O_RDONLY)
		if err != nil {
			return err
		}
		defer src.Close()
		return a.replace(dfd, base, exists && old.Mode&unix.S_IFMT == unix.S_IFDIR, func(tmp string) error {
			fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
			if err != nil {
				return err
			}
			f := os.NewFile(uintptr(fd), tmp)
			defer f.Close()
			if _, err := io.Copy(f, src); err != nil {
				return err
			}
			if err := f.Chown(uid, gid); err != nil {
				return err
			}
			if err := unix.Fchmod(fd, mode); err != nil {
				return err
			}
			return f.Sync()
		})
	}
	return nil
}

// replace makes a new entry with make under a temporary name in dirfd
// and renames it over name (removing a directory there first).
func (a *applier) replace(dirfd int, name string, isDir bool, make func(tmp string) error) error {
	if isDir {
		if err := removeAt(dirfd, name); err != nil {
			return err
		}
	}
	var tmp string
	for i := 0; ; i++ {
		tmp = ".hutch-apply-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(i) + "-" + name
		if len(tmp) > 255 {
			tmp = tmp[:255]
		}
		var st unix.Stat_t
		if unix.Fstatat(dirfd, tmp, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			break
		}
	}
	if err := make(tmp); err != nil {
		unix.Unlinkat(dirfd, tmp, 0) //nolint:errcheck // best effort
		return err
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
		unix.Unlinkat(dirfd, tmp, 0) //nolint:errcheck // best effort
		return err
	}
	return nil
}

func typeBits(t string) int {
	switch t {
	case "file":
		return unix.S_IFREG
	case "dir":
		return unix.S_IFDIR
	case "symlink":
		return unix.S_IFLNK
	}
	return 0
}
