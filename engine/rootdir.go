package engine

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// stateDirMode is the mode of the state root and of the directories hutch
// makes in it: nothing in them is for other users, whatever the umask.
const stateDirMode = 0o700

// makeStateDirs creates the state root and its top directories, owner-only
// whatever the umask, after checking that the root is safe to use:
// checkRootDir.
func makeStateDirs(root string, dirs ...string) error {
	// Nothing is made below a directory another user controls.
	existing := filepath.Dir(root)
	for existing != "/" {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		existing = filepath.Dir(existing)
	}
	if err := checkAncestors(root, existing); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		return fmt.Errorf("state root: %w", err)
	}
	if err := os.Mkdir(root, stateDirMode); err != nil && !os.IsExist(err) {
		return fmt.Errorf("state root: %w", err)
	}
	if err := checkRootDir(root); err != nil {
		return err
	}
	for _, d := range append([]string{root}, dirs...) {
		if err := os.Mkdir(d, stateDirMode); err != nil && !os.IsExist(err) {
			return fmt.Errorf("state root: %w", err)
		}
		if err := ownerOnly(d); err != nil {
			return fmt.Errorf("state root: %w", err)
		}
	}
	return nil
}

// StateDir makes the directory name under the state root root
// (DefaultRoot if empty), owner-only, after the checks Open makes of the
// root, and returns its path: the state of a front end, which may run
// without opening an engine (`hutch mcp --server`).
func StateDir(root, name string) (string, error) {
	if root == "" {
		root = DefaultRoot()
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	d := filepath.Join(root, name)
	if err := makeStateDirs(root, d); err != nil {
		return "", err
	}
	return d, nil
}

// ownerOnly makes directory p mode 0700 unless it is already; it must be a
// directory (not a symlink) owned by the caller.
func ownerOnly(p string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory: %w", p, errdefs.ErrFailedPrecondition)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by uid %d who runs hutch: %w", p, st.Uid, os.Geteuid(), errdefs.ErrPermissionDenied)
	}
	if st.Mode&0o7777 != stateDirMode {
		return os.Chmod(p, stateDirMode)
	}
	return nil
}

// checkRootDir refuses a state root that another user controls: the root
// must be a directory owned by the caller, and every directory above it
// owned by the caller or root and writable by no one else unless sticky
// (like /tmp). Otherwise another user who made the directory first (e.g.
// /tmp/hutch-<uid>) could read or swap what hutch keeps there.
func checkRootDir(root string) error {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return fmt.Errorf("state root %s: %w", root, err)
	}
	uid := uint32(os.Geteuid())
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("state root %s is not a directory (a symlink?); refusing to use it: %w", root, errdefs.ErrPermissionDenied)
	case st.Uid != uid:
		return fmt.Errorf("state root %s is owned by uid %d, not by uid %d who runs hutch; refusing to use it (remove it or choose another with HUTCH_ROOT): %w", root, st.Uid, uid, errdefs.ErrPermissionDenied)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("state root %s is writable by other users (mode %04o); refusing to use it (chmod 700 it): %w", root, st.Mode&0o7777, errdefs.ErrPermissionDenied)
	}
	return checkAncestors(root, filepath.Dir(root))
}

// checkAncestors checks dir and every directory above it as checkRootDir
// does for those above the root.
func checkAncestors(root, dir string) error {
	uid := uint32(os.Geteuid())
	var st unix.Stat_t
	for d := dir; ; d = filepath.Dir(d) {
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("state root: %s: %w", d, err)
		}
		if st.Uid != uid && st.Uid != 0 {
			return fmt.Errorf("state root %s: directory %s above it is owned by uid %d, another user; refusing to use it: %w", root, d, st.Uid, errdefs.ErrPermissionDenied)
		}
		if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return fmt.Errorf("state root %s: directory %s above it is writable by other users (mode %04o); refusing to use it: %w", root, d, st.Mode&0o7777, errdefs.ErrPermissionDenied)
		}
		if d == "/" {
			return nil
		}
	}
}
