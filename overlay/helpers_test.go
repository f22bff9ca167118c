package overlay

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// entry is one tar member of a test layer.
type entry struct {
	name string
	typ  byte
	mode int64
	data string
	link string
	uid  int
}

func file(name, data string) entry {
	return entry{name: name, typ: tar.TypeReg, mode: 0o644, data: data}
}
func dir(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) entry {
	return entry{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}
func hardlink(name, target string) entry {
	return entry{name: name, typ: tar.TypeLink, mode: 0o644, link: target}
}

func makeTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link,
			Size: int64(len(e.data)), Uid: e.uid, Gid: e.uid, ModTime: tarEpoch}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layer is a test layer: its uncompressed tar and how to compress it.
type layer struct {
	tar         []byte
	compression string // "", "gzip" or "zstd"
}

func compress(t testing.TB, kind string, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	switch kind {
	case "":
		return b
	case "gzip":
		zw := gzip.NewWriter(&buf)
		zw.Write(b)
		zw.Close()
	case "zstd":
		zw, err := zstd.NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		zw.Write(b)
		zw.Close()
	default:
		t.Fatalf("unknown compression %q", kind)
	}
	return buf.Bytes()
}

var layerMediaTypes = map[string]string{
	"":     ocispec.MediaTypeImageLayer,
	"gzip": ocispec.MediaTypeImageLayerGzip,
	"zstd": ocispec.MediaTypeImageLayerZstd,
}

// testImage is the blobs of one image built in memory.
type testImage struct {
	blobs    map[digest.Digest][]byte
	manifest ocispec.Descriptor
	config   ocispec.Image
}

// newTestImage builds an image of layers for platform arch. wrongDiffID
// makes the config promise a diff_id its last layer does not have.
func newTestImage(t testing.TB, arch string, wrongDiffID bool, layers ...layer) testImage {
	t.Helper()
	ti := testImage{blobs: map[digest.Digest][]byte{}}
	add := func(mt string, b []byte) ocispec.Descriptor {
		d := digest.FromBytes(b)
		ti.blobs[d] = b
		return ocispec.Descriptor{MediaType: mt, Digest: d, Size: int64(len(b))}
	}
	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: arch},
		Config:   ocispec.ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"/bin/sh"}, WorkingDir: "/"},
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	var descs []ocispec.Descriptor
	for i, l := range layers {
		diffID := digest.FromBytes(l.tar)
		if wrongDiffID && i == len(layers)-1 {
			diffID = digest.FromString("something else")
		}
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, diffID)
		descs = append(descs, add(layerMediaTypes[l.compression], compress(t, l.compression, l.tar)))
	}
	ti.config = cfg
	cb, _ := json.Marshal(cfg)
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    add(ocispec.MediaTypeImageConfig, cb),
		Layers:    descs,
	}
	mb, _ := json.Marshal(m)
	ti.manifest = add(ocispec.MediaTypeImageManifest, mb)
	ti.manifest.Platform = &ocispec.Platform{OS: "linux", Architecture: arch}
	return ti
}

// ociArchive writes an OCI layout tar holding images; index.json lists the
// given top-level descriptors (manifests or indexes).
func ociArchive(t testing.TB, top []ocispec.Descriptor, images ...testImage) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(name string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	idx := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: top}
	ib, _ := json.Marshal(idx)
	write("index.json", ib)
	write("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	for _, img := range images {
		for d, b := range img.blobs {
			write("blobs/sha256/"+d.Encoded(), b)
		}
	}
	tw.Close()
	return buf.Bytes()
}

// simpleArchive is an archive of one image built from layers.
func simpleArchive(t testing.TB, layers ...layer) ([]byte, testImage) {
	ti := newTestImage(t, runtime.GOARCH, false, layers...)
	return ociArchive(t, []ocispec.Descriptor{ti.manifest}, ti), ti
}

func newStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func importBytes(t testing.TB, s *Store, name string, b []byte) Image {
	t.Helper()
	img, err := s.Import(context.Background(), name, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// leftovers lists entries under the store's rootfs dir other than want.
func rootfsEntries(t testing.TB, s *Store) []string {
	t.Helper()
	es, err := os.ReadDir(s.rootfsDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// requiresRoot skips tests that need uid 0, except under `make test`
// (HUTCH_INTEGRATION=1), where a skip must not stand in for a pass.
func requiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOutsideCI(t, "test requires root")
	}
}

// skipOutsideCI skips the test when run by hand, and fails it under
// `make test`, which installs and runs as everything the tests need.
func skipOutsideCI(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("HUTCH_INTEGRATION") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}
