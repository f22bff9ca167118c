package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/overlay"
)

// DefaultSharedImages is the shared image store: images root published
// (ShareImage) for every user of the host, outside root's state root,
// which stays owner-only (docs/decisions/0021-rootless-image-store.md).
const DefaultSharedImages = "/var/lib/hutch-images"

// SourceShared is the Source of an image copied from the shared store.
const SourceShared = "shared"

// SharedImagesDir is the shared image store of o: Options.SharedImages,
// else $HUTCH_SHARED_IMAGES (set and empty: none), else
// DefaultSharedImages.
func sharedImagesDir(o Options) string {
	if o.SharedImages != "" {
		return o.SharedImages
	}
	if v, ok := os.LookupEnv("HUTCH_SHARED_IMAGES"); ok {
		return v
	}
	return DefaultSharedImages
}

// SharedImages is the directory of the shared image store this engine
// reads and (as root) fills; empty when there is none.
func (e *Engine) SharedImages() string { return sharedImagesDir(e.opts) }

// SharedStore opens the shared image store for reading. It wraps
// errdefs.ErrNotFound when there is none, and errdefs.ErrPermissionDenied
// when another user than root (or the caller) could change what it holds:
// its images would then not be root's.
func (e *Engine) SharedStore() (*overlay.Store, error) {
	dir := e.SharedImages()
	if dir == "" {
		return nil, fmt.Errorf("no shared image store configured: %w", errdefs.ErrNotFound)
	}
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("shared image store %s does not exist: %w", dir, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("shared image store: %w", err)
	}
	if err := checkSharedDir(dir); err != nil {
		return nil, err
	}
	return overlay.OpenReadOnly(dir)
}

// checkSharedDir refuses a shared store that someone other than root or
// the caller controls: the store, its OCI layout and every directory above
// them must be owned by root or the caller and writable by no one else
// (unless sticky, like /tmp, for the directories above).
func checkSharedDir(dir string) error {
	uid := uint32(os.Geteuid())
	var st unix.Stat_t
	for _, p := range []string{filepath.Join(dir, "oci", "index.json"), filepath.Join(dir, "oci", "blobs", "sha256"), filepath.Join(dir, "oci", "blobs"), filepath.Join(dir, "oci"), dir} {
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("shared image store %s: %w", dir, &os.PathError{Op: "lstat", Path: p, Err: err})
		}
		if st.Uid != 0 && st.Uid != uid {
			return fmt.Errorf("shared image store %s: %s is owned by uid %d, neither root nor you; not using it: %w", dir, p, st.Uid, errdefs.ErrPermissionDenied)
		}
		if st.Mode&0o022 != 0 {
			return fmt.Errorf("shared image store %s: %s is writable by other users (mode %04o); not using it: %w", dir, p, st.Mode&0o7777, errdefs.ErrPermissionDenied)
		}
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("shared image store %s: %s: %w", dir, d, err)
		}
		if st.Uid != 0 && st.Uid != uid {
			return fmt.Errorf("shared image store %s: directory %s above it is owned by uid %d; not using it: %w", dir, d, st.Uid, errdefs.ErrPermissionDenied)
		}
		if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return fmt.Errorf("shared image store %s: directory %s above it is writable by other users; not using it: %w", dir, d, errdefs.ErrPermissionDenied)
		}
		if d == "/" {
			return nil
		}
	}
}

// fromShared copies the image name from the shared store into the
// engine's own store (where it is unpacked as the caller's files, as an
// unprivileged sandbox needs) and returns it. The copy's Source is
// SourceShared. It wraps errdefs.ErrNotFound when there is no shared store
// or it lacks the image.
func (e *Engine) fromShared(ctx context.Context, name string) (overlay.Image, error) {
	shared, err := e.SharedStore()
	if err != nil {
		return overlay.Image{}, err
	}
	if filepath.Clean(shared.Root()) == filepath.Clean(e.images.Root()) {
		return overlay.Image{}, fmt.Errorf("image %q: %w", name, errdefs.ErrNotFound)
	}
	if _, err := shared.Get(ctx, name); err != nil {
		return overlay.Image{}, err
	}
	log.G(ctx).WithField("image", name).WithField("store", shared.Root()).Debug("copying image from the shared store")
	img, err := e.images.CopyImage(ctx, shared, name, SourceShared)
	if err != nil {
		return overlay.Image{}, fmt.Errorf("image %s from the shared store %s: %w", name, shared.Root(), err)
	}
	return img, nil
}

// ShareImage publishes the image name of this engine's store in the shared
// image store, for every user of the host (their sandboxes copy it on
// first use). Only root may: the shared store is trusted for being root's.
// The shared store's OCI layout is readable by all; nothing else of the
// state root is.
func (e *Engine) ShareImage(ctx context.Context, name string) (overlay.Image, error) {
	dir := e.SharedImages()
	if dir == "" {
		return overlay.Image{}, fmt.Errorf("no shared image store configured (HUTCH_SHARED_IMAGES is empty): %w", errdefs.ErrInvalidArgument)
	}
	if e.rootless {
		return overlay.Image{}, fmt.Errorf("sharing images needs root: the shared store %s is trusted by other users for being root's: %w", dir, errdefs.ErrPermissionDenied)
	}
	norm, err := overlay.ParseName(name)
	if err != nil {
		return overlay.Image{}, err
	}
	if _, err := e.images.Get(ctx, norm); err != nil {
		return overlay.Image{}, err
	}
	shared, err := overlay.OpenShared(dir)
	if err != nil {
		return overlay.Image{}, err
	}
	if err := checkSharedDir(dir); err != nil {
		return overlay.Image{}, err
	}
	return shared.CopyImage(ctx, e.images, norm, overlay.SourceImport)
}

// UnshareImage removes the image name from the shared image store (root
// only). Users who copied it keep their copies.
func (e *Engine) UnshareImage(ctx context.Context, name string) error {
	dir := e.SharedImages()
	if e.rootless {
		return fmt.Errorf("changing the shared image store needs root: %w", errdefs.ErrPermissionDenied)
	}
	if dir == "" {
		return fmt.Errorf("no shared image store configured: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(dir, "oci", "index.json")); err != nil {
		return fmt.Errorf("image %q: no shared image store at %s: %w", name, dir, errdefs.ErrNotFound)
	}
	shared, err := overlay.OpenShared(dir)
	if err != nil {
		return err
	}
	return shared.Remove(ctx, name)
}
