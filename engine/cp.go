package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containerd/errdefs"

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
	xerr := archive.Extract(pr, dir, archive.ExtractOptions{Rename: rename, NoSetID: true, Check: copyOutCheck(sb, src)})
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
	sb, err := e.running(ctx, ref)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	tarred := make(chan error, 1)
	go func() {
		err := archive.WriteTar(pw, hostSrc, archive.ArchiveName(hostSrc))
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
