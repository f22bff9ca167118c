package overlay

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// Content gives a builder direct access to the store's content: it reads
// the blobs of stored images and writes the blobs of a new one, which
// TagManifest then names. Until release is called garbage collection waits,
// so blobs written but not yet tagged survive, and blobs read stay.
//
// Writers must go through content.Store's Writer, which verifies every blob
// against its digest on commit.
func (s *Store) Content() (cs content.Store, release func(), err error) {
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return nil, nil, err
	}
	return s.content, gc.Unlock, nil
}

// TagManifest tags name to the image manifest desc (or the one for this
// platform, if desc is an index) whose blobs are already in the store, as a
// builder or a registry pull writing through Content leaves them. It checks
// the manifest, config and layers as Import does; on error nothing is
// tagged. The image's Source is SourceBuild.
func (s *Store) TagManifest(ctx context.Context, name string, desc ocispec.Descriptor) (Image, error) {
	return s.TagManifestFrom(ctx, name, desc, SourceBuild)
}

// TagManifestFrom is TagManifest for an image that came from source (a
// registry reference, for a pull).
func (s *Store) TagManifestFrom(ctx context.Context, name string, desc ocispec.Descriptor, source string) (Image, error) {
	name, err := ParseName(name)
	if err != nil {
		return Image{}, err
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return Image{}, err
	}
	defer gc.Unlock()
	return s.tagChecked(ctx, name, []ocispec.Descriptor{desc}, source)
}

// tagChecked selects the manifest for this platform among descs, checks
// that its config and layers are stored and complete, and tags it name.
// The caller holds the gc lock shared.
func (s *Store) tagChecked(ctx context.Context, name string, descs []ocispec.Descriptor, source string) (Image, error) {
	desc, err := s.selectManifest(ctx, descs)
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	img, err := s.loadImage(ctx, name, desc)
	if err != nil {
		return Image{}, err
	}
	for _, l := range img.Layers {
		if !isLayerType(l.MediaType) {
			return Image{}, fmt.Errorf("image %s: layer %s has unsupported media type %q: %w", name, l.Digest, l.MediaType, errdefs.ErrNotImplemented)
		}
		info, err := s.content.Info(ctx, l.Digest)
		if err != nil {
			return Image{}, fmt.Errorf("image %s: layer %s: %w", name, l.Digest, err)
		}
		if info.Size != l.Size {
			return Image{}, fmt.Errorf("image %s: layer %s is %d bytes, manifest says %d: %w", name, l.Digest, info.Size, l.Size, ErrCorrupt)
		}
	}
	if err := s.tag(name, desc, source); err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	img.Source = source
	return img, nil
}
