package mcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/client"
	"hutch.dev/hutch/serve/envdpb/filesystempb"
)

// The file tools on a remote server: envd's filesystem service through
// the sandbox's data plane.

// stat describes path in the sandbox.
func (b *remoteBackend) stat(ctx context.Context, box *remoteBox, p string) (*filesystempb.EntryInfo, error) {
	res, err := box.sb.Filesystem(box.user).Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: p}))
	if err != nil {
		return nil, b.err(err)
	}
	return res.Msg.GetEntry(), nil
}

func (b *remoteBackend) readFile(ctx context.Context, ref, p string, w io.Writer) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	e, err := b.stat(ctx, box, p)
	if err != nil {
		return err
	}
	if e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY {
		return isDirError(p)
	}
	return b.err(box.sb.ReadFile(ctx, p, w, box.user))
}

func (b *remoteBackend) writeFile(ctx context.Context, ref, p string, data []byte, mode fs.FileMode) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	if err := box.sb.WriteFile(ctx, p, bytes.NewReader(data), box.user); err != nil {
		return b.err(err)
	}
	if mode == 0o644 {
		return nil
	}
	r, err := box.sb.Start(ctx, client.ExecRequest{Cmd: "chmod", Args: []string{fmt.Sprintf("%o", mode), p}, User: box.user})
	if err == nil {
		var res *client.Result
		if res, err = r.Wait(ctx); err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("chmod %o %s: exit status %d: %s: %w", mode, p, res.ExitCode, strings.TrimSpace(res.Stderr), errdefs.ErrUnknown)
		}
	}
	return b.err(err)
}

func (b *remoteBackend) listDir(ctx context.Context, ref, p string) ([]fileEntry, error) {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	res, err := box.sb.Filesystem(box.user).ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: p, Depth: 1}))
	if err != nil {
		return nil, b.err(err)
	}
	out := []fileEntry{}
	for _, e := range res.Msg.GetEntries() {
		out = append(out, remoteEntry(e))
	}
	slices.SortFunc(out, func(x, y fileEntry) int { return strings.Compare(x.Name, y.Name) })
	return out, nil
}

func remoteEntry(e *filesystempb.EntryInfo) fileEntry {
	f := fileEntry{Name: e.GetName(), Size: e.GetSize(), Mode: fmt.Sprintf("%04o", e.GetMode()&0o777), Link: e.GetSymlinkTarget()}
	if t := e.GetModifiedTime(); t != nil {
		f.ModTime = t.AsTime().UTC()
	}
	switch e.GetType() {
	case filesystempb.FileType_FILE_TYPE_DIRECTORY:
		f.Type = "dir"
	case filesystempb.FileType_FILE_TYPE_SYMLINK:
		f.Type = "symlink"
	case filesystempb.FileType_FILE_TYPE_FILE:
		f.Type = "file"
	default:
		f.Type = "other"
	}
	return f
}

func (b *remoteBackend) removeFile(ctx context.Context, ref, p string, recursive bool) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	e, err := b.stat(ctx, box, p)
	if err != nil {
		return err
	}
	fsc := box.sb.Filesystem(box.user)
	if e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY && !recursive {
		l, err := fsc.ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: p, Depth: 1}))
		if err != nil {
			return b.err(err)
		}
		if len(l.Msg.GetEntries()) > 0 {
			return fmt.Errorf("directory %s is not empty: pass recursive true to remove it and everything in it: %w", p, errdefs.ErrFailedPrecondition)
		}
	}
	_, err = fsc.Remove(ctx, connect.NewRequest(&filesystempb.RemoveRequest{Path: p}))
	return b.err(err)
}

// noDirs is the error for a directory transfer, which the server's file
// API does not do.
func noDirs(p string) error {
	return fmt.Errorf("%s is a directory: with a remote hutch server files are copied one at a time (archive a directory with tar in the sandbox, or on the host, first): %w", p, errdefs.ErrNotImplemented)
}

func (b *remoteBackend) upload(ctx context.Context, ref string, src *os.File, name, p string) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return noDirs(src.Name())
	}
	if e, err := b.stat(ctx, box, p); err == nil && e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY {
		p = path.Join(p, name)
	}
	return b.err(box.sb.WriteFile(ctx, p, src, box.user))
}

func (b *remoteBackend) download(ctx context.Context, ref, p string, dst hostTarget) error {
	_, box, err := b.running(ctx, ref)
	if err != nil {
		return err
	}
	e, err := b.stat(ctx, box, p)
	if err != nil {
		return err
	}
	if e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY {
		return noDirs(p)
	}
	name := dst.rename
	if name == "" {
		name = path.Base(p)
	}
	f, err := createIn(dst.dir, name)
	if err != nil {
		return err
	}
	if err := box.sb.ReadFile(ctx, p, f, box.user); err != nil {
		f.Close()
		return b.err(err)
	}
	return f.Close()
}

// createIn creates the file name in the open directory dir, as
// archive.Extract does a file entry: what is at name is replaced, a
// symlink removed rather than written through, a directory refused.
func createIn(dir *os.File, name string) (*os.File, error) {
	full := filepath.Join(dir.Name(), name)
	create := func() (int, error) {
		return unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	}
	fd, err := create()
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err = unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				err = unix.EISDIR
			} else if err = unix.Unlinkat(int(dir.Fd()), name, 0); err == nil {
				fd, err = create()
			}
		}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "create", Path: full, Err: err}
	}
	return os.NewFile(uintptr(fd), full), nil
}
