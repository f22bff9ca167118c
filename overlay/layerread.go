package overlay

import (
	"context"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// OpenLayer returns layer desc of a stored image as the uncompressed tar
// it holds. Collection waits until the reader is closed.
func (s *Store) OpenLayer(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if err := desc.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("layer digest: %w", err)
	}
	cs, release, err := s.Content()
	if err != nil {
		return nil, err
	}
	ra, err := cs.ReaderAt(ctx, desc)
	if err != nil {
		release()
		return nil, err
	}
	ds, err := compression.DecompressStream(content.NewReader(ra))
	if err != nil {
		ra.Close()
		release()
		return nil, err
	}
	return &layerReader{ReadCloser: ds, close: func() { ra.Close(); release() }}, nil
}

type layerReader struct {
	io.ReadCloser
	close func()
}

func (l *layerReader) Close() error {
	err := l.ReadCloser.Close()
	l.close()
	return err
}

// UpperLayer writes the layer of gVisor's upper tar r (runsc's export of
// a sandbox's changes) to w, as a snapshot stores it, leaving out the
// paths under exclude. r's entries must come in name order, as the runsc
// hutch builds writes them (ErrUnordered otherwise).
func UpperLayer(w io.Writer, r io.Reader, exclude []string) error {
	return streamLayerTar(w, r, exclude, nil)
}
