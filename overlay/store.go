package overlay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// ErrCorrupt is wrapped by every error reporting stored or received data
// whose digest or size differs from what its descriptor promises.
var ErrCorrupt = errors.New("content does not match its digest")

const (
	// maxMetadataSize bounds index, manifest and config blobs read into memory.
	maxMetadataSize = 16 << 20

	mediaTypeDockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
	mediaTypeDockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	mediaTypeDockerConfig       = "application/vnd.docker.container.image.v1+json"
	mediaTypeDockerLayer        = "application/vnd.docker.image.rootfs.diff.tar"
	mediaTypeDockerLayerGzip    = "application/vnd.docker.image.rootfs.diff.tar.gzip"
)

// Store is an image store rooted at one directory. All methods are safe for
// concurrent use by many goroutines and many processes sharing the root:
// index.json changes are serialised by an exclusive flock on R/lock, and
// garbage collection excludes everything that writes blobs or rootfs
// directories through a second lock (R/locks/gc): writers hold it shared,
// collection holds it exclusive.
type Store struct {
	root    string
	content content.Store
	// shared: the store's OCI layout is readable by every user
	// (OpenShared); readOnly: this process only reads it (OpenReadOnly).
	shared, readOnly bool
}

// Image is a tagged image as the store knows it.
type Image struct {
	Name    string        // normalized "repo:tag"
	Digest  digest.Digest // manifest digest
	Config  ocispec.Image // parsed image config (Env, Cmd, Entrypoint, WorkingDir, User in Config.Config)
	Layers  []ocispec.Descriptor
	ChainID digest.Digest // chain ID of Config.RootFS.DiffIDs; names the rootfs directory
	Size    int64         // sum of manifest, config and layer blob sizes
	Created time.Time     // Config.Created, zero if absent
	// Source is where the image came from: SourceBuild, SourceImport,
	// SourceSnapshot, or the registry reference it was pulled from. Empty
	// for images stored before sources were recorded.
	Source string
	// Tagged is when Name was last pointed at this image; zero for
	// images tagged before it was recorded.
	Tagged time.Time
}

// Sources of images other than registries.
const (
	SourceBuild    = "build"
	SourceImport   = "import"
	SourceSnapshot = "snapshot"
)

// annotationSource, on an index.json entry, records Image.Source.
const annotationSource = "dev.hutch.image.source"

// annotationTagged, on an index.json entry, records Image.Tagged.
const annotationTagged = "dev.hutch.image.tagged"

