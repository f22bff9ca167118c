package mcp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// hostDir is the one host directory that file transfers may touch: its
// path, absolute with every symlink resolved, and a descriptor of it
// opened once. A host path of a tool call is resolved once, from that
// descriptor, into a descriptor of its own (openat2 with RESOLVE_BENEATH:
// no "..", absolute symlink or symlink leading out of the directory is
// followed, and no magic link of /proc); the copy then goes through that
// descriptor and resolves no host path again. So a directory swapped for
// a symlink to elsewhere between the check and the copy changes nothing:
// the copy has the directory, not its path. The zero hostDir means
// transfers are off.
type hostDir struct {
	path string
	fd   *os.File // O_PATH
}

// newHostDir resolves and opens dir (empty: transfers off). It must be an
// existing directory.
func newHostDir(dir string) (*hostDir, error) {
	if dir == "" {
		return &hostDir{}, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("host directory %q: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("host directory %q: %w: %w", dir, errdefs.ErrNotFound, err)
	}
	fd, err := unix.Open(real, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) {
		return nil, fmt.Errorf("host directory %q is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, fmt.Errorf("host directory %q: %w", dir, err)
	}
	return &hostDir{path: real, fd: os.NewFile(uintptr(fd), real)}, nil
}

// close closes the directory's descriptor.
func (d *hostDir) close() {
	if d.fd != nil {
		d.fd.Close()
	}
}

// openSource opens p, a host path to read (absolute, or relative to the
// directory), inside the directory, symlinks in it followed: an open
// regular file or directory, to copy from, and its path.
func (d *hostDir) openSource(p string) (*os.File, string, error) {
	rel, err := d.rel(p)
	if err != nil {
		return nil, "", err
	}
	f, err := d.open(rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if errors.Is(err, unix.ENOENT) {
		return nil, "", fmt.Errorf("host path %q does not exist: %w", p, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, "", d.openError(p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, "", err
	}
	if !fi.Mode().IsRegular() && !fi.IsDir() {
		f.Close()
		return nil, "", fmt.Errorf("host path %q is not a regular file or a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	return f, d.shown(f, rel), nil
}

// hostTarget is where a copy out of a sandbox goes: the open directory
// dir, under the source's own name if rename is "", else as rename. path
// is what the user is told.
type hostTarget struct {
	dir    *os.File // O_PATH
	rename string
	path   string
}

func (t hostTarget) close() { t.dir.Close() }

// openTarget resolves p, a host path to write (absolute, or relative to
// the directory), inside the directory, as cp does: an existing directory
// (symlinks in the directory followed) receives the copy under its own
// name; anything else is the copy's new name in its parent directory,
// which must exist. What is at that name is replaced, a symlink included,
// never written through; a symlink there that leads nowhere is refused,
// one that leads out of the directory too.
func (d *hostDir) openTarget(p string) (hostTarget, error) {
	rel, err := d.rel(p)
	if err != nil {
		return hostTarget{}, err
	}
	f, err := d.open(rel, unix.O_PATH)
	switch {
	case err == nil:
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return hostTarget{}, err
		}
		if fi.IsDir() {
			return hostTarget{dir: f, path: d.shown(f, rel)}, nil
		}
		f.Close()
	case !errors.Is(err, unix.ENOENT):
		return hostTarget{}, d.openError(p, err)
	}
	parent, base := filepath.Split(rel)
	if parent == "" {
		parent = "."
	}
	pf, err := d.open(parent, unix.O_PATH|unix.O_DIRECTORY)
	switch {
	case errors.Is(err, unix.ENOENT):
		return hostTarget{}, fmt.Errorf("host path %q: its directory does not exist: %w", p, errdefs.ErrNotFound)
	case errors.Is(err, unix.ENOTDIR):
		return hostTarget{}, fmt.Errorf("host path %q: its directory is not a directory: %w", p, errdefs.ErrInvalidArgument)
	case err != nil:
		return hostTarget{}, d.openError(p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(int(pf.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK && f == nil {
		// The full path did not resolve: the symlink leads nowhere.
		pf.Close()
		return hostTarget{}, fmt.Errorf("host path %q is a dangling symlink: %w", p, errdefs.ErrInvalidArgument)
	}
	return hostTarget{dir: pf, rename: base, path: filepath.Join(d.shown(pf, parent), base)}, nil
}

// open resolves rel from the directory's descriptor, never leaving it.
func (d *hostDir) open(rel string, flags int) (*os.File, error) {
	fd, err := unix.Openat2(int(d.fd.Fd()), rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.path, rel)), nil
}

// openError says why p could not be opened: a resolution that would
// leave the directory (EXDEV: "..", an absolute symlink or one leading
// out; ELOOP: a magic link, or too many symlinks) is refused as outside.
func (d *hostDir) openError(p string, err error) error {
	switch {
	case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP):
		return d.outside(p)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("host path %q: a directory in it is not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("host path %q: %w", p, err)
}

// shown is the path of the open file f, which rel led to, for the user:
// where it is now, as the kernel tells it.
func (d *hostDir) shown(f *os.File, rel string) string {
	if p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd()))); err == nil && filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(d.path, rel)
}

// rel makes p relative to the directory, cleaned. It refuses what no
// resolution can make safe.
func (d *hostDir) rel(p string) (string, error) {
	if d.fd == nil {
		return "", fmt.Errorf("host file transfer is off: the user can allow one directory with `hutch mcp --allow-host-dir DIR`: %w", errdefs.ErrPermissionDenied)
	}
	if p == "" || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("host path %q: want a path inside %s: %w", p, d.path, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(d.path, p)
	}
	rel, err := filepath.Rel(d.path, filepath.Clean(p))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", d.outside(p)
	}
	return rel, nil
}

func (d *hostDir) outside(p string) error {
	return fmt.Errorf("host path %q is outside the allowed directory %s (symlinks resolved; a symlink with an absolute target counts as outside): %w", p, d.path, errdefs.ErrPermissionDenied)
}
