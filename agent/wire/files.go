package wire

import (
	"encoding/json"
	"io/fs"
	"strconv"
	"time"
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
	// Owner and Group name UID and GID in the sandbox's /etc/passwd and
	// /etc/group, when they are there.
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	// Metadata is the file's user metadata: its extended attributes
	// named MetadataXattr+KEY, by KEY.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// MetadataXattr prefixes the names of the extended attributes that hold
// a file's user metadata, as E2B's envd names them, so that metadata set
// inside the sandbox (setfattr, os.setxattr) is the same as metadata
// given with an upload.
const MetadataXattr = "user.e2b."

// WatchEvent is one change that "watch" reports, one JSON object a line.
// The first line has Op "ready": the watches are in place.
type WatchEvent struct {
	Path string `json:"path"`
	// Op is create, write, remove, rename or chmod (or ready).
	Op string `json:"op"`
}

// WriteArgs are the arguments of the write subcommand that writes path
// with mode: with parents, making its missing parents; with owner (the
// -o option and its value, or nothing), owned by that owner; with meta
// not nil, replacing the file's metadata with it. The subcommand prints
// the FileInfo of the file written.
func WriteArgs(path string, mode uint32, parents bool, owner []string, meta map[string]string) ([]string, error) {
	args := []string{ModeWrite}
	if parents {
		args = append(args, "-p")
	}
	args = append(args, owner...)
	if meta != nil {
		b, err := json.Marshal(meta)
		if err != nil {
			return nil, err
		}
		args = append(args, "-m", string(b))
	}
	return append(args, "--", path, strconv.FormatUint(uint64(mode), 8)), nil
}
