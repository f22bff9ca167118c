package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"strconv"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/wire"
)

// Owner is the user and group that own what a file operation creates in a
// sandbox.
type Owner struct {
	UID, GID uint32
}

// args is the agent's -o option for o; none for nil.
func (o *Owner) args() []string {
	if o == nil {
		return nil
	}
	return []string{"-o", strconv.FormatUint(uint64(o.UID), 10) + ":" + strconv.FormatUint(uint64(o.GID), 10)}
}

// User is a user of a sandbox's image.
type User struct {
	Name     string
	UID, GID uint32
	// Home is the user's home directory.
	Home string
}

// UnknownUserError is LookupUser's answer for a name the image does not
// know. It is an errdefs.ErrNotFound.
type UnknownUserError struct {
	Name string
}

func (u *UnknownUserError) Error() string {
	return fmt.Sprintf("user %q: no such user in the image's /etc/passwd", u.Name)
}

func (u *UnknownUserError) Unwrap() error { return errdefs.ErrNotFound }

// LookupUser finds the user called name in the /etc/passwd of running
// sandbox ref's image; an unknown name is an *UnknownUserError.
func (e *Engine) LookupUser(ctx context.Context, ref, name string) (User, error) {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return User{}, err
	}
	if name == "" {
		return User{}, fmt.Errorf("empty user name: %w", errdefs.ErrInvalidArgument)
	}
	ent := e.passwdEntry(sb, name, 0)
	if ent == nil {
		return User{}, &UnknownUserError{Name: name}
	}
	return User{Name: ent.name, UID: ent.uid, GID: ent.gid, Home: ent.home}, nil
}

// MkdirRequest is a directory to create in a sandbox.
type MkdirRequest struct {
	Path string
	// Mode is the directory's permission bits (0755 if zero).
	Mode fs.FileMode
	// Parents also creates missing parents, and makes an existing
	// directory no error.
	Parents bool
	// Owner, if set, owns the directories created.
	Owner *Owner
}

// MakeDir creates the directory req.Path in sandbox ref: Mkdir, with an
// owner.
func (e *Engine) MakeDir(ctx context.Context, ref string, req MkdirRequest) error {
	if err := checkSandboxPath(req.Path); err != nil {
		return err
	}
	mode := req.Mode.Perm()
	if mode == 0 {
		mode = 0o755
	}
	args := []string{wire.ModeMkdir}
	if req.Parents {
		args = append(args, "-p")
	}
	args = append(append(args, req.Owner.args()...), "--", req.Path, strconv.FormatUint(uint64(mode), 8))
	return e.agentRun(ctx, ref, args, nil, nil)
}

// MoveRequest renames a file or directory in a sandbox.
type MoveRequest struct {
	Source, Destination string
	// Owner, if set, owns the parent directories of Destination that the
	// move creates.
	Owner *Owner
}

// Move renames req.Source to req.Destination in sandbox ref, creating
// Destination's missing parent directories; a file at Destination is
// replaced. A missing Source is errdefs.ErrNotFound.
func (e *Engine) Move(ctx context.Context, ref string, req MoveRequest) error {
	for _, p := range []string{req.Source, req.Destination} {
		if err := checkSandboxPath(p); err != nil {
			return err
		}
	}
	args := append(append([]string{wire.ModeMv}, req.Owner.args()...), "--", req.Source, req.Destination)
	return e.agentRun(ctx, ref, args, nil, nil)
}

// ListDir lists the directory at path in sandbox ref and, for depth > 1,
// its subdirectories down to depth levels: each directory's entries by
// name, each subdirectory's entries right after it.
func (e *Engine) ListDir(ctx context.Context, ref, path string, depth int) ([]FileInfo, error) {
	if err := checkSandboxPath(path); err != nil {
		return nil, err
	}
	if depth < 1 {
		return nil, fmt.Errorf("list %s: depth %d: must be at least 1: %w", path, depth, errdefs.ErrInvalidArgument)
	}
	// The agent's answer is bounded: a tree of millions of files at a
	// great depth would otherwise all be held here.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := &listingBuffer{max: MaxListing, over: cancel}
	err := e.agentRun(ctx, ref, []string{wire.ModeLs, "-d", strconv.Itoa(depth), "--", path}, nil, out)
	if out.full {
		return nil, fmt.Errorf("list %s to depth %d: the listing passes %s: list a smaller tree or to a lower depth: %w", path, depth, FormatSize(MaxListing), errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, err
	}
	var fis []FileInfo
	if err := json.Unmarshal(out.buf.Bytes(), &fis); err != nil {
		return nil, fmt.Errorf("list %s: the sandbox agent's answer: %w", path, err)
	}
	return fis, nil
}

// MaxListing bounds the agent's answer to ListDir, its entries in JSON
// (about 250 bytes each).
const MaxListing = 32 << 20

// listingBuffer keeps up to max bytes; past them it calls over (which
// ends the agent) and keeps nothing more.
type listingBuffer struct {
	buf  bytes.Buffer
	max  int
	full bool
	over func()
}

func (l *listingBuffer) Write(p []byte) (int, error) {
	if l.full || l.buf.Len()+len(p) > l.max {
		if !l.full {
			l.full = true
			l.buf = bytes.Buffer{}
			l.over()
		}
		return 0, fmt.Errorf("listing larger than %d bytes", l.max)
	}
	return l.buf.Write(p)
}

type actingKey struct{}

// ActingAs makes the file operations under ctx act as user o inside the
// sandbox: the agent runs with o's IDs, so o's permissions apply (a user
// cannot read or write what the sandbox keeps from it) and what it creates
// is o's. Without it, file operations act as root.
func ActingAs(ctx context.Context, o Owner) context.Context {
	return context.WithValue(ctx, actingKey{}, o)
}

// agentUser is the user the agent runs as for a file operation under ctx.
func agentUser(ctx context.Context) string {
	if o, ok := ctx.Value(actingKey{}).(Owner); ok {
		return strconv.FormatUint(uint64(o.UID), 10) + ":" + strconv.FormatUint(uint64(o.GID), 10)
	}
	return "0:0"
}
