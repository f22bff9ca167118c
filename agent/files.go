package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/archive"
	"hutch.dev/hutch/agent/wire"
)

func init() {
	subcommands[wire.ModeStat] = statMain
	subcommands[wire.ModeLs] = lsMain
	subcommands[wire.ModeCat] = catMain
	subcommands[wire.ModeWrite] = writeMain
	subcommands[wire.ModeRm] = rmMain
	subcommands[wire.ModeMkdir] = mkdirMain
	subcommands[wire.ModeWatch] = watchMain
}

// fail prints err and returns the status of its kind.
func fail(err error) int {
	fmt.Fprintln(os.Stderr, err)
	switch {
	case errors.Is(err, syscall.ENOTEMPTY): // before ErrExist, which it also is
		return wire.StatusNotEmpty
	case errors.Is(err, fs.ErrNotExist):
		return wire.StatusNotExist
	case errors.Is(err, fs.ErrExist):
		return wire.StatusExist
	case errors.Is(err, syscall.ENOTDIR):
		return wire.StatusNotDir
	case errors.Is(err, syscall.EISDIR):
		return wire.StatusIsDir
	case errors.Is(err, fs.ErrPermission):
		return wire.StatusPermission
	case errors.Is(err, archive.ErrUnsafePath):
		return wire.StatusUnsafe
	}
	return wire.StatusFailed
}

func usage(u string) int {
	fmt.Fprintln(os.Stderr, "usage: hutch-init "+u)
	return wire.StatusUsage
}

func fileInfo(p string, fi fs.FileInfo) wire.FileInfo {
	out := wire.FileInfo{
		Name: fi.Name(), Path: p, Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime(), IsDir: fi.IsDir(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out.UID, out.GID = st.Uid, st.Gid
		out.Owner, out.Group = ownerNames(st.Uid, st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		out.Link, _ = os.Readlink(p)
	}
	out.Metadata = readMetadata(p)
	return out
}

func writeJSON(v any) int {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		return fail(err)
	}
	return 0
}

// statMain is "stat PATH": its wire.FileInfo (of a symlink itself) as JSON.
func statMain(args []string) int {
	if len(args) != 1 {
		return usage("stat PATH")
	}
	fi, err := os.Lstat(args[0])
	if err != nil {
		return fail(err)
	}
	return writeJSON(fileInfo(args[0], fi))
}

// lsMain is "ls [-d DEPTH] [--] DIR": the wire.FileInfo of each entry,
// as a JSON array; with DEPTH > 1, also of the entries of its
// subdirectories down to that many levels (depth first, by name; symlinks
// not followed).
func lsMain(args []string) int {
	fl := newFlags("ls")
	depth := fl.Uint("d", 1, "levels to list")
	if fl.Parse(args) != nil || fl.NArg() != 1 || *depth < 1 {
		return usage("ls [-d DEPTH] DIR")
	}
	out := []wire.FileInfo{}
	if err := listDir(fl.Arg(0), *depth, &out); err != nil {
		return fail(err)
	}
	return writeJSON(out)
}

// catMain is "cat FILE": its bytes on stdout.
func catMain(args []string) int {
	if len(args) != 1 {
		return usage("cat FILE")
	}
	f, err := os.Open(args[0])
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return fail(&fs.PathError{Op: "read", Path: args[0], Err: syscall.EISDIR})
	}
	if _, err := io.Copy(os.Stdout, f); err != nil {
		return fail(err)
	}
	return 0
}

// writeMain is "write [-p] [-o UID:GID] [-m JSON] [--] FILE MODE": stdin
// into FILE, created with MODE (octal) or truncated. With -p, missing
// parent directories are created first; with -o, they and FILE are owned
// by UID:GID. With -m, a JSON object of strings, the file's metadata is
// replaced by it (keys not in it are removed, as a new upload replaces
// the metadata of the file it overwrites). It prints the wire.FileInfo of
// the file written as JSON.
func writeMain(args []string) int {
	fl := newFlags("write")
	parents := fl.Bool("p", false, "create missing parents")
	var owner ownerFlag
	fl.Var(&owner, "o", "owner UID:GID")
	metaJSON := fl.String("m", "", "metadata (a JSON object)")
	if fl.Parse(args) != nil || fl.NArg() != 2 {
		return usage("write [-p] [-o UID:GID] [-m JSON] FILE MODE")
	}
	args = fl.Args()
	mode, err := strconv.ParseUint(args[1], 8, 32)
	if err != nil {
		return usage("write FILE MODE (octal)")
	}
	var meta map[string]string
	if *metaJSON != "" {
		if err := json.Unmarshal([]byte(*metaJSON), &meta); err != nil {
			return usage("write -m JSON: " + err.Error())
		}
	}
	if *parents {
		if err := mkdirOwned(filepath.Dir(args[0]), 0o755, owner); err != nil {
			return fail(err)
		}
	}
	f, err := os.OpenFile(args[0], os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fs.FileMode(mode)&fs.ModePerm)
	if err != nil {
		return fail(err)
	}
	_, err = io.Copy(f, os.Stdin)
	if err == nil {
		err = f.Chmod(fs.FileMode(mode) & fs.ModePerm)
	}
	if err == nil && owner.set {
		err = f.Chown(int(owner.uid), int(owner.gid))
	}
	if err == nil && *metaJSON != "" {
		err = replaceMetadata(f, meta)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(args[0])
	if err != nil {
		return fail(err)
	}
	return writeJSON(fileInfo(args[0], fi))
}

// readMetadata is p's user metadata (wire.MetadataXattr attributes), nil
// if it has none or its file system keeps no extended attributes.
func readMetadata(p string) map[string]string {
	names, err := xattrNames(p)
	if err != nil {
		return nil
	}
	var meta map[string]string
	for _, n := range names {
		key, ok := strings.CutPrefix(n, wire.MetadataXattr)
		if !ok || key == "" {
			continue
		}
		v, err := xattrValue(p, n)
		if err != nil {
			continue
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[key] = v
	}
	return meta
}

// replaceMetadata makes meta f's user metadata, removing the keys that
// are not in it.
func replaceMetadata(f *os.File, meta map[string]string) error {
	fd := int(f.Fd())
	buf := make([]byte, 4096)
	n, err := unix.Flistxattr(fd, buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Flistxattr(fd, nil); err == nil {
			buf = make([]byte, n)
			n, err = unix.Flistxattr(fd, buf)
		}
	}
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return &fs.PathError{Op: "listxattr", Path: f.Name(), Err: err}
	}
	for _, name := range splitNames(buf[:max(n, 0)]) {
		if key, ok := strings.CutPrefix(name, wire.MetadataXattr); ok {
			if _, keep := meta[key]; !keep {
				if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
					return &fs.PathError{Op: "removexattr", Path: f.Name(), Err: err}
				}
			}
		}
	}
	for k, v := range meta {
		if err := unix.Fsetxattr(fd, wire.MetadataXattr+k, []byte(v), 0); err != nil {
			return &fs.PathError{Op: "setxattr " + wire.MetadataXattr + k, Path: f.Name(), Err: err}
		}
	}
	return nil
}

