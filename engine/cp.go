package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/archive"
	"hutch.dev/hutch/agent/wire"
)

// A copy between the host and a sandbox is a tar stream between hutch and
// the sandbox's agent (tar-out, tar-in) through `runsc exec`, never held in
// memory. Both ends extract with archive.Extract, which refuses names with
// "..", absolute names, and every symlink below the destination: the
// stream from a sandbox cannot make hutch write outside the destination on
// the host. Directories are copied recursively; modes and modification
// times are kept, symlinks stay symlinks, owners become the receiver's.
// A destination that is an existing directory receives the source under
// its own name; otherwise the destination is the copy's new name. A source
// ending in "/." copies a directory's contents.

// CopyFromSandbox copies src in sandbox ref to hostDst on the host. Set-ID
// bits are dropped from what comes out of a sandbox.
func (e *Engine) CopyFromSandbox(ctx context.Context, ref, src, hostDst string) error {
	if err := checkSandboxPath(src); err != nil {
		return err
	}
	dir, rename, err := archive.CopyTarget(hostDst)
	if err != nil {
		return hostPathError(err)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return hostPathError(&fs.PathError{Op: "open", Path: dir, Err: err})
	}
	root := os.NewFile(uintptr(fd), dir)
	defer root.Close()
	return e.CopyFromSandboxAt(ctx, ref, src, root, rename)
}

// CopyFromSandboxAt copies src in sandbox ref into the host directory open
// as dir (O_PATH will do): as rename, or under src's own name if rename is
// "". No host path is resolved: every file is made relative to dir's
// descriptor, and no symlink below it is followed (archive.ExtractAt), so
// what the path to dir becomes meanwhile does not matter.
func (e *Engine) CopyFromSandboxAt(ctx context.Context, ref, src string, dir *os.File, rename string) error {
	if err := checkSandboxPath(src); err != nil {
		return err
	}
	sb, err := e.running(ctx, ref)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	var errBuf capBuffer
	p, err := e.agentProcess(ctx, sb, []string{wire.ModeTarOut, src}, nil, pw, &errBuf)
	if err != nil {
		return err
	}
	waited := make(chan error, 1)
	go func() {
		err := agentWait(ctx, sb, p, &errBuf)
		pw.Close()
		waited <- err
	}()
	xerr := archive.ExtractAt(pr, dir, archive.ExtractOptions{Rename: rename, NoSetID: true, Check: copyOutCheck(sb, src)})
	if xerr != nil {
		cancel() // stop the sandbox's side
	}
	pr.Close()
	werr := <-waited
	if werr != nil && (xerr == nil || !errors.Is(werr, context.Canceled)) {
		return werr
	}
	return hostPathError(xerr)
}

// CopyToSandbox copies hostSrc on the host to dst in sandbox ref.
func (e *Engine) CopyToSandbox(ctx context.Context, ref, hostSrc, dst string) error {
	if err := checkSandboxPath(dst); err != nil {
		return err
	}
	if _, err := os.Lstat(hostSrc); err != nil {
		return hostPathError(err)
	}
	return e.copyToSandbox(ctx, ref, dst, func(w io.Writer) error {
		return archive.WriteTar(w, hostSrc, archive.ArchiveName(hostSrc))
	})
}

// CopyToSandboxFrom copies the host file or directory open for reading as
// src to dst in sandbox ref, named name at the top of the copy (as a
// source path's base name is). src itself is copied, whatever its path now
// leads to; below it every file is opened relative to its directory's
// descriptor and no symlink is followed (archive.WriteTarAt).
func (e *Engine) CopyToSandboxFrom(ctx context.Context, ref string, src *os.File, name, dst string) error {
	if err := checkSandboxPath(dst); err != nil {
		return err
	}
	return e.copyToSandbox(ctx, ref, dst, func(w io.Writer) error {
		return archive.WriteTarAt(w, src, name)
	})
}

// copyToSandbox streams what write writes, a tar stream, into the
// sandbox's agent, which extracts it at dst.
func (e *Engine) copyToSandbox(ctx context.Context, ref, dst string, write func(io.Writer) error) error {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	tarred := make(chan error, 1)
	go func() {
		err := write(pw)
		pw.CloseWithError(err)
		tarred <- err
	}()
	var errBuf capBuffer
	p, err := e.agentProcess(ctx, sb, []string{wire.ModeTarIn, dst}, pr, nil, &errBuf)
	if err != nil {
		pr.Close()
		<-tarred
		return err
	}
	werr := agentWait(ctx, sb, p, &errBuf)
	pr.Close() // unblocks the tar writer if the agent stopped reading
	terr := <-tarred
	if terr != nil && !errors.Is(terr, io.ErrClosedPipe) {
		return hostPathError(terr)
	}
	return werr
}

// hostPathError classifies an error about a host path.
func hostPathError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrNotExist):
		return &agentError{msg: err.Error(), kind: errdefs.ErrNotFound}
	case errors.Is(err, archive.ErrUnsafePath):
		return fmt.Errorf("refused: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}
