package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// A shared store is an image store that one user (root) fills and every
// user reads: an additional image store, like podman's. Only its OCI
// layout is for others: R and R/oci, R/oci/blobs, R/oci/blobs/sha256 are
// mode 0755, index.json, oci-layout and blobs 0644 or 0444. Its rootfs,
// leases and locks stay 0700 and are never used: a reader copies the image
// it wants into its own store (CopyImage) and unpacks it there, as its own
// files, which is what a sandbox of an unprivileged user can use.

// sharedDirMode is the mode of a shared store's layout directories.
const sharedDirMode = 0o755

// OpenShared opens (creating if needed) the shared store at root for its
// owner to fill: Open, then the OCI layout made readable by every user.
func OpenShared(root string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(root), sharedDirMode); err != nil {
		return nil, fmt.Errorf("shared image store: %w", err)
	}
	s, err := Open(root)
	if err != nil {
		return nil, err
	}
	s.shared = true
	for _, d := range []string{s.root, s.ociDir(), filepath.Join(s.ociDir(), "blobs"), filepath.Join(s.ociDir(), "blobs", "sha256")} {
		if err := os.Chmod(d, sharedDirMode); err != nil {
			return nil, fmt.Errorf("shared image store: %w", err)
		}
	}
	return s, nil
}

// OpenReadOnly opens the store at root for reading only, as a user other
// than its owner reads a shared store: nothing is created, written or
// locked in it, and blobs are read straight from the OCI layout (and
// verified by whoever copies them). A root without an OCI layout wraps
// errdefs.ErrNotFound.
func OpenReadOnly(root string) (*Store, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	s := &Store{root: root, readOnly: true}
	if _, err := os.Stat(s.indexPath()); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("image store %s: no %s: %w", root, ocispec.ImageIndexFile, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("image store %s: %w", root, err)
	}
	s.content = layoutContent{dir: filepath.Join(s.ociDir(), "blobs")}
	return s, nil
}

// CopyImage copies the image tagged name in src into s under the same
// name, recording source as where it came from, and returns it. Every
// blob is verified against its digest as it is written; blobs s already
// holds are not copied again. src is only read: it may be a read-only
// store of another user (OpenReadOnly). When s is a shared store, the
// copied blobs are made readable by every user. On error nothing is
// tagged.
func (s *Store) CopyImage(ctx context.Context, src *Store, name, source string) (Image, error) {
	if s.readOnly {
		return Image{}, fmt.Errorf("image store %s is read-only: %w", s.root, errdefs.ErrPermissionDenied)
	}
	n, err := ParseName(name)
	if err != nil {
		return Image{}, err
	}
	if !src.readOnly {
		gc, err := lockPath(src.gcLockPath(), unix.LOCK_SH)
		if err != nil {
			return Image{}, err
		}
		defer gc.Unlock()
	}
	img, err := src.Get(ctx, n)
	if err != nil {
		return Image{}, err
	}
	mdesc, err := src.manifestDescriptor(img)
	if err != nil {
		return Image{}, err
	}
	mb, err := src.readBlob(ctx, mdesc)
	if err != nil {
		return Image{}, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return Image{}, fmt.Errorf("image %s: parse manifest: %v: %w", n, err, ErrCorrupt)
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return Image{}, err
	}
	defer gc.Unlock()
	for _, d := range append([]ocispec.Descriptor{m.Config, mdesc}, m.Layers...) {
		if err := s.copyBlob(ctx, src, d); err != nil {
			return Image{}, fmt.Errorf("copy image %s: %w", n, err)
		}
	}
	return s.tagChecked(ctx, n, []ocispec.Descriptor{mdesc}, source)
}

// copyBlob copies the blob desc from src into s, verifying it.
func (s *Store) copyBlob(ctx context.Context, src *Store, desc ocispec.Descriptor) error {
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("blob digest %q: %v: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
	}
	ra, err := src.content.ReaderAt(ctx, desc)
	if err != nil {
		return fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	defer ra.Close()
	if ra.Size() != desc.Size {
		return fmt.Errorf("blob %s is %d bytes, expected %d: %w", desc.Digest, ra.Size(), desc.Size, ErrCorrupt)
	}
	if err := s.writeBlob(ctx, content.NewReader(ra), desc); err != nil {
		return err
	}
	if s.shared {
		p := filepath.Join(s.ociDir(), "blobs", desc.Digest.Algorithm().String(), desc.Digest.Encoded())
		if err := os.Chmod(p, 0o444); err != nil {
			return fmt.Errorf("blob %s: %w", desc.Digest, err)
		}
	}
	return nil
}

// layoutContent reads blobs from an OCI layout's blobs directory, without
// writing anything: the content of a read-only store. What is not reading
// is refused.
type layoutContent struct {
	dir string
}

var _ content.Store = layoutContent{}

func (l layoutContent) path(dgst digest.Digest) (string, error) {
	if err := dgst.Validate(); err != nil {
		return "", fmt.Errorf("digest %q: %v: %w", dgst, err, errdefs.ErrInvalidArgument)
	}
	return filepath.Join(l.dir, dgst.Algorithm().String(), dgst.Encoded()), nil
}

func (l layoutContent) Info(_ context.Context, dgst digest.Digest) (content.Info, error) {
	p, err := l.path(dgst)
	if err != nil {
		return content.Info{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return content.Info{}, fmt.Errorf("blob %s: %w", dgst, errdefs.ErrNotFound)
		}
		return content.Info{}, err
	}
	return content.Info{Digest: dgst, Size: fi.Size(), CreatedAt: fi.ModTime(), UpdatedAt: fi.ModTime()}, nil
}

func (l layoutContent) ReaderAt(_ context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	p, err := l.path(desc.Digest)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("blob %s: %w", desc.Digest, errdefs.ErrNotFound)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("blob %s is not a regular file: %w", desc.Digest, ErrCorrupt)
	}
	return fileReaderAt{f: f, size: fi.Size()}, nil
}

func readOnlyErr() error {
	return fmt.Errorf("read-only image store: %w", errdefs.ErrPermissionDenied)
}

func (layoutContent) Update(context.Context, content.Info, ...string) (content.Info, error) {
	return content.Info{}, readOnlyErr()
}
func (layoutContent) Walk(context.Context, content.WalkFunc, ...string) error { return readOnlyErr() }
func (layoutContent) Delete(context.Context, digest.Digest) error             { return readOnlyErr() }
func (layoutContent) Status(context.Context, string) (content.Status, error) {
	return content.Status{}, readOnlyErr()
}
func (layoutContent) ListStatuses(context.Context, ...string) ([]content.Status, error) {
	return nil, readOnlyErr()
}
func (layoutContent) Abort(context.Context, string) error { return readOnlyErr() }
func (layoutContent) Writer(context.Context, ...content.WriterOpt) (content.Writer, error) {
	return nil, readOnlyErr()
}

type fileReaderAt struct {
	f    *os.File
	size int64
}

func (r fileReaderAt) ReadAt(p []byte, off int64) (int, error) { return r.f.ReadAt(p, off) }
func (r fileReaderAt) Size() int64                             { return r.size }
func (r fileReaderAt) Close() error                            { return r.f.Close() }

var _ io.ReaderAt = fileReaderAt{}
