package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Change kinds of a workspace.
const (
	ChangeAdded    = "A"
	ChangeModified = "M"
	ChangeDeleted  = "D"
)

// Change is one path of an :overlay workspace that differs from its host
// directory. Ownership and timestamps are not compared.
type Change struct {
	// Path is the path in the sandbox.
	Path string `json:"path"`
	// Kind is ChangeAdded, ChangeModified or ChangeDeleted.
	Kind string `json:"kind"`
	// Type is the sandbox's file type ("file", "dir", "symlink" or
	// "other": a device, FIFO or socket, which Apply skips); for a
	// deletion, the host's.
	Type string `json:"type"`
	// Mode is the sandbox's permission bits; OldMode the host's.
	Mode    fs.FileMode `json:"mode,omitempty"`
	OldMode fs.FileMode `json:"oldMode,omitempty"`
	// Link is a symlink's target in the sandbox.
	Link string `json:"link,omitempty"`

	rel string // relative to the workspace root
}

// Diff is the changes of one workspace.
type Diff struct {
	// Source is the host directory, Target where the sandbox sees it.
	Source  string   `json:"source"`
	Target  string   `json:"target"`
	Changes []Change `json:"changes"`

	ws *Workspace
}

// Diffs returns the changes of the workspaces of the sandbox whose
// directory is sandbox (name, its short ID, is for errors) against their
// host directories, by path; with p (a path in the sandbox), only the
// changes at or below it. It reads the workspaces' layers on the host, so
// it works whether the sandbox runs, is paused or stopped.
func Diffs(sandbox, name, p string) ([]Diff, error) {
	if p != "" {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("diff path %q: not an absolute path in the sandbox: %w", p, errdefs.ErrInvalidArgument)
		}
		p = filepath.Clean(p)
	}
	ws, err := List(sandbox)
	if err != nil {
		return nil, err
	}
	if len(ws) == 0 {
		return nil, fmt.Errorf("sandbox %s has no overlay workspace (-v DIR:PATH:overlay): %w", name, errdefs.ErrFailedPrecondition)
	}
	var out []Diff
	for _, w := range ws {
		if p != "" && !within(w.Target, p) && !within(p, w.Target) {
			continue
		}
		d, err := diffWorkspace(w)
		if err != nil {
			return nil, fmt.Errorf("diff %s: %w", w.Target, err)
		}
		if p != "" {
			kept := d.Changes[:0]
			for _, c := range d.Changes {
				if within(c.Path, p) {
					kept = append(kept, c)
				}
			}
			d.Changes = kept
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sandbox %s has no overlay workspace at %s: %w", name, p, errdefs.ErrNotFound)
	}
	return out, nil
}

// within reports whether p is dir or lies below it (both clean).
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// layer is a directory tree read without following any symlink in it:
// every path is resolved beneath the root, component by component.
type layer struct{ root *os.File }

func openLayer(dir string) (*layer, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &layer{root: os.NewFile(uintptr(fd), dir)}, nil
}

func (l *layer) close() { l.root.Close() }

var noSymlinks = uint64(unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS)

