package registry

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/moby/buildkit/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"

	"hutch.dev/hutch/overlay"
)

// maxConcurrentBlobs bounds the blobs a pull or push moves at once.
const maxConcurrentBlobs = 3

// Platform is the platform pulls choose from multi-platform images:
// linux on this machine's architecture.
func Platform() ocispec.Platform {
	return platforms.Normalize(ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH})
}

// Pull fetches the image ref names ("python:3.12", "ghcr.io/o/r:tag",
// "host:port/r@sha256:...") into store and names it by its full reference
// (overlay.RegistryName). From a multi-platform index it fetches the
// manifest for Platform only. Every blob is verified against its digest (a
// mismatch wraps overlay.ErrCorrupt); on any error nothing is named and no
// partial blob is left. status, if set, receives progress and is closed
// when the pull ends.
func Pull(ctx context.Context, store *overlay.Store, ref string, o Options, status chan *client.SolveStatus) (img overlay.Image, err error) {
	p := newProgress(status, "pull "+ref)
	defer func() { p.finish(err) }()
	name, err := overlay.RegistryName(ref)
	if err != nil {
		return overlay.Image{}, err
	}
	resolver := o.resolver()
	_, desc, err := resolver.Resolve(ctx, name)
	if err != nil {
		return overlay.Image{}, explain("pull", name, err)
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		return overlay.Image{}, explain("pull", name, err)
	}
	cs, release, err := store.Content()
	if err != nil {
		return overlay.Image{}, err
	}
	defer release()

	ing := &ingester{Ingester: cs}
	defer func() {
		if err != nil {
			ing.abortAll(ctx, cs)
		}
	}()
	var (
		mu        sync.Mutex
		manifests []ocispec.Descriptor
	)
	record := images.HandlerFunc(func(_ context.Context, d ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if images.IsManifestType(d.MediaType) {
			mu.Lock()
			manifests = append(manifests, d)
			mu.Unlock()
		}
		return nil, nil
	})
	match := platforms.Only(Platform())
	handler := images.Handlers(
		remotes.FetchHandler(ing, progressFetcher{fetcher, p}),
		record,
		images.LimitManifests(images.FilterPlatforms(images.ChildrenHandler(cs), match), match, 1),
	)
	if err := images.Dispatch(ctx, handler, semaphore.NewWeighted(maxConcurrentBlobs), desc); err != nil {
		if errdefs.IsFailedPrecondition(err) {
			// containerd's content writer refuses content whose digest
			// or size differs from the descriptor this way.
			return overlay.Image{}, fmt.Errorf("pull %s: %v: %w", name, err, overlay.ErrCorrupt)
		}
		return overlay.Image{}, explain("pull", name, err)
	}
	if len(manifests) != 1 {
		return overlay.Image{}, fmt.Errorf("pull %s: no image for %s (found %d matching manifests): %w",
			name, platforms.Format(Platform()), len(manifests), errdefs.ErrNotFound)
	}
	img, err = store.TagManifestFrom(ctx, name, manifests[0], name)
	if err != nil {
		return overlay.Image{}, fmt.Errorf("pull %s: %w", name, err)
	}
	log.G(ctx).WithField("image", name).WithField("digest", img.Digest).Debug("pulled")
	return img, nil
}

// progressFetcher reports the bytes its fetches read.
type progressFetcher struct {
	remotes.Fetcher
	p *progress
}

func (f progressFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := f.Fetcher.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	return f.p.wrap(rc, desc, "pull"), nil
}

// ingester remembers the refs it opened writers for, so that a failed pull
// can abort the ingests it left half written.
type ingester struct {
	content.Ingester
	mu   sync.Mutex
	refs []string
}

func (i *ingester) Writer(ctx context.Context, opts ...content.WriterOpt) (content.Writer, error) {
	var wo content.WriterOpts
	for _, o := range opts {
		if err := o(&wo); err != nil {
			return nil, err
		}
	}
	i.mu.Lock()
	i.refs = append(i.refs, wo.Ref)
	i.mu.Unlock()
	return i.Ingester.Writer(ctx, opts...)
}

func (i *ingester) abortAll(ctx context.Context, cs content.IngestManager) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for _, ref := range i.refs {
		if err := cs.Abort(context.WithoutCancel(ctx), ref); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("ref", ref).Debug("abort ingest")
		}
	}
}