// xattrNames are the names of p's extended attributes (of a symlink
// itself).
func xattrNames(p string) ([]string, error) {
	buf := make([]byte, 4096)
	for {
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Llistxattr(p, nil); err != nil {
				return nil, err
			}
			buf = make([]byte, n)
			continue
		}
		if err != nil {
			return nil, err
		}
		return splitNames(buf[:n]), nil
	}
}

// xattrValue is the value of p's extended attribute name.
func xattrValue(p, name string) (string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Lgetxattr(p, name, nil); err != nil {
				return "", err
			}
			buf = make([]byte, n)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// splitNames splits listxattr's NUL-terminated names.
func splitNames(b []byte) []string {
	var out []string
	for _, n := range strings.Split(string(b), "\x00") {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// rmMain is "rm [-r] PATH".
func rmMain(args []string) int {
	recursive := len(args) == 2 && args[0] == "-r"
	if recursive {
		args = args[1:]
	}
	if len(args) != 1 {
		return usage("rm [-r] PATH")
	}
	if _, err := os.Lstat(args[0]); err != nil {
		return fail(err)
	}
	var err error
	if recursive {
		err = os.RemoveAll(args[0])
	} else {
		err = os.Remove(args[0])
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// mkdirMain is "mkdir [-p] [-o UID:GID] [--] DIR MODE". With -o, the
// directories it creates are owned by UID:GID.
func mkdirMain(args []string) int {
	fl := newFlags("mkdir")
	parents := fl.Bool("p", false, "create missing parents")
	var owner ownerFlag
	fl.Var(&owner, "o", "owner UID:GID")
	if fl.Parse(args) != nil || fl.NArg() != 2 {
		return usage("mkdir [-p] [-o UID:GID] DIR MODE")
	}
	args = fl.Args()
	mode, err := strconv.ParseUint(args[1], 8, 32)
	if err != nil {
		return usage("mkdir [-p] DIR MODE (octal)")
	}
	perm := fs.FileMode(mode) & fs.ModePerm
	switch {
	case *parents:
		err = mkdirOwned(args[0], perm, owner)
	default:
		err = os.Mkdir(args[0], perm)
		if err == nil && owner.set {
			err = os.Lchown(args[0], int(owner.uid), int(owner.gid))
		}
	}
	if err == nil {
		err = os.Chmod(args[0], perm)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// watchMain is "watch [-r] PATH": changes of PATH (with -r, of the whole
// tree under it, including directories created later) as JSON lines on
// stdout, until killed.
func watchMain(args []string) int {
	recursive := len(args) == 2 && args[0] == "-r"
	if recursive {
		args = args[1:]
	}
	if len(args) != 1 {
		return usage("watch [-r] PATH")
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fail(err)
	}
	defer w.Close()
	add := func(root string) error {
		if !recursive {
			return w.Add(root)
		}
		return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == root {
					return err
				}
				return nil // gone meanwhile
			}
			if d.IsDir() {
				return w.Add(p)
			}
			return nil
		})
	}
	if err := add(args[0]); err != nil {
		return fail(err)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(wire.WatchEvent{Op: "ready", Path: args[0]}); err != nil {
		return 0
	}
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return 0
			}
			// A new directory is watched before its event is out, so
			// that whoever sees the event sees what happens in it.
			if recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					add(ev.Name) //nolint:errcheck // it may be gone already
				}
			}
			for _, op := range []struct {
				op   fsnotify.Op
				name string
			}{{fsnotify.Create, "create"}, {fsnotify.Write, "write"}, {fsnotify.Remove, "remove"}, {fsnotify.Rename, "rename"}, {fsnotify.Chmod, "chmod"}} {
				if ev.Has(op.op) {
					if err := enc.Encode(wire.WatchEvent{Path: ev.Name, Op: op.name}); err != nil {
						return 0 // the reader is gone
					}
				}
			}
		case err, ok := <-w.Errors:
			if !ok {
				return 0
			}
			fmt.Fprintln(os.Stderr, err)
		}
	}
}
