package overlay

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// A rootless store cannot give unpacked files their owners: every file is
// the caller's, which is root inside the sandbox's user namespace. It keeps
// the owners instead in a file beside each chain directory,
// R/rootfs/<chain ID>.owners, for the sandbox's agent to set inside the
// sandbox before anything else runs there (docs/decisions/0021).
//
// The file lists every entry of the chain that the image gives an owner
// other than root (uid 0, gid 0), one line each, sorted by path:
//
//	UID GID MODE PATH
//
// UID, GID in decimal, MODE the entry's permission bits (07777) in octal,
// which a chown clears in part (setuid, setgid), PATH absolute and clean,
// quoted as Go quotes strings. A chain's file is its parent's with its own
// layer applied: a later entry for a path replaces the earlier one (and
// drops it when root's), a whiteout drops the paths it removes.
const ownersSuffix = ".owners"

// owner is what a rootless chain records of one entry.
type owner struct {
	uid, gid int
	mode     int64
}

// OwnersFile returns the path of the owners file of the chain rootfs (a
// path Rootfs returned), or "" when the chain has none: a root store's, or
// one whose every file is root's.
func (s *Store) OwnersFile(rootfs string) string {
	p := rootfs + ownersSuffix
	if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
		return ""
	}
	return p
}

// ownerLog gathers the owners of one chain while its layer is applied.
type ownerLog struct {
	entries map[string]owner
	// layer holds the paths the current layer has recorded: an opaque
	// directory drops only what lower layers had in it.
	layer map[string]bool
}

func newOwnerLog() *ownerLog {
	return &ownerLog{entries: map[string]owner{}, layer: map[string]bool{}}
}

// readOwners loads a chain's owners file; a missing one is empty.
func readOwners(path string) (*ownerLog, error) {
	l := newOwnerLog()
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var o owner
		var rest string
		fields := strings.SplitN(sc.Text(), " ", 4)
		if len(fields) == 4 {
			o.uid, err = strconv.Atoi(fields[0])
			if err == nil {
				o.gid, err = strconv.Atoi(fields[1])
			}
			if err == nil {
				o.mode, err = strconv.ParseInt(fields[2], 8, 64)
			}
			if err == nil {
				rest, err = strconv.Unquote(fields[3])
			}
		}
		if len(fields) != 4 || err != nil {
			return nil, fmt.Errorf("%s:%d: bad line: %w", path, n, ErrCorrupt)
		}
		l.entries[rest] = o
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return l, nil
}

// record notes what the tar entry hdr, at the clean absolute path name,
// does to the chain's owners.
func (l *ownerLog) record(name string, hdr *tar.Header) {
	dir, base := filepath.Split(name)
	if strings.HasPrefix(base, ".wh.") {
		if base == ".wh..wh..opq" {
			l.dropBelow(filepath.Clean(dir), true)
			return
		}
		gone := filepath.Join(dir, strings.TrimPrefix(base, ".wh."))
		delete(l.entries, gone)
		l.dropBelow(gone, false)
		return
	}
	if hdr.Typeflag != tar.TypeDir {
		// It replaces whatever was there, a directory with its contents.
		l.dropBelow(name, false)
	}
	if hdr.Uid == 0 && hdr.Gid == 0 {
		delete(l.entries, name)
		return
	}
	l.entries[name] = owner{uid: hdr.Uid, gid: hdr.Gid, mode: hdr.Mode & 0o7777}
	l.layer[name] = true
}

// dropBelow forgets every entry under dir; with lowerOnly, those the
// current layer recorded stay.
func (l *ownerLog) dropBelow(dir string, lowerOnly bool) {
	prefix := dir + "/"
	if dir == "/" {
		prefix = "/"
	}
	for p := range l.entries {
		if strings.HasPrefix(p, prefix) && !(lowerOnly && l.layer[p]) {
			delete(l.entries, p)
		}
	}
}

// write stores the log as the owners file path; an empty log removes it.
func (l *ownerLog) write(path string) error {
	if len(l.entries) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	paths := make([]string, 0, len(l.entries))
	for p := range l.entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var b strings.Builder
	for _, p := range paths {
		o := l.entries[p]
		fmt.Fprintf(&b, "%d %d %o %s\n", o.uid, o.gid, o.mode, strconv.Quote(p))
	}
	return writeFileAtomic(path, []byte(b.String()), 0o644)
}
