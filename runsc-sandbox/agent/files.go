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
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Exit statuses of the file subcommands (stat, ls, cat, write, rm, mkdir,
// watch, tar-in, tar-out): the error's kind, so that the host maps it back
// without reading the message. The message is one line on stderr.
const (
	StatusFailed     = 1
	StatusUsage      = 2
	StatusNotExist   = 3
	StatusExist      = 4
	StatusNotDir     = 5
	StatusIsDir      = 6
	StatusPermission = 7
	StatusUnsafe     = 8
	StatusNotEmpty   = 9
)

func init() {
	subcommands["stat"] = statMain
	subcommands["ls"] = lsMain
	subcommands["cat"] = catMain
	subcommands["write"] = writeMain
	subcommands["rm"] = rmMain
	subcommands["mkdir"] = mkdirMain
	subcommands["watch"] = watchMain
}

// fail prints err and returns the status of its kind.
func fail(err error) int {
	fmt.Fprintln(os.Stderr, err)
	switch {
	case errors.Is(err, syscall.ENOTEMPTY): // before ErrExist, which it also is
		return StatusNotEmpty
	case errors.Is(err, fs.ErrNotExist):
		return StatusNotExist
	case errors.Is(err, fs.ErrExist):
		return StatusExist
	case errors.Is(err, syscall.ENOTDIR):
		return StatusNotDir
	case errors.Is(err, syscall.EISDIR):
		return StatusIsDir
	case errors.Is(err, fs.ErrPermission):
		return StatusPermission
	case errors.Is(err, ErrUnsafePath):
		return StatusUnsafe
	}
	return StatusFailed
}

func usage(u string) int {
	fmt.Fprintln(os.Stderr, "usage: sbx-init "+u)
	return StatusUsage
}

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Name    string      `json:"name"`
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"modTime"`
	IsDir   bool        `json:"isDir"`
	// Link is a symlink's target.
	Link string `json:"link,omitempty"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
}

func fileInfo(p string, fi fs.FileInfo) FileInfo {
	out := FileInfo{
		Name: fi.Name(), Path: p, Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime(), IsDir: fi.IsDir(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out.UID, out.GID = st.Uid, st.Gid
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		out.Link, _ = os.Readlink(p)
	}
	return out
}

func writeJSON(v any) int {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		return fail(err)
	}
	return 0
}

// statMain is "stat PATH": its FileInfo (of a symlink itself) as JSON.
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

// lsMain is "ls DIR": the FileInfo of each entry, as a JSON array.
func lsMain(args []string) int {
	if len(args) != 1 {
		return usage("ls DIR")
	}
	ents, err := os.ReadDir(args[0])
	if err != nil {
		return fail(err)
	}
	out := []FileInfo{}
	for _, ent := range ents {
		fi, err := ent.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, fileInfo(filepath.Join(args[0], ent.Name()), fi))
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

// writeMain is "write FILE MODE": stdin into FILE, created with MODE
// (octal) or truncated.
func writeMain(args []string) int {
	if len(args) != 2 {
		return usage("write FILE MODE")
	}
	mode, err := strconv.ParseUint(args[1], 8, 32)
	if err != nil {
		return usage("write FILE MODE (octal)")
	}
	f, err := os.OpenFile(args[0], os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fs.FileMode(mode)&fs.ModePerm)
	if err != nil {
		return fail(err)
	}
	_, err = io.Copy(f, os.Stdin)
	if err == nil {
		err = f.Chmod(fs.FileMode(mode) & fs.ModePerm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	return 0
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

// mkdirMain is "mkdir [-p] DIR MODE".
func mkdirMain(args []string) int {
	parents := len(args) == 3 && args[0] == "-p"
	if parents {
		args = args[1:]
	}
	if len(args) != 2 {
		return usage("mkdir [-p] DIR MODE")
	}
	mode, err := strconv.ParseUint(args[1], 8, 32)
	if err != nil {
		return usage("mkdir [-p] DIR MODE (octal)")
	}
	if parents {
		err = os.MkdirAll(args[0], fs.FileMode(mode)&fs.ModePerm)
	} else {
		err = os.Mkdir(args[0], fs.FileMode(mode)&fs.ModePerm)
	}
	if err == nil {
		err = os.Chmod(args[0], fs.FileMode(mode)&fs.ModePerm)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// WatchEvent is one change that "watch" reports, one JSON object a line.
// The first line has Op "ready": the watches are in place.
type WatchEvent struct {
	Path string `json:"path"`
	// Op is create, write, remove, rename or chmod (or ready).
	Op string `json:"op"`
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
	if err := enc.Encode(WatchEvent{Op: "ready", Path: args[0]}); err != nil {
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
					if err := enc.Encode(WatchEvent{Path: ev.Name, Op: op.name}); err != nil {
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