// open opens rel (no symlink anywhere on its way, itself included).
func (l *layer) open(rel string, flags int) (*os.File, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(int(l.root.Fd()), rel, &unix.OpenHow{
		Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Resolve: noSymlinks,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// lstat stats rel without following it; a symlink on the way to it
// counts as rel not existing.
func (l *layer) lstat(rel string) (*unix.Stat_t, error) {
	dir, base := path.Split(rel)
	d, err := l.open(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, os.ErrNotExist
		}
		return nil, err
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(d.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: rel, Err: err}
	}
	return &st, nil
}

// names lists directory rel, sorted.
func (l *layer) names(rel string) ([]string, error) {
	d, err := l.open(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	ns, err := d.Readdirnames(-1)
	sort.Strings(ns)
	return ns, err
}

func (l *layer) readlink(rel string) (string, error) {
	dir, base := path.Split(rel)
	d, err := l.open(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return "", err
	}
	defer d.Close()
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(int(d.Fd()), base, buf)
	if err != nil {
		return "", &os.PathError{Op: "readlink", Path: rel, Err: err}
	}
	return string(buf[:n]), nil
}

// opaque reports whether upper directory rel hides the lower one whole
// (it was removed and made again in the sandbox): overlayfs marked it
// with xattr (Workspace.opaqueXattr).
func (l *layer) opaque(rel, xattr string) bool {
	d, err := l.open(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return false
	}
	defer d.Close()
	buf := make([]byte, 8)
	n, err := unix.Fgetxattr(int(d.Fd()), xattr, buf)
	return err == nil && string(buf[:n]) == "y"
}

func fileType(st *unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func perm(st *unix.Stat_t) fs.FileMode {
	m := fs.FileMode(st.Mode & 0o777)
	if st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// differ walks a workspace's upper layer against its lower one.
type differ struct {
	w            *Workspace
	upper, lower *layer
	out          []Change
}

func diffWorkspace(w *Workspace) (Diff, error) {
	d := Diff{Source: w.Source, Target: w.Target, ws: w, Changes: []Change{}}
	upper, err := openLayer(w.upper())
	if err != nil {
		return d, err
	}
	defer upper.close()
	lower, err := openLayer(w.Source)
	if err != nil {
		return d, err
	}
	defer lower.close()
	df := &differ{w: w, upper: upper, lower: lower}
	if err := df.dir("", true); err != nil {
		return d, err
	}
	// By path; a path removed and made again shows its deletion first.
	sort.SliceStable(df.out, func(i, j int) bool {
		a, b := df.out[i], df.out[j]
		if a.rel != b.rel {
			return a.rel < b.rel
		}
		return a.Kind == ChangeDeleted && b.Kind != ChangeDeleted
	})
	d.Changes = append(d.Changes, df.out...)
	return d, nil
}

func (df *differ) add(rel, kind, typ string, mode, old fs.FileMode, link string) {
	df.out = append(df.out, Change{
		Path: path.Join(df.w.Target, rel), Kind: kind, Type: typ, Mode: mode, OldMode: old, Link: link, rel: rel,
	})
}

// dir compares upper directory rel with the lower; merged says the lower
// directory shows through it (it exists and the upper is not opaque).
func (df *differ) dir(rel string, merged bool) error {
	names, err := df.upper.names(rel)
	if err != nil {
		return err
	}
	if merged && rel != "" && df.upper.opaque(rel, df.w.opaqueXattr()) {
		merged = false
		// Removed and made again: what the host has there goes, what
		// the sandbox has is new (both are listed).
		if err := df.deletedBelow(rel); err != nil {
			return err
		}
	}
	for _, name := range names {
		r := path.Join(rel, name)
		ust, err := df.upper.lstat(r)
		if errors.Is(err, os.ErrNotExist) {
			continue // gone since listed: the sandbox runs
		}
		if err != nil {
			return err
		}
		var lst *unix.Stat_t
		if merged {
			if lst, err = df.lower.lstat(r); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOENT) {
				return err
			}
			if err != nil {
				lst = nil
			}
		}
		if isWhiteout(ust) {
			if lst != nil {
				if err := df.deleted(r, lst); err != nil {
					return err
				}
			}
			continue
		}
		typ := fileType(ust)
		if lst != nil && fileType(lst) != typ && (typ == "dir" || fileType(lst) == "dir") {
			// A directory replaced a file, or the reverse: the old goes,
			// the new comes.
			if err := df.deleted(r, lst); err != nil {
				return err
			}
			lst = nil
		}
		switch {
		case lst == nil:
			link := ""
			if typ == "symlink" {
				if link, err = df.upper.readlink(r); err != nil {
					return err
				}
			}
			df.add(r, ChangeAdded, typ, perm(ust), 0, link)
			if typ == "dir" {
				if err := df.dir(r, false); err != nil {
					return err
				}
			}
		case typ == "dir":
			if perm(ust) != perm(lst) {
				df.add(r, ChangeModified, typ, perm(ust), perm(lst), "")
			}
			if err := df.dir(r, true); err != nil {
				return err
			}
		default:
			same, link, err := df.same(r, typ, ust, lst)
			if err != nil {
				return err
			}
			if !same {
				df.add(r, ChangeModified, typ, perm(ust), perm(lst), link)
			}
		}
	}
	return nil
}

// same compares non-directory rel in both layers: type, mode, and content
// or link target.
func (df *differ) same(rel, typ string, ust, lst *unix.Stat_t) (bool, string, error) {
	switch {
	case typ == "symlink":
		ul, err := df.upper.readlink(rel)
		if err != nil {
			return false, "", err
		}
		if fileType(lst) != "symlink" {
			return false, ul, nil
		}
		ll, err := df.lower.readlink(rel)
		return err == nil && ul == ll, ul, err
	case typ != fileType(lst) || perm(ust) != perm(lst):
		return false, "", nil
	case typ == "file":
		if ust.Size != lst.Size {
			return false, "", nil
		}
		eq, err := df.sameContent(rel)
		return eq, "", err
	default:
		return ust.Rdev == lst.Rdev, "", nil
	}
}

func (df *differ) sameContent(rel string) (bool, error) {
	u, err := df.upper.open(rel, unix.O_RDONLY)
	if err != nil {
		return false, err
	}
	defer u.Close()
	l, err := df.lower.open(rel, unix.O_RDONLY)
	if err != nil {
		return false, err
	}
	defer l.Close()
	ub, lb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		un, uerr := io.ReadFull(u, ub)
		ln, lerr := io.ReadFull(l, lb)
		if un != ln || !bytes.Equal(ub[:un], lb[:ln]) {
			return false, nil
		}
		if uerr != nil || lerr != nil {
			if (uerr == io.EOF || uerr == io.ErrUnexpectedEOF) && (lerr == io.EOF || lerr == io.ErrUnexpectedEOF) {
				return true, nil
			}
			return false, errors.Join(uerr, lerr)
		}
	}
}

// deleted records lower rel as deleted, and what is below it.
func (df *differ) deleted(rel string, lst *unix.Stat_t) error {
	df.add(rel, ChangeDeleted, fileType(lst), 0, perm(lst), "")
	if fileType(lst) != "dir" {
		return nil
	}
	return df.deletedBelow(rel)
}

// deletedBelow records what lower directory rel holds as deleted.
func (df *differ) deletedBelow(rel string) error {
	st, err := df.lower.lstat(rel)
	if err != nil || fileType(st) != "dir" {
		return nil // nothing shows through from there
	}
	names, err := df.lower.names(rel)
	if err != nil {
		return err
	}
	for _, name := range names {
		r := path.Join(rel, name)
		lst, err := df.lower.lstat(r)
		if err != nil {
			continue
		}
		if err := df.deleted(r, lst); err != nil {
			return err
		}
	}
	return nil
}
