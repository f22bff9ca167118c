package overlay

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"runtime"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// Import reads an OCI archive from r and tags its image as name.
//
// The archive is a tar (optionally gzip- or zstd-compressed) of an OCI image
// layout, as `buildctl --output type=oci`, skopeo and `docker save` write.
// When index.json holds several manifests, or an index of a multi-platform
// image, the manifest for linux/runtime.GOARCH is chosen; names recorded in the
// archive are ignored. Every blob is verified against its digest while it is
// ingested and a mismatch wraps ErrCorrupt.
//
// Import is atomic: on any error nothing is tagged. Blobs ingested before the
// failure are left for the next Remove or Prune to collect.
func (s *Store) Import(ctx context.Context, name string, r io.Reader) (Image, error) {
	name, err := ParseName(name)
	if err != nil {
		return Image{}, err
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return Image{}, err
	}
	defer gc.Unlock()

	ds, err := compression.DecompressStream(r)
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", name, err)
	}
	defer ds.Close()

	var (
		indexJSON []byte
		sawLayout bool
		tr        = tar.NewReader(ds)
	)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Image{}, fmt.Errorf("import %s: read archive: %w", name, err)
		}
		p := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		switch {
		case p == ocispec.ImageLayoutFile:
			b, err := readLimited(tr, maxMetadataSize)
			if err != nil {
				return Image{}, fmt.Errorf("import %s: %s: %w", name, p, err)
			}
			var layout ocispec.ImageLayout
			if err := json.Unmarshal(b, &layout); err != nil || layout.Version == "" {
				return Image{}, fmt.Errorf("import %s: bad %s: %w", name, p, errdefs.ErrInvalidArgument)
			}
			sawLayout = true
		case p == ocispec.ImageIndexFile:
			if indexJSON, err = readLimited(tr, maxMetadataSize); err != nil {
				return Image{}, fmt.Errorf("import %s: %s: %w", name, p, err)
			}
		case strings.HasPrefix(p, "blobs/") && (hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA):
			parts := strings.Split(p, "/")
			if len(parts) != 3 {
				continue
			}
			dgst := digest.NewDigestFromEncoded(digest.Algorithm(parts[1]), parts[2])
			if err := dgst.Validate(); err != nil {
				return Image{}, fmt.Errorf("import %s: blob %q: %v: %w", name, p, err, errdefs.ErrInvalidArgument)
			}
			if err := s.writeBlob(ctx, tr, ocispec.Descriptor{Digest: dgst, Size: hdr.Size}); err != nil {
				return Image{}, fmt.Errorf("import %s: %w", name, err)
			}
		}
	}
	if indexJSON == nil {
		return Image{}, fmt.Errorf("import %s: not an OCI archive (no index.json): %w", name, errdefs.ErrInvalidArgument)
	}
	if !sawLayout {
		log.G(ctx).WithField("image", name).Debug("archive has no oci-layout file")
	}
	var idx ocispec.Index
	if err := json.Unmarshal(indexJSON, &idx); err != nil {
		return Image{}, fmt.Errorf("import %s: parse index.json: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	img, err := s.tagChecked(ctx, name, idx.Manifests, SourceImport)
	if err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	return img, nil
}

// selectManifest picks the image manifest for this platform among descs,
// descending into nested indexes.
func (s *Store) selectManifest(ctx context.Context, descs []ocispec.Descriptor) (ocispec.Descriptor, error) {
	var manifests []ocispec.Descriptor
	var walk func(ds []ocispec.Descriptor, depth int) error
	walk = func(ds []ocispec.Descriptor, depth int) error {
		if depth > 4 {
			return fmt.Errorf("image indexes nested too deep: %w", errdefs.ErrInvalidArgument)
		}
		for _, d := range ds {
			if d.Annotations["vnd.docker.reference.type"] == "attestation-manifest" {
				continue
			}
			switch d.MediaType {
			case ocispec.MediaTypeImageManifest, mediaTypeDockerManifest:
				manifests = append(manifests, d)
			case ocispec.MediaTypeImageIndex, mediaTypeDockerManifestList:
				b, err := s.readBlob(ctx, d)
				if err != nil {
					return fmt.Errorf("index %s: %w", d.Digest, err)
				}
				var idx ocispec.Index
				if err := json.Unmarshal(b, &idx); err != nil {
					return fmt.Errorf("parse index %s: %v: %w", d.Digest, err, errdefs.ErrInvalidArgument)
				}
				if err := walk(idx.Manifests, depth+1); err != nil {
					return err
				}
			default:
				log.G(ctx).WithField("digest", d.Digest).WithField("mediaType", d.MediaType).Debug("ignoring descriptor")
			}
		}
		return nil
	}
	if err := walk(descs, 0); err != nil {
		return ocispec.Descriptor{}, err
	}
	if len(manifests) == 0 {
		return ocispec.Descriptor{}, fmt.Errorf("archive holds no image manifest: %w", errdefs.ErrInvalidArgument)
	}
	var found []string
	for _, d := range manifests {
		p := d.Platform
		if p == nil {
			p = s.configPlatform(ctx, d)
		}
		if p == nil {
			if len(manifests) == 1 {
				return d, nil
			}
			continue
		}
		if p.OS == "linux" && p.Architecture == runtime.GOARCH {
			return d, nil
		}
		found = append(found, p.OS+"/"+p.Architecture)
	}
	return ocispec.Descriptor{}, fmt.Errorf("archive has no linux/%s image (found %s): %w",
		runtime.GOARCH, strings.Join(found, ", "), errdefs.ErrNotFound)
}

// configPlatform reads the platform a manifest's config declares, or nil.
func (s *Store) configPlatform(ctx context.Context, desc ocispec.Descriptor) *ocispec.Platform {
	mb, err := s.readBlob(ctx, desc)
	if err != nil {
		return nil
	}
	var m ocispec.Manifest
	if json.Unmarshal(mb, &m) != nil {
		return nil
	}
	cb, err := s.readBlob(ctx, m.Config)
	if err != nil {
		return nil
	}
	var cfg ocispec.Image
	if json.Unmarshal(cb, &cfg) != nil || cfg.OS == "" {
		return nil
	}
	return &cfg.Platform
}

func isLayerType(mt string) bool {
	switch mt {
	case ocispec.MediaTypeImageLayer, ocispec.MediaTypeImageLayerGzip, ocispec.MediaTypeImageLayerZstd,
		ocispec.MediaTypeImageLayerNonDistributable, ocispec.MediaTypeImageLayerNonDistributableGzip, //nolint:staticcheck // still found in the wild
		ocispec.MediaTypeImageLayerNonDistributableZstd, //nolint:staticcheck
		mediaTypeDockerLayer, mediaTypeDockerLayerGzip:
		return true
	}
	return false
}

// dockerManifestFile is the manifest of Docker's image archives (`docker
// save`), one entry per image.
const dockerManifestFile = "manifest.json"

// dockerManifest is one entry of dockerManifestFile: paths in the archive.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// blobPath is the path of blob d in an OCI layout.
func blobPath(d digest.Digest) string { return "blobs/" + d.Algorithm().String() + "/" + d.Encoded() }

// Export writes the image tagged name to w as an OCI archive: an
// uncompressed tar of an OCI image layout whose index.json names the one
// manifest with an org.opencontainers.image.ref.name annotation. Import,
// skopeo and buildctl accept it, and so does `docker load`
// (dockerManifestFile). The output depends only on the image's
// blobs and name. Blobs are verified while they are copied; a mismatch wraps
// ErrCorrupt (w then holds a partial archive).
func (s *Store) Export(ctx context.Context, name string, w io.Writer) error {
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer gc.Unlock()
	img, err := s.Get(ctx, name)
	if err != nil {
		return err
	}
	mdesc, err := s.manifestDescriptor(img)
	if err != nil {
		return err
	}
	mb, err := s.readBlob(ctx, mdesc)
	if err != nil {
		return err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return fmt.Errorf("parse manifest: %v: %w", err, ErrCorrupt)
	}

	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	idx := newIndex()
	mdesc.Annotations = map[string]string{ocispec.AnnotationRefName: img.Name}
	idx.Manifests = []ocispec.Descriptor{mdesc}
	indexJSON, err := json.Marshal(idx)
	if err != nil {
		return err
	}

	// Docker's own archive manifest too, as `docker save` writes beside
	// an OCI layout: `docker load` of Docker Engines before 25 reads
	// only that (a Docker sandbox's, docs/docker.md).
	dm := dockerManifest{Config: blobPath(m.Config.Digest), RepoTags: []string{img.Name}}
	for _, l := range m.Layers {
		dm.Layers = append(dm.Layers, blobPath(l.Digest))
	}
	manifestJSON, err := json.Marshal([]dockerManifest{dm})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(tarHeader(d, tar.TypeDir, 0o755, 0)); err != nil {
			return err
		}
	}
	seen := map[digest.Digest]bool{}
	for _, d := range append([]ocispec.Descriptor{mdesc, m.Config}, m.Layers...) {
		if seen[d.Digest] {
			continue
		}
		seen[d.Digest] = true
		if err := s.exportBlob(ctx, tw, d); err != nil {
			return fmt.Errorf("export %s: %w", img.Name, err)
		}
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{ocispec.ImageLayoutFile, layout}, {ocispec.ImageIndexFile, indexJSON}, {dockerManifestFile, manifestJSON}} {
		if err := tw.WriteHeader(tarHeader(f.name, tar.TypeReg, 0o644, int64(len(f.data)))); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// manifestDescriptor returns the index entry img was loaded from.
func (s *Store) manifestDescriptor(img Image) (ocispec.Descriptor, error) {
	idx, err := s.readIndex()
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	for _, d := range idx.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] == img.Name && d.Digest == img.Digest {
			return ocispec.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size}, nil
		}
	}
	return ocispec.Descriptor{}, notFound(img.Name)
}