// Open opens the store rooted at root, creating the directory layout if it
// is missing. Opening is cheap; a process may open the same root many times.
func Open(root string) (*Store, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	s := &Store{root: root}
	for _, d := range []string{root, s.ociDir(), filepath.Join(s.ociDir(), "blobs", "sha256"), s.rootfsDir(), s.leaseDir(), s.lockDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create image store: %w", err)
		}
	}
	s.content = newLazyContent(s.ociDir())

	if _, err := os.Stat(s.indexPath()); err == nil {
		return s, nil
	}
	l, err := lockPath(s.indexLockPath(), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	layout, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if _, err := os.Stat(filepath.Join(s.ociDir(), ocispec.ImageLayoutFile)); errors.Is(err, fs.ErrNotExist) {
		if err := writeFileAtomic(filepath.Join(s.ociDir(), ocispec.ImageLayoutFile), layout, 0o644); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(s.indexPath()); errors.Is(err, fs.ErrNotExist) {
		if err := s.writeIndexLocked(newIndex()); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// contentStores holds one local content store per directory: opening one
// probes the filesystem (and logs when fs-verity is unsupported), which a
// process needs to do only once.
var contentStores sync.Map // string -> content.Store

func contentStore(dir string) (content.Store, error) {
	if cs, ok := contentStores.Load(dir); ok {
		return cs.(content.Store), nil
	}
	cs, err := local.NewStore(dir)
	if err != nil {
		return nil, err
	}
	actual, _ := contentStores.LoadOrStore(dir, cs)
	return actual.(content.Store), nil
}

// Root returns the directory the store lives in.
func (s *Store) Root() string { return s.root }

func (s *Store) ociDir() string        { return filepath.Join(s.root, "oci") }
func (s *Store) indexPath() string     { return filepath.Join(s.ociDir(), ocispec.ImageIndexFile) }
func (s *Store) rootfsDir() string     { return filepath.Join(s.root, "rootfs") }
func (s *Store) leaseDir() string      { return filepath.Join(s.root, "leases") }
func (s *Store) lockDir() string       { return filepath.Join(s.root, "locks") }
func (s *Store) indexLockPath() string { return filepath.Join(s.root, "lock") }
func (s *Store) gcLockPath() string    { return filepath.Join(s.lockDir(), "gc") }

// Get returns the image tagged name. A local name ("python:3.12") that no
// image has also finds the image pulled as its registry reference
// ("docker.io/library/python:3.12", see RegistryName), as docker users
// expect. An unknown name yields an error wrapping errdefs.ErrNotFound; a
// malformed one errdefs.ErrInvalidArgument.
func (s *Store) Get(ctx context.Context, name string) (Image, error) {
	n, err := ParseName(name)
	if err != nil {
		return Image{}, err
	}
	idx, err := s.readIndex()
	if err != nil {
		return Image{}, err
	}
	names := []string{n}
	if full, err := RegistryName(name); err == nil && full != n {
		names = append(names, full)
	}
	for _, want := range names {
		for _, d := range idx.Manifests {
			if d.Annotations[ocispec.AnnotationRefName] == want {
				return s.loadImage(ctx, want, d)
			}
		}
	}
	return Image{}, notFound(n)
}

func notFound(name string) error {
	return fmt.Errorf("image %q %w", name, errdefs.ErrNotFound)
}

// List returns every tagged image, sorted by name. Images whose metadata
// cannot be read are logged and left out.
func (s *Store) List(ctx context.Context) ([]Image, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, d := range idx.Manifests {
		name := d.Annotations[ocispec.AnnotationRefName]
		if name == "" {
			continue
		}
		img, err := s.loadImage(ctx, name, d)
		if err != nil {
			log.G(ctx).WithError(err).WithField("image", name).Warn("skipping unreadable image")
			continue
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// loadImage reads and verifies the manifest and config desc points at.
func (s *Store) loadImage(ctx context.Context, name string, desc ocispec.Descriptor) (Image, error) {
	mb, err := s.readBlob(ctx, desc)
	if err != nil {
		return Image{}, fmt.Errorf("image %q: manifest: %w", name, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return Image{}, fmt.Errorf("image %q: parse manifest: %v: %w", name, err, ErrCorrupt)
	}
	cb, err := s.readBlob(ctx, m.Config)
	if err != nil {
		return Image{}, fmt.Errorf("image %q: config: %w", name, err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return Image{}, fmt.Errorf("image %q: parse config: %v: %w", name, err, ErrCorrupt)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return Image{}, fmt.Errorf("image %q: manifest has %d layers but config has %d diff_ids: %w",
			name, len(m.Layers), len(cfg.RootFS.DiffIDs), errdefs.ErrFailedPrecondition)
	}
	img := Image{
		Name:    name,
		Digest:  desc.Digest,
		Config:  cfg,
		Layers:  m.Layers,
		ChainID: identity.ChainID(cfg.RootFS.DiffIDs),
		Size:    desc.Size + m.Config.Size,
		Source:  desc.Annotations[annotationSource],
	}
	if t, err := time.Parse(time.RFC3339Nano, desc.Annotations[annotationTagged]); err == nil {
		img.Tagged = t
	}
	for _, l := range m.Layers {
		img.Size += l.Size
	}
	if cfg.Created != nil {
		img.Created = *cfg.Created
	}
	return img, nil
}

// readBlob reads a small blob and checks its size and digest.
func (s *Store) readBlob(ctx context.Context, desc ocispec.Descriptor) ([]byte, error) {
	if err := desc.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("descriptor digest %q: %v: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
	}
	if desc.Size > maxMetadataSize {
		return nil, fmt.Errorf("blob %s is %d bytes, more than %d: %w", desc.Digest, desc.Size, maxMetadataSize, errdefs.ErrInvalidArgument)
	}
	b, err := content.ReadBlob(ctx, s.content, desc)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != desc.Size || desc.Digest.Algorithm().FromBytes(b) != desc.Digest {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, ErrCorrupt)
	}
	return b, nil
}

// writeBlob stores the content r yields, which must match desc. Content
// already present counts as written. A digest or size mismatch wraps
// ErrCorrupt; nothing is left in the ingest area on failure.
func (s *Store) writeBlob(ctx context.Context, r io.Reader, desc ocispec.Descriptor) error {
	ref := "hutch-" + randomHex()
	err := content.WriteBlob(ctx, s.content, ref, r, desc)
	if err == nil {
		return nil
	}
	if aerr := s.content.Abort(ctx, ref); aerr != nil && !errdefs.IsNotFound(aerr) {
		log.G(ctx).WithError(aerr).WithField("ref", ref).Debug("abort ingest")
	}
	if errdefs.IsFailedPrecondition(err) {
		// The local store reports size and digest mismatches this way.
		return fmt.Errorf("blob %s: %v: %w", desc.Digest, err, ErrCorrupt)
	}
	return fmt.Errorf("blob %s: %w", desc.Digest, err)
}

// writeBytes stores b as a blob of the given media type.
func (s *Store) writeBytes(ctx context.Context, mediaType string, b []byte) (ocispec.Descriptor, error) {
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	return desc, s.writeBlob(ctx, bytes.NewReader(b), desc)
}

func newIndex() ocispec.Index {
	return ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{},
	}
}

// readIndex reads index.json. Writers replace the file by rename, so a
// reader always sees a complete version without taking the lock.
func (s *Store) readIndex() (ocispec.Index, error) {
	b, err := os.ReadFile(s.indexPath())
	if err != nil {
		return ocispec.Index{}, fmt.Errorf("read image index: %w", err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return ocispec.Index{}, fmt.Errorf("parse %s: %v: %w", s.indexPath(), err, ErrCorrupt)
	}
	return idx, nil
}

// writeIndexLocked replaces index.json; the caller holds the index lock.
func (s *Store) writeIndexLocked(idx ocispec.Index) error {
	sort.SliceStable(idx.Manifests, func(i, j int) bool {
		return idx.Manifests[i].Annotations[ocispec.AnnotationRefName] < idx.Manifests[j].Annotations[ocispec.AnnotationRefName]
	})
	b, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(s.indexPath(), append(b, '\n'), 0o644)
}

// tag points name at the manifest desc, replacing any previous target, and
// records where the image came from.
func (s *Store) tag(name string, desc ocispec.Descriptor, source string) error {
	l, err := lockPath(s.indexLockPath(), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer l.Unlock()
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	entry := ocispec.Descriptor{
		MediaType:   desc.MediaType,
		Digest:      desc.Digest,
		Size:        desc.Size,
		Annotations: map[string]string{ocispec.AnnotationRefName: name, annotationTagged: time.Now().UTC().Format(time.RFC3339Nano)},
	}
	if source != "" {
		entry.Annotations[annotationSource] = source
	}
	kept := idx.Manifests[:0]
	for _, d := range idx.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] != name {
			kept = append(kept, d)
		}
	}
	idx.Manifests = append(kept, entry)
	return s.writeIndexLocked(idx)
}

// Tag points name at the image src names, as it was stored (its source
// kept). A name that names another image is moved. An unknown src wraps
// errdefs.ErrNotFound.
func (s *Store) Tag(ctx context.Context, src, name string) (Image, error) {
	src, err := ParseName(src)
	if err != nil {
		return Image{}, err
	}
	if name, err = ParseName(name); err != nil {
		return Image{}, err
	}
	gc, err := lockPath(s.gcLockPath(), unix.LOCK_SH)
	if err != nil {
		return Image{}, err
	}
	defer gc.Unlock()
	idx, err := s.readIndex()
	if err != nil {
		return Image{}, err
	}
	for _, d := range idx.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] != src {
			continue
		}
		if err := s.tag(name, d, d.Annotations[annotationSource]); err != nil {
			return Image{}, fmt.Errorf("image %s: %w", name, err)
		}
		return s.Get(ctx, name)
	}
	return Image{}, notFound(src)
}

// untag removes name from the index; it wraps errdefs.ErrNotFound if absent.
func (s *Store) untag(name string) error {
	l, err := lockPath(s.indexLockPath(), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer l.Unlock()
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	kept := idx.Manifests[:0]
	found := false
	for _, d := range idx.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] == name {
			found = true
			continue
		}
		kept = append(kept, d)
	}
	if !found {
		return notFound(name)
	}
	idx.Manifests = kept
	return s.writeIndexLocked(idx)
}

// writeFileAtomic replaces path with data by writing a temporary file in the
// same directory, syncing it and renaming it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
