// Package archive is the tar stream of `hutch cp`. It runs on both sides
// of the copy: inside the sandbox (as the agent's tar-out and tar-in) and
// on the host (hutch itself), so that one extractor, written to distrust
// its archive, handles both.
package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnsafePath is an archive entry or a destination that would lead
// outside the destination directory.
var ErrUnsafePath = errors.New("unsafe path")

// ArchiveName is the name a copy's source gets at the top of its archive:
// its base name, or "." for "DIR/." (the directory's contents).
func ArchiveName(src string) string {
	if src == "." || strings.HasSuffix(src, "/.") {
		return "."
	}
	return filepath.Base(filepath.Clean(src))
}

// WriteTar writes src as a tar stream to w, named name at the top. It
// never follows a symlink, src included: symlinks are archived as
// symlinks. Below src, every file is opened relative to its directory's
// descriptor (writeChild), so a directory swapped for a symlink while the
// stream is written cannot lead the copy out of src. Regular files are
// streamed, never held in memory.
func WriteTar(w io.Writer, src, name string) error {
	tw := tar.NewWriter(w)
	if err := writeChild(tw, unix.AT_FDCWD, filepath.Clean(src), name); err != nil {
		return err
	}
	return tw.Close()
}

// WriteTarAt is WriteTar of a file or directory already open for reading:
// src itself is archived, whatever path led to it, and nothing is
// resolved by path but names relative to src's descriptor.
func WriteTarAt(w io.Writer, src *os.File, name string) error {
	tw := tar.NewWriter(w)
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return &fs.PathError{Op: "stat", Path: src.Name(), Err: err}
	}
	if err := writeOpen(tw, src, &st, name); err != nil {
		return err
	}
	return tw.Close()
}

// writeChild archives base, a name relative to the directory dirfd (or a
// path, with unix.AT_FDCWD), as name. A symlink, the last component
// included, is archived as a symlink; a regular file or directory is
// opened with O_NOFOLLOW and archived from that descriptor.
func writeChild(tw *tar.Writer, dirfd int, base, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "lstat", Path: base, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		link, err := readlinkat(dirfd, base)
		if err != nil {
			return &fs.PathError{Op: "readlink", Path: base, Err: err}
		}
		return tw.WriteHeader(header(&st, name, link))
	case unix.S_IFIFO:
		return tw.WriteHeader(header(&st, name, ""))
	case unix.S_IFREG, unix.S_IFDIR:
	default:
		return nil // devices and sockets do not copy
	}
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Openat(dirfd, base, flags, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: base, Err: err}
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	// What was opened decides: it may not be what was first looked at.
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: base, Err: err}
	}
	return writeOpen(tw, f, &st, name)
}

// writeOpen archives the open file f, whose status is st, as name: a
// regular file with its content, a directory with every entry below it.
func writeOpen(tw *tar.Writer, f *os.File, st *unix.Stat_t, name string) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		hdr := header(st, name, "")
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if n, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("%s: read %d of %d bytes (did it change while being copied?): %w", f.Name(), n, hdr.Size, err)
		}
		return nil
	case unix.S_IFDIR:
	case unix.S_IFIFO:
		return tw.WriteHeader(header(st, name, ""))
	default:
		return nil
	}
	if err := tw.WriteHeader(header(st, name, "")); err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: f.Name(), Err: err}
	}
	slices.Sort(names)
	for _, n := range names {
		// Not path.Join: a top name "." must stay in every name, as
		// the component that Extract's Rename replaces.
		if err := writeChild(tw, int(f.Fd()), n, name+"/"+n); err != nil {
			if pe, ok := err.(*fs.PathError); ok {
				pe.Path = filepath.Join(f.Name(), pe.Path)
			}
			return err
		}
	}
	return nil
}

// header is the tar header of a file of status st archived as name.
// Owners are not copied: a copy belongs to whoever receives it.
func header(st *unix.Stat_t, name, link string) *tar.Header {
	hdr := &tar.Header{
		Name:     name,
		Linkname: link,
		Mode:     int64(st.Mode & 0o7777),
		ModTime:  time.Unix(st.Mtim.Unix()),
		Format:   tar.FormatPAX, // exact mtimes, long names
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		if name != "." {
			hdr.Name += "/"
		}
	case unix.S_IFLNK:
		hdr.Typeflag = tar.TypeSymlink
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	}
	return hdr
}

