package overlay

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// lazyContent opens the local content store in dir on first use. Opening
// one probes the filesystem for fs-verity; commands that read no blob
// (exec, ls, inspect, stop) need not pay for it, nor do those that only
// read blobs (a create's image lookup): ReaderAt opens none.
type lazyContent struct {
	dir  string
	open func() (content.Store, error)
}

func newLazyContent(dir string) *lazyContent {
	return &lazyContent{dir: dir, open: sync.OnceValues(func() (content.Store, error) { return contentStore(dir) })}
}

func (l *lazyContent) Info(ctx context.Context, dgst digest.Digest) (content.Info, error) {
	cs, err := l.open()
	if err != nil {
		return content.Info{}, err
	}
	return cs.Info(ctx, dgst)
}

func (l *lazyContent) Update(ctx context.Context, info content.Info, fieldpaths ...string) (content.Info, error) {
	cs, err := l.open()
	if err != nil {
		return content.Info{}, err
	}
	return cs.Update(ctx, info, fieldpaths...)
}

func (l *lazyContent) Walk(ctx context.Context, fn content.WalkFunc, filters ...string) error {
	cs, err := l.open()
	if err != nil {
		return err
	}
	return cs.Walk(ctx, fn, filters...)
}

func (l *lazyContent) Delete(ctx context.Context, dgst digest.Digest) error {
	cs, err := l.open()
	if err != nil {
		return err
	}
	return cs.Delete(ctx, dgst)
}

// ReaderAt opens the blob where the local store keeps it, as the store's
// own ReaderAt does, without opening the store.
func (l *lazyContent) ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	if err := desc.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("cannot calculate blob path from invalid digest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	p := filepath.Join(l.dir, "blobs", desc.Digest.Algorithm().String(), desc.Digest.Encoded())
	r, err := local.OpenReader(p)
	if err != nil {
		return nil, fmt.Errorf("blob %s expected at %s: %w", desc.Digest, p, err)
	}
	return r, nil
}

func (l *lazyContent) Status(ctx context.Context, ref string) (content.Status, error) {
	cs, err := l.open()
	if err != nil {
		return content.Status{}, err
	}
	return cs.Status(ctx, ref)
}

func (l *lazyContent) ListStatuses(ctx context.Context, filters ...string) ([]content.Status, error) {
	cs, err := l.open()
	if err != nil {
		return nil, err
	}
	return cs.ListStatuses(ctx, filters...)
}

func (l *lazyContent) Abort(ctx context.Context, ref string) error {
	cs, err := l.open()
	if err != nil {
		return err
	}
	return cs.Abort(ctx, ref)
}

func (l *lazyContent) Writer(ctx context.Context, opts ...content.WriterOpt) (content.Writer, error) {
	cs, err := l.open()
	if err != nil {
		return nil, err
	}
	return cs.Writer(ctx, opts...)
}
