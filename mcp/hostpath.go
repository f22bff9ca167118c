package mcp

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
)

// hostDir is the one host directory that file transfers may touch. Its
// path is absolute with every symlink resolved; empty means transfers are
// off.
type hostDir string

// newHostDir resolves dir (empty: transfers off). It must be an existing
// directory.
func newHostDir(dir string) (hostDir, error) {
	if dir == "" {
		return "", nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("host directory %q: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("host directory %q: %w: %w", dir, errdefs.ErrNotFound, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("host directory %q: %w", dir, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("host directory %q is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return hostDir(real), nil
}

// source resolves p, a host path to read (absolute, or relative to the
// directory), to an existing path inside the directory, symlinks resolved.
func (d hostDir) source(p string) (string, error) {
	full, err := d.join(p)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(full)
	if err != nil {
		if os.IsNotExist(err) {
			return "", fmt.Errorf("host path %q does not exist: %w", p, errdefs.ErrNotFound)
		}
		return "", fmt.Errorf("host path %q: %w", p, err)
	}
	if !d.contains(real) {
		return "", d.outside(p)
	}
	return real, nil
}

// target resolves p, a host path to write (absolute, or relative to the
// directory), to a path inside the directory: its parent must exist; it
// may not. An existing p is resolved whole, symlinks included.
func (d hostDir) target(p string) (string, error) {
	full, err := d.join(p)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(full); err == nil {
		if !d.contains(real) {
			return "", d.outside(p)
		}
		return real, nil
	} else if _, lerr := os.Lstat(full); lerr == nil {
		// A symlink whose target does not exist: it would be written
		// through.
		return "", fmt.Errorf("host path %q is a dangling symlink: %w", p, errdefs.ErrInvalidArgument)
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(full))
	if err != nil {
		if os.IsNotExist(err) {
			return "", fmt.Errorf("host path %q: its directory does not exist: %w", p, errdefs.ErrNotFound)
		}
		return "", fmt.Errorf("host path %q: %w", p, err)
	}
	real := filepath.Join(parent, filepath.Base(full))
	if !d.contains(real) {
		return "", d.outside(p)
	}
	return real, nil
}

// join makes p absolute under the directory and cleans it. It refuses
// what no resolution can make safe.
func (d hostDir) join(p string) (string, error) {
	if d == "" {
		return "", fmt.Errorf("host file transfer is off: the user can allow one directory with `hutch mcp --allow-host-dir DIR`: %w", errdefs.ErrPermissionDenied)
	}
	if p == "" || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("host path %q: want a path inside %s: %w", p, d, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(string(d), p)
	}
	p = filepath.Clean(p)
	if !d.contains(p) {
		return "", d.outside(p)
	}
	return p, nil
}

// contains says whether the clean absolute path p is the directory or
// below it.
func (d hostDir) contains(p string) bool {
	rel, err := filepath.Rel(string(d), p)
	if err != nil {
		return false
	}
	return rel == "." || (rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel))
}

func (d hostDir) outside(p string) error {
	return fmt.Errorf("host path %q is outside the allowed directory %s (symlinks resolved): %w", p, d, errdefs.ErrPermissionDenied)
}
