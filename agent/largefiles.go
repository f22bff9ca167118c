package agent

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"hutch.dev/hutch/agent/wire"
)

// A file can be sparse inside a sandbox: its apparent size costs the
// sandbox's --disk nothing, but gVisor's export of the upper layer (`runsc
// tar rootfs-upper`) reads every file whole into memory, and everything
// downstream writes it to the host at its apparent size. The host asks
// the agent for such files before it exports.

func init() {
	subcommands[wire.ModeLargeFiles] = largeFilesMain
}

// largeFilesSkip are the trees large-files does not walk: kernel
// filesystems and hutch's own mounts, none of which a snapshot captures.
var largeFilesSkip = map[string]bool{"/proc": true, "/sys": true, "/dev": true, "/run": true, "/.hutch": true}

// FindLargeFiles lists up to wire.MaxLargeFiles regular files under root
// (an absolute path inside the sandbox) whose size exceeds limit, without
// following symlinks. Unreadable directories are skipped.
func FindLargeFiles(root string, limit int64) ([]wire.LargeFile, error) {
	var out []wire.LargeFile
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
		out = append(out, wire.LargeFile{Path: p, Size: fi.Size()})
		if len(out) >= wire.MaxLargeFiles {
			return fs.SkipAll
		}
		return nil
	})
	return out, err
}

// largeFilesMain is "large-files LIMIT": the regular files of the
// sandbox larger than LIMIT bytes, as wire.WriteLargeFiles writes them.
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
	if err := wire.WriteLargeFiles(os.Stdout, files); err != nil {
		return fail(err)
	}
	return 0
}
