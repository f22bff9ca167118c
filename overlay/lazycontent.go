package overlay

import (
	"context"
	"sync"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// lazyContent opens the local content store in dir on first use. Opening
// one probes the filesystem for fs-verity; commands that read no blob
// (exec, ls, inspect, stop) need not pay for it.
type lazyContent struct {
	open func() (content.Store, error)
}

func newLazyContent(dir string) *lazyContent {
	return &lazyContent{open: sync.OnceValues(func() (content.Store, error) { return contentStore(dir) })}
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

func (l *lazyContent) ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	cs, err := l.open()
	if err != nil {
		return nil, err
	}
	return cs.ReaderAt(ctx, desc)
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
