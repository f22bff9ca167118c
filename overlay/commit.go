package overlay

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/errdefs"
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
	// allowed). It is stored gzip-compressed.
	Layer io.Reader
	// Config, when set, replaces the parent's runtime config
	// (Config.Config); nil keeps the parent's, or none for a base image.
	Config *ocispec.ImageConfig
	// History is the created_by text of the layer's history entry.
	History string
	// Created is recorded as the config's and the history entry's creation
	// time; nil leaves both unset so that equal input gives equal digests.
	Created *time.Time
}

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

	layer, diffID, err := s.writeLayer(ctx, opts.Layer)
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

// writeLayer gzips the uncompressed tar r into the content store and returns
// the layer's descriptor and diff_id.
func (s *Store) writeLayer(ctx context.Context, r io.Reader) (ocispec.Descriptor, digest.Digest, error) {
	ref := "sbx-" + randomHex()
	w, err := content.OpenWriter(ctx, s.content, content.WithRef(ref))
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	defer w.Close()
	committed := false
	defer func() {
		if !committed {
			_ = s.content.Abort(ctx, ref)
		}
	}()

	diff := digest.Canonical.Digester()
	cw := &countingWriter{w: w}
	// The zero gzip header (no name, no mtime) and a fixed level make the
	// compressed bytes a function of the input only.
	gz, err := gzip.NewWriterLevel(cw, gzip.DefaultCompression)
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	if _, err := io.Copy(gz, io.TeeReader(r, diff.Hash())); err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("read layer: %w", err)
	}
	if err := gz.Close(); err != nil {
		return ocispec.Descriptor{}, "", err
	}
	dgst := w.Digest()
	if err := w.Commit(ctx, cw.n, dgst); err != nil && !errdefs.IsAlreadyExists(err) {
		return ocispec.Descriptor{}, "", fmt.Errorf("store layer: %w", err)
	}
	committed = true
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: dgst, Size: cw.n}, diff.Digest(), nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