// readlinkat is readlink of name relative to dirfd.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// CopyTarget resolves a copy's destination as cp does: an existing
// directory receives the source under its own name (rename ""); anything
// else is the new name of the source (rename = its base) in its parent
// directory, which must exist.
func CopyTarget(dst string) (dir, rename string, err error) {
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return dst, "", nil
	}
	dir, rename = filepath.Split(filepath.Clean(dst))
	if dir == "" {
		dir = "."
	}
	if rename == "." || rename == ".." || rename == "/" {
		return "", "", fmt.Errorf("destination %q: %w", dst, ErrUnsafePath)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return "", "", err
	}
	if !fi.IsDir() {
		return "", "", &fs.PathError{Op: "copy into", Path: dir, Err: unix.ENOTDIR}
	}
	return dir, rename, nil
}

// ExtractOptions tune Extract.
type ExtractOptions struct {
	// Rename replaces the first component of every entry's name.
	Rename string
	// NoSetID clears setuid and setgid bits: a copy out of a sandbox
	// must not carry them onto the host.
	NoSetID bool
	// Check, if set, sees every entry's header before anything of it is
	// written; an error stops the extraction.
	Check func(*tar.Header) error
}

// Extract writes the tar stream r into dir. It trusts nothing in the
// archive: a name that is absolute or has a ".." component is refused, and
// no symlink below dir is ever followed, neither one the archive made nor
// one that was there, so no entry can be written outside dir. A directory
// entry meeting an existing non-directory is refused rather than replaced;
// a file or symlink entry replaces what is at its name (a symlink there is
// removed, not written through). Modes and modification times are kept;
// owners are not (files belong to the caller).
func Extract(r io.Reader, dir string, o ExtractOptions) error {
	rootFd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	root := os.NewFile(uintptr(rootFd), dir)
	defer root.Close()
	return ExtractAt(r, root, o)
}

// ExtractAt is Extract into the directory open as dir (O_PATH will do):
// every entry is made relative to that descriptor, whatever becomes of
// the path that led to it.
func ExtractAt(r io.Reader, dir *os.File, o ExtractOptions) error {
	x := &extractor{root: int(dir.Fd()), opts: o, dir: dir.Name()}
	defer x.closeParent()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if o.Check != nil {
			if err := o.Check(hdr); err != nil {
				return err
			}
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
	// Directories last, deepest first: their entries changed their
	// mtimes, and a read-only mode must not stop the entries' creation.
	for i := len(x.dirs) - 1; i >= 0; i-- {
		if err := x.setMeta(x.dirs[i].name, x.dirs[i].hdr); err != nil {
			return err
		}
	}
	return nil
}

type extractor struct {
	root int
	dir  string
	opts ExtractOptions
	dirs []dirMeta

	parentName string // the directory parentFd is open on
	parentFd   int
}

type dirMeta struct {
	name string
	hdr  *tar.Header
}

// cleanName checks and normalizes an entry's name, relative to the root.
func (x *extractor) cleanName(name string) (string, error) {
	if path.IsAbs(name) {
		return "", fmt.Errorf("archive entry %q is absolute: %w", name, ErrUnsafePath)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("archive entry %q has a .. component: %w", name, ErrUnsafePath)
		}
	}
	if x.opts.Rename != "" {
		_, rest, _ := strings.Cut(name, "/")
		name = x.opts.Rename + "/" + rest
	}
	return path.Clean(name), nil
}

// parent opens the directory that holds name, resolving beneath the root
// and refusing every symlink on the way.
func (x *extractor) parent(name string) (int, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	if x.parentFd > 0 && x.parentName == dir {
		return x.parentFd, base, nil
	}
	x.closeParent()
	fd, err := unix.Openat2(x.root, dir, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return -1, "", fmt.Errorf("archive entry %q: %s is or passes through a symlink: %w", name, dir, ErrUnsafePath)
		}
		return -1, "", &fs.PathError{Op: "open", Path: filepath.Join(x.dir, dir), Err: err}
	}
	x.parentName, x.parentFd = dir, fd
	return fd, base, nil
}

