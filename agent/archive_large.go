package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// A file can be sparse inside a sandbox: its apparent size costs the
// sandbox's --disk nothing, but gVisor's export of the upper layer (`runsc
// tar rootfs-upper`) reads every file whole into memory, and everything
// downstream writes it to the host at its apparent size. The host asks
// the agent for such files before it exports.

func init() {
	subcommands["large-files"] = largeFilesMain
}

// MaxLargeFiles is the most files large-files reports.
const MaxLargeFiles = 32

// largeFilesSkip are the trees large-files does not walk: kernel
// filesystems and hutch's own mounts, none of which a snapshot captures.
var largeFilesSkip = map[string]bool{"/proc": true, "/sys": true, "/dev": true, "/run": true, "/.hutch": true}

// LargeFile is a regular file found by large-files.
type LargeFile struct {
	Path string
	Size int64
}

// FindLargeFiles lists up to MaxLargeFiles regular files under root
// (an absolute path inside the sandbox) whose size exceeds limit, without
// following symlinks. Unreadable directories are skipped.
func FindLargeFiles(root string, limit int64) ([]LargeFile, error) {
	var out []LargeFile
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if d != nil && d.IsDir() && p != root {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() && largeFilesSkip[p] {
			return fs.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil || fi.Size() <= limit {
			return nil
		}
		out = append(out, LargeFile{Path: p, Size: fi.Size()})
		if len(out) >= MaxLargeFiles {
			return fs.SkipAll
		}
		return nil
	})
	return out, err
}

// WriteLargeFiles writes fs as records "SIZE PATH\x00".
func WriteLargeFiles(w io.Writer, files []LargeFile) error {
	bw := bufio.NewWriter(w)
	for _, f := range files {
		fmt.Fprintf(bw, "%d %s\x00", f.Size, f.Path)
	}
	return bw.Flush()
}

// ParseLargeFiles reads what WriteLargeFiles wrote. It comes from inside
// a sandbox: at most MaxLargeFiles records are accepted and a malformed
// one is an error.
func ParseLargeFiles(b []byte) ([]LargeFile, error) {
	var out []LargeFile
	for len(b) > 0 {
		rec, rest, ok := bytes.Cut(b, []byte{0})
		if !ok {
			return nil, fmt.Errorf("large-files: unterminated record")
		}
		b = rest
		sz, p, ok := bytes.Cut(rec, []byte{' '})
		n, err := strconv.ParseInt(string(sz), 10, 64)
		if !ok || err != nil || n < 0 || len(p) == 0 || p[0] != '/' {
			return nil, fmt.Errorf("large-files: malformed record %q", rec)
		}
		if len(out) == MaxLargeFiles {
			return nil, fmt.Errorf("large-files: more than %d records", MaxLargeFiles)
		}
		out = append(out, LargeFile{Path: string(p), Size: n})
	}
	return out, nil
}

// largeFilesMain is "large-files LIMIT": the regular files of the
// sandbox larger than LIMIT bytes, as WriteLargeFiles writes them.
func largeFilesMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: hutch-init large-files LIMIT")
		return 2
	}
	limit, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || limit < 0 {
		fmt.Fprintln(os.Stderr, "large-files: bad limit", args[0])
		return 2
	}
	files, err := FindLargeFiles("/", limit)
	if err != nil {
		return fail(err)
	}
	if err := WriteLargeFiles(os.Stdout, files); err != nil {
		return fail(err)
	}
	return 0
}
