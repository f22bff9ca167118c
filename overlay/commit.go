package overlay

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// CommitOptions describes one layer added on top of an optional parent
// image by Commit.
type CommitOptions struct {
	// Name tags the new image.
	Name string
	// Parent is the image the layer goes on top of; nil makes a base image
	// with only this layer.
	Parent *Image
	// Layer is an uncompressed tar stream of an OCI layer (whiteouts
	// allowed). It is stored compressed as Compression says.
	Layer io.Reader
	// Compression of the stored layer; the zero value is gzip.
	Compression Compression
	// Config, when set, replaces the parent's runtime config
	// (Config.Config); nil keeps the parent's, or none for a base image.
	Config *ocispec.ImageConfig
	// History is the created_by text of the layer's history entry.
	History string
	// Created is recorded as the config's and the history entry's creation
	// time; nil leaves both unset so that equal input gives equal digests.
	Created *time.Time
}

// Compression is how Commit compresses a layer. Both are OCI layer media
// types that Import, containerd and registries accept; what differs is the
// cost of writing them.
type Compression int

const (
	// Gzip writes application/vnd.oci.image.layer.v1.tar+gzip, which every
	// OCI tool reads, at about 30 MB/s per core.
	Gzip Compression = iota
	// Zstd writes application/vnd.oci.image.layer.v1.tar+zstd (image-spec
	// 1.1; containerd 1.5+, Docker 23+, Podman) at several hundred MB/s,
	// and stores data that does not compress as it is.
	Zstd
	// ZstdUnlessIncompressible writes Zstd, or a plain
	// application/vnd.oci.image.layer.v1.tar when the layer's first
	// compressSample bytes do not compress (media, archives, random data):
	// its digest is then its diff_id, hashed once, and no time goes to
	// compressing it. The choice depends on the layer's bytes only.
	ZstdUnlessIncompressible
	// uncompressed is ZstdUnlessIncompressible's other choice.
	uncompressed
)

// compressSample is how much of a layer ZstdUnlessIncompressible looks
// at to choose; a layer is incompressible when zstd saves less than a
// sixteenth of it. zstd tries compressProbes pieces of compressProbe
// bytes spread evenly over the sample, not all of it: all 4 MiB took 7-30
// ms here, while the store waited for the choice.
const (
	compressSample = 4 << 20
	compressProbe  = 64 << 10
	compressProbes = 16
)

// Commit stores opts.Layer as a new layer on top of opts.Parent and tags the
// resulting image opts.Name, replacing any image of that name.
//
// The output is deterministic: the same parent, layer bytes, config, history
// and creation time always give the same layer, config and manifest digests.
// Commit is atomic: on error nothing is tagged. The parent's blobs must still
// be in the store (an error wrapping errdefs.ErrNotFound otherwise).
func (s *Store) Commit(ctx context.Context, opts CommitOptions) (Image, error) {
	name, err := ParseName(opts.Name)
	if err != nil {
		return Image{}, err
	}
	if opts.Layer == nil {
		return Image{}, fmt.Errorf("commit %s: no layer: %w", name, errdefs.ErrInvalidArgument)
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return Image{}, err
	}
	defer gc.Unlock()

	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	var layers []ocispec.Descriptor
	if p := opts.Parent; p != nil {
		for _, l := range p.Layers {
			if _, err := s.content.Info(ctx, l.Digest); err != nil {
				return Image{}, fmt.Errorf("commit %s: parent %q layer %s: %w", name, p.Name, l.Digest, err)
			}
		}
		cfg = p.Config
		cfg.RootFS.DiffIDs = append([]digest.Digest(nil), p.Config.RootFS.DiffIDs...)
		cfg.History = append([]ocispec.History(nil), p.Config.History...)
		layers = append(layers, p.Layers...)
	}
	if opts.Config != nil {
		cfg.Config = *opts.Config
	}
	var created *time.Time
	if opts.Created != nil {
		t := opts.Created.UTC()
		created = &t
	}
	cfg.Created = created

	layer, diffID, err := s.writeLayer(ctx, opts.Layer, opts.Compression)
	if err != nil {
		return Image{}, fmt.Errorf("commit %s: %w", name, err)
	}
	layers = append(layers, layer)
	cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, diffID)
	cfg.History = append(cfg.History, ocispec.History{Created: created, CreatedBy: opts.History})

	cb, err := json.Marshal(cfg)
	if err != nil {
		return Image{}, err
	}
	cdesc, err := s.writeBytes(ctx, ocispec.MediaTypeImageConfig, cb)
	if err != nil {
		return Image{}, fmt.Errorf("commit %s: config: %w", name, err)
	}
	mb, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    cdesc,
		Layers:    layers,
	})
	if err != nil {
		return Image{}, err
	}
	mdesc, err := s.writeBytes(ctx, ocispec.MediaTypeImageManifest, mb)
	if err != nil {
		return Image{}, fmt.Errorf("commit %s: manifest: %w", name, err)
	}
	img, err := s.loadImage(ctx, name, mdesc)
	if err != nil {
		return Image{}, err
	}
	img.Source = SourceSnapshot
	if err := s.tag(name, mdesc, SourceSnapshot); err != nil {
		return Image{}, fmt.Errorf("commit %s: %w", name, err)
	}
	return img, nil
}