func (x *extractor) closeParent() {
	if x.parentFd > 0 {
		unix.Close(x.parentFd)
	}
	x.parentFd, x.parentName = 0, ""
}

func (x *extractor) entry(hdr *tar.Header, data io.Reader) error {
	name, err := x.cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." {
		return nil // the destination itself: left as it is
	}
	pfd, base, err := x.parent(name)
	if err != nil {
		return err
	}
	full := filepath.Join(x.dir, name)
	switch hdr.Typeflag {
	case tar.TypeDir:
		err := unix.Mkdirat(pfd, base, 0o700)
		if errors.Is(err, unix.EEXIST) {
			var st unix.Stat_t
			if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return &fs.PathError{Op: "stat", Path: full, Err: err}
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("%s exists and is not a directory: %w", full, ErrUnsafePath)
			}
		} else if err != nil {
			return &fs.PathError{Op: "mkdir", Path: full, Err: err}
		}
		x.dirs = append(x.dirs, dirMeta{name: name, hdr: hdr})
		return nil
	case tar.TypeReg:
		fd, err := x.create(pfd, base, func() (int, error) {
			return unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		})
		if err != nil {
			return &fs.PathError{Op: "create", Path: full, Err: err}
		}
		f := os.NewFile(uintptr(fd), full)
		err = writeSparse(f, data)
		if err == nil {
			err = unix.Fchmod(int(f.Fd()), x.mode(hdr))
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", full, err)
		}
	case tar.TypeSymlink:
		if _, err := x.create(pfd, base, func() (int, error) {
			return -1, unix.Symlinkat(hdr.Linkname, pfd, base)
		}); err != nil {
			return &fs.PathError{Op: "symlink", Path: full, Err: err}
		}
	case tar.TypeFifo:
		if _, err := x.create(pfd, base, func() (int, error) {
			return -1, unix.Mkfifoat(pfd, base, x.mode(hdr)&0o777)
		}); err != nil {
			return &fs.PathError{Op: "mkfifo", Path: full, Err: err}
		}
	default:
		return nil // links, devices: not copied
	}
	return x.setMeta(name, hdr)
}

// create makes a non-directory at base with mk, first removing a
// non-directory that is there (a symlink is removed, never followed).
func (x *extractor) create(pfd int, base string, mk func() (int, error)) (int, error) {
	fd, err := mk()
	if !errors.Is(err, unix.EEXIST) {
		return fd, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return -1, unix.EISDIR
	}
	if err := unix.Unlinkat(pfd, base, 0); err != nil {
		return -1, err
	}
	return mk()
}

// mode is the permission bits an entry gets.
func (x *extractor) mode(hdr *tar.Header) uint32 {
	mode := uint32(hdr.Mode) & 0o7777
	if x.opts.NoSetID {
		mode &^= unix.S_ISUID | unix.S_ISGID
	}
	return mode
}

// setMeta applies a directory's mode, and any entry's mtime, to name, never through a symlink.
func (x *extractor) setMeta(name string, hdr *tar.Header) error {
	pfd, base, err := x.parent(name)
	if err != nil {
		return err
	}
	full := filepath.Join(x.dir, name)
	if hdr.Typeflag == tar.TypeDir {
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: full, Err: err}
		}
		err = unix.Fchmod(fd, x.mode(hdr))
		unix.Close(fd)
		if err != nil {
			return &fs.PathError{Op: "chmod", Path: full, Err: err}
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "set times", Path: full, Err: err}
	}
	return nil
}

// sparseBlock is the unit writeSparse leaves as a hole when it is all
// zeros.
const sparseBlock = 64 << 10

var zeroBlock [sparseBlock]byte

// writeSparse copies r to the empty file f, leaving every all-zero block
// of sparseBlock bytes as a hole: a sparse file (a terabyte of zeros that
// cost its sandbox nothing) costs the receiving disk only its data.
func writeSparse(f *os.File, r io.Reader) error {
	buf := make([]byte, sparseBlock)
	var off int64
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 && !bytes.Equal(buf[:n], zeroBlock[:n]) {
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				return err
			}
		}
		off += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return err
		}
	}
	return f.Truncate(off)
}
