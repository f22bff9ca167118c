package registry

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	"github.com/moby/buildkit/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"

	"hutch.dev/hutch/overlay"
)

// Push sends the image store names to the registry reference ref
// ("host:port/repo:tag"): its layers and config first, then its manifest.
// Blobs the registry has are not sent again. It returns the manifest's
// descriptor. status, if set, receives progress and is closed when the push
// ends.
func Push(ctx context.Context, store *overlay.Store, name, ref string, o Options, status chan *client.SolveStatus) (desc ocispec.Descriptor, err error) {
	p := newProgress(status, "push "+ref)
	defer func() { p.finish(err) }()
	target, err := overlay.RegistryName(ref)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	img, err := store.Get(ctx, name)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc, err = store.Descriptor(img)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	pusher, err := o.resolver().Pusher(ctx, target)
	if err != nil {
		return ocispec.Descriptor{}, explain("push", target, err)
	}
	cs, release, err := store.Content()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer release()
	report := func(h images.Handler) images.Handler {
		return images.HandlerFunc(func(ctx context.Context, d ocispec.Descriptor) ([]ocispec.Descriptor, error) {
			started := time.Now()
			children, err := h.Handle(ctx, d)
			if err == nil && p != nil {
				p.blob(d, "push", started, d.Size, true)
			}
			return children, err
		})
	}
	if err := remotes.PushContent(ctx, pusher, desc, cs, semaphore.NewWeighted(maxConcurrentBlobs), nil, report); err != nil {
		if errdefs.IsFailedPrecondition(err) {
			return ocispec.Descriptor{}, fmt.Errorf("push %s: %v: %w", target, err, overlay.ErrCorrupt)
		}
		return ocispec.Descriptor{}, explain("push", target, err)
	}
	return desc, nil
}