// writeLayer compresses the uncompressed tar r into the content store and
// returns the layer's descriptor and diff_id. Both digests are computed
// while the layer streams through, each on its own goroutine, so nothing is
// read twice. A layer stored uncompressed is hashed once: its digest is
// its diff_id.
func (s *Store) writeLayer(ctx context.Context, r io.Reader, c Compression) (ocispec.Descriptor, digest.Digest, error) {
	if c == ZstdUnlessIncompressible {
		sample := make([]byte, compressSample)
		n, err := io.ReadFull(r, sample)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return ocispec.Descriptor{}, "", fmt.Errorf("read layer: %w", err)
		}
		sample = sample[:n]
		c = Zstd
		if !compresses(sample) {
			c = uncompressed
		}
		// Not io.MultiReader: its WriteTo would copy in 32 KiB pieces.
		r = &prefixReader{prefix: sample, r: r}
	}
	w, err := s.newBlobWriter()
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	var diffID digest.Digest
	var mediaType string
	if c == uncompressed {
		// The blob's digest is the diff_id.
		mediaType = ocispec.MediaTypeImageLayer
		if _, err := io.CopyBuffer(w, r, make([]byte, 1<<20)); err != nil {
			w.abort()
			return ocispec.Descriptor{}, "", fmt.Errorf("read layer: %w", err)
		}
	} else {
		var zw io.WriteCloser
		zw, mediaType, err = newCompressor(w, c)
		if err != nil {
			w.abort()
			return ocispec.Descriptor{}, "", err
		}
		diff := newAsyncDigester()
		_, err = io.Copy(zw, io.TeeReader(r, diff))
		diffID = diff.Digest()
		if err != nil {
			zw.Close()
			w.abort()
			return ocispec.Descriptor{}, "", fmt.Errorf("read layer: %w", err)
		}
		if err := zw.Close(); err != nil {
			w.abort()
			return ocispec.Descriptor{}, "", err
		}
	}
	dgst, size, err := w.commit(s)
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	if diffID == "" {
		diffID = dgst
	}
	return ocispec.Descriptor{MediaType: mediaType, Digest: dgst, Size: size}, diffID, nil
}

// newCompressor returns a compressor writing to w and the media type of
// what it writes. Its output is a function of its input only (no names, no
// times, a fixed level and block layout), so equal layers get equal
// digests.
func newCompressor(w io.Writer, c Compression) (io.WriteCloser, string, error) {
	switch c {
	case Gzip:
		gz, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
		return gz, ocispec.MediaTypeImageLayerGzip, err
	case Zstd:
		// The fastest level: a snapshot is mostly written and read
		// locally, where time matters more than the last percent of size.
		// The encoder's output depends on neither its concurrency nor
		// the sizes of the writes.
		zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2))
		return zw, ocispec.MediaTypeImageLayerZstd, err
	}
	return nil, "", fmt.Errorf("layer compression %d: %w", c, errdefs.ErrInvalidArgument)
}

// prefixReader reads prefix, then r.
type prefixReader struct {
	prefix []byte
	r      io.Reader
}

func (p *prefixReader) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.r.Read(b)
}

// compresses reports whether zstd at its fastest saves at least a
// sixteenth of b, trying compressProbes pieces of it (see compressSample),
// or all of it when it is no longer. An empty b compresses.
func compresses(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return true
	}
	defer enc.Close()
	if len(b) <= compressProbe*compressProbes {
		return len(enc.EncodeAll(b, nil)) < len(b)-len(b)/16
	}
	in, out := 0, 0
	stride := len(b) / compressProbes
	for i := range compressProbes {
		p := b[i*stride : i*stride+compressProbe]
		in += len(p)
		out += len(enc.EncodeAll(p, nil))
	}
	return out < in-in/16
}
