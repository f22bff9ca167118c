package wire

import (
	"io/fs"
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
}

// WatchEvent is one change that "watch" reports, one JSON object a line.
// The first line has Op "ready": the watches are in place.
type WatchEvent struct {
	Path string `json:"path"`
	// Op is create, write, remove, rename or chmod (or ready).
	Op string `json:"op"`
}