// exportBlob copies one verified blob into tw.
func (s *Store) exportBlob(ctx context.Context, tw *tar.Writer, desc ocispec.Descriptor) error {
	ra, err := s.content.ReaderAt(ctx, desc)
	if err != nil {
		return fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	defer ra.Close()
	if ra.Size() != desc.Size {
		return fmt.Errorf("blob %s is %d bytes, expected %d: %w", desc.Digest, ra.Size(), desc.Size, ErrCorrupt)
	}
	p := path.Join("blobs", desc.Digest.Algorithm().String(), desc.Digest.Encoded())
	if err := tw.WriteHeader(tarHeader(p, tar.TypeReg, 0o644, desc.Size)); err != nil {
		return err
	}
	dg := desc.Digest.Algorithm().Digester()
	if _, err := io.Copy(io.MultiWriter(tw, dg.Hash()), content.NewReader(ra)); err != nil {
		return err
	}
	if dg.Digest() != desc.Digest {
		return fmt.Errorf("blob %s: %w", desc.Digest, ErrCorrupt)
	}
	return nil
}

// tarEpoch is the modification time of every entry the store writes itself,
// so that identical content gives identical archives.
var tarEpoch = time.Unix(0, 0).UTC()

func tarHeader(name string, typ byte, mode, size int64) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Mode:     mode,
		Size:     size,
		ModTime:  tarEpoch,
	}
}

func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes: %w", limit, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

// Descriptor is the descriptor of img's manifest as the store holds it
// (media type, digest, size): what a registry push sends last.
func (s *Store) Descriptor(img Image) (ocispec.Descriptor, error) {
	return s.manifestDescriptor(img)
}
