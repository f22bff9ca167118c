package overlay

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func baseLayer(t testing.TB) []byte {
	return makeTar(t,
		dir("bin/"), file("bin/hello", "hello world\n"), symlink("bin/sh", "hello"),
		dir("etc/"), file("etc/os-release", "ID=test\n"),
	)
}

func TestImportGetRootfs(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ar, ti := simpleArchive(t, layer{tar: baseLayer(t), compression: "gzip"})
	img := importBytes(t, s, "test", ar)

	got, err := s.Get(ctx, "test:latest")
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "test:latest" || got.Digest != ti.manifest.Digest || img.Digest != got.Digest {
		t.Fatalf("Get = %s %s, want test:latest %s", got.Name, got.Digest, ti.manifest.Digest)
	}
	if strings.Join(got.Config.Config.Env, ",") != "PATH=/bin" || got.Config.Config.WorkingDir != "/" {
		t.Fatalf("config not parsed: %+v", got.Config.Config)
	}
	var size int64
	for _, b := range ti.blobs {
		size += int64(len(b))
	}
	if got.Size != size || len(got.Layers) != 1 || got.ChainID != ti.config.RootFS.DiffIDs[0] {
		t.Fatalf("Size %d (want %d), layers %d, chain %s", got.Size, size, len(got.Layers), got.ChainID)
	}

	p, err := s.Rootfs(ctx, got, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(s.Root(), "rootfs", got.ChainID.Encoded()) {
		t.Fatalf("rootfs at %s", p)
	}
	if readFile(t, filepath.Join(p, "bin/hello")) != "hello world\n" || readFile(t, filepath.Join(p, "etc/os-release")) != "ID=test\n" {
		t.Fatal("rootfs content wrong")
	}
	if l, _ := os.Readlink(filepath.Join(p, "bin/sh")); l != "hello" {
		t.Fatalf("bin/sh -> %q", l)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("rootfs root mode: %v %v", fi.Mode(), err)
	}
	// Idempotent, and a second lease on the same chain.
	for _, lease := range []string{"sb-1", "sb-2"} {
		if p2, err := s.Rootfs(ctx, got, lease); err != nil || p2 != p {
			t.Fatalf("Rootfs again: %s %v", p2, err)
		}
	}

	_, err = s.Get(ctx, "missing")
	if !errors.Is(err, errdefs.ErrNotFound) || err.Error() != `image "missing:latest" not found` {
		t.Fatalf("Get(missing) = %v", err)
	}
	if _, err := s.Get(ctx, "Bad Name"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Get(bad) = %v", err)
	}
	if _, err := s.Rootfs(ctx, got, "../escape"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Rootfs with bad lease = %v", err)
	}
}

func TestList(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ar, _ := simpleArchive(t, layer{tar: baseLayer(t)})
	for _, n := range []string{"zeta", "alpha:2", "alpha:1", "mid/dle"} {
		importBytes(t, s, n, ar)
	}
	imgs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range imgs {
		names = append(names, i.Name)
	}
	if got := strings.Join(names, " "); got != "alpha:1 alpha:2 mid/dle:latest zeta:latest" {
		t.Fatalf("List = %s", got)
	}
	// Re-tagging replaces.
	ar2, ti2 := simpleArchive(t, layer{tar: makeTar(t, file("x", "y"))})
	importBytes(t, s, "zeta", ar2)
	if img, _ := s.Get(ctx, "zeta"); img.Digest != ti2.manifest.Digest {
		t.Fatal("re-tag did not replace")
	}
	if imgs, _ := s.List(ctx); len(imgs) != 4 {
		t.Fatalf("List has %d images after re-tag", len(imgs))
	}
}

func TestImportFormats(t *testing.T) {
	ctx := context.Background()
	lt := baseLayer(t)
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	for _, tc := range []struct {
		name    string
		archive func() []byte
	}{
		{"uncompressed layer", func() []byte { a, _ := simpleArchive(t, layer{tar: lt}); return a }},
		{"gzip layer", func() []byte { a, _ := simpleArchive(t, layer{tar: lt, compression: "gzip"}); return a }},
		{"zstd layer", func() []byte { a, _ := simpleArchive(t, layer{tar: lt, compression: "zstd"}); return a }},
		{"gzipped archive", func() []byte { a, _ := simpleArchive(t, layer{tar: lt, compression: "gzip"}); return gz(a) }},
		{"multi-platform index", func() []byte {
			other := newTestImage(t, "s390x", false, layer{tar: makeTar(t, file("wrong", "platform"))})
			mine := newTestImage(t, runtime.GOARCH, false, layer{tar: lt, compression: "gzip"})
			idx := ocispec.Index{MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{other.manifest, mine.manifest}}
			idx.SchemaVersion = 2
			ib := mustJSON(t, idx)
			d := digest.FromBytes(ib)
			mine.blobs[d] = ib
			return ociArchive(t, []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageIndex, Digest: d, Size: int64(len(ib))}}, other, mine)
		}},
		{"several manifests in index.json", func() []byte {
			other := newTestImage(t, "s390x", false, layer{tar: makeTar(t, file("wrong", "platform"))})
			mine := newTestImage(t, runtime.GOARCH, false, layer{tar: lt})
			return ociArchive(t, []ocispec.Descriptor{other.manifest, mine.manifest}, other, mine)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			img := importBytes(t, s, "img", tc.archive())
			p, err := s.Rootfs(ctx, img, "sb")
			if err != nil {
				t.Fatal(err)
			}
			if readFile(t, filepath.Join(p, "bin/hello")) != "hello world\n" {
				t.Fatal("wrong content")
			}
		})
	}

	t.Run("no matching platform", func(t *testing.T) {
		other := newTestImage(t, "s390x", false, layer{tar: lt})
		if runtime.GOARCH == "s390x" {
			t.Skip()
		}
		s := newStore(t)
		_, err := s.Import(ctx, "img", bytes.NewReader(ociArchive(t, []ocispec.Descriptor{other.manifest, other.manifest}, other)))
		if err == nil || !strings.Contains(err.Error(), "linux/s390x") {
			t.Fatalf("Import = %v", err)
		}
	})
}

func TestImportRefusesBadArchives(t *testing.T) {
	ctx := context.Background()
	ar, ti := simpleArchive(t, layer{tar: baseLayer(t), compression: "gzip"})
	var layerData []byte
	for d, b := range ti.blobs {
		if d != ti.manifest.Digest && len(b) > 100 && !bytes.HasPrefix(b, []byte("{")) {
			layerData = b
		}
	}
	flipped := bytes.Clone(ar)
	i := bytes.Index(flipped, layerData)
	flipped[i+len(layerData)/2] ^= 0xff

	for _, tc := range []struct {
		name    string
		archive []byte
		is      error
	}{
		{"truncated", ar[:len(ar)/2], nil},
		{"truncated at the first blob", ar[:1024+512], nil},
		{"flipped byte in a blob", flipped, ErrCorrupt},
		{"not a tar", []byte("hello, this is not an archive"), nil},
		{"no index.json", makeTar(t, file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`)), errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			_, err := s.Import(ctx, "img", bytes.NewReader(tc.archive))
			if err == nil {
				t.Fatal("Import succeeded")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("Import error %v does not wrap %v", err, tc.is)
			}
			if _, err := s.Get(ctx, "img"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("image tagged after failed import: %v", err)
			}
			if imgs, _ := s.List(ctx); len(imgs) != 0 {
				t.Fatalf("List = %v", imgs)
			}
			// A later collection removes whatever was ingested.
			if _, err := s.Prune(ctx); err != nil {
				t.Fatal(err)
			}
			blobs, _ := os.ReadDir(filepath.Join(s.Root(), "oci", "blobs", "sha256"))
			ingest, _ := os.ReadDir(filepath.Join(s.Root(), "oci", "ingest"))
			if len(blobs)+len(ingest) != 0 {
				t.Fatalf("%d blobs and %d ingests left after prune", len(blobs), len(ingest))
			}
		})
	}
}

func TestExportImportRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ar, ti := simpleArchive(t, layer{tar: baseLayer(t), compression: "gzip"}, layer{tar: makeTar(t, file("etc/motd", "hi\n"))})
	importBytes(t, s, "orig:v1", ar)

	var a, b bytes.Buffer
	if err := s.Export(ctx, "orig:v1", &a); err != nil {
		t.Fatal(err)
	}
	if err := s.Export(ctx, "orig:v1", &b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two exports differ")
	}
	s2 := newStore(t)
	img := importBytes(t, s2, "copy", a.Bytes())
	if img.Digest != ti.manifest.Digest {
		t.Fatalf("round trip digest %s, want %s", img.Digest, ti.manifest.Digest)
	}
	p, err := s2.Rootfs(ctx, img, "x")
	if err != nil {
		t.Fatal(err)
	}
	if readFile(t, filepath.Join(p, "etc/motd")) != "hi\n" {
		t.Fatal("content lost in round trip")
	}
	if err := s.Export(ctx, "nope", &a); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Export(nope) = %v", err)
	}
}

func TestCorruptLayerRefused(t *testing.T) {
	ctx := context.Background()
	lt := baseLayer(t)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, s *Store) Image
	}{
		{"flipped byte in stored blob", func(t *testing.T, s *Store) Image {
			ar, _ := simpleArchive(t, layer{tar: lt, compression: "gzip"})
			img := importBytes(t, s, "img", ar)
			p := filepath.Join(s.Root(), "oci", "blobs", "sha256", img.Layers[0].Digest.Encoded())
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0x01
			if err := os.Chmod(p, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			return img
		}},
		{"flipped byte in uncompressed blob", func(t *testing.T, s *Store) Image {
			ar, _ := simpleArchive(t, layer{tar: lt})
			img := importBytes(t, s, "img", ar)
			p := filepath.Join(s.Root(), "oci", "blobs", "sha256", img.Layers[0].Digest.Encoded())
			b, _ := os.ReadFile(p)
			i := bytes.Index(b, []byte("hello world"))
			b[i] = 'j'
			os.Chmod(p, 0o644)
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			return img
		}},
		{"diff_id mismatch", func(t *testing.T, s *Store) Image {
			ti := newTestImage(t, runtime.GOARCH, true, layer{tar: lt, compression: "gzip"})
			return importBytes(t, s, "img", ociArchive(t, []ocispec.Descriptor{ti.manifest}, ti))
		}},
		{"truncated stored blob", func(t *testing.T, s *Store) Image {
			ar, _ := simpleArchive(t, layer{tar: lt, compression: "gzip"})
			img := importBytes(t, s, "img", ar)
			p := filepath.Join(s.Root(), "oci", "blobs", "sha256", img.Layers[0].Digest.Encoded())
			os.Chmod(p, 0o644)
			if err := os.Truncate(p, img.Layers[0].Size-10); err != nil {
				t.Fatal(err)
			}
			return img
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			img := tc.setup(t, s)
			_, err := s.Rootfs(ctx, img, "sb")
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Rootfs = %v, want ErrCorrupt", err)
			}
			if e := rootfsEntries(t, s); len(e) != 0 {
				t.Fatalf("left behind in rootfs/: %v", e)
			}
			if _, err := os.Stat(filepath.Join(s.Root(), "leases", "sb")); err == nil {
				t.Fatal("lease recorded for a failed unpack")
			}
			if tc.name != "diff_id mismatch" {
				if err := s.Export(ctx, "img", new(bytes.Buffer)); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Export of corrupt image = %v", err)
				}
			}
		})
	}
}

func TestLeaseKeepsRootfs(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ar, _ := simpleArchive(t, layer{tar: baseLayer(t), compression: "gzip"})
	img := importBytes(t, s, "img", ar)
	p, err := s.Rootfs(ctx, img, "sb-live")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "img"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "img"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get after Remove = %v", err)
	}
	if readFile(t, filepath.Join(p, "bin/hello")) != "hello world\n" {
		t.Fatal("leased rootfs damaged by Remove")
	}
	if n, err := s.Prune(ctx); err != nil || n != 0 {
		t.Fatalf("Prune with live lease freed %d, %v", n, err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal("leased rootfs pruned")
	}
	// The rootfs survives without its blobs and can be leased again.
	if p2, err := s.Rootfs(ctx, img, "sb-live"); err != nil || p2 != p {
		t.Fatalf("Rootfs of leased chain: %v", err)
	}

	if err := s.Release(ctx, "sb-live"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "sb-live"); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	n, err := s.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("rootfs still there after Release+Prune: %v", err)
	}
	if n <= 0 {
		t.Fatalf("Prune freed %d bytes", n)
	}
	if e := rootfsEntries(t, s); len(e) != 0 {
		t.Fatalf("rootfs/ not empty: %v", e)
	}
	if err := s.Remove(ctx, "img"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second Remove = %v", err)
	}
}

func TestRemoveKeepsSharedData(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ar, _ := simpleArchive(t, layer{tar: baseLayer(t), compression: "gzip"})
	a := importBytes(t, s, "a", ar)
	importBytes(t, s, "b", ar)
	child, err := s.Commit(ctx, CommitOptions{Name: "child", Parent: &a, Layer: bytes.NewReader(makeTar(t, file("new", "x")))})
	if err != nil {
		t.Fatal(err)
	}
	pa, _ := s.Rootfs(ctx, a, "l1")
	pc, err := s.Rootfs(ctx, child, "l2")
	if err != nil {
		t.Fatal(err)
	}
	s.Release(ctx, "l1")
	s.Release(ctx, "l2")
	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// b and child still reference the blobs and chains.
	for _, p := range []string{pa, pc} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s removed while referenced", p)
		}
	}
	if err := s.Remove(ctx, "child"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pc); !os.IsNotExist(err) {
		t.Fatal("child chain kept after its image was removed")
	}
	if _, err := s.Rootfs(ctx, mustGet(t, s, "b"), "l3"); err != nil {
		t.Fatal(err)
	}
}

func TestCommit(t *testing.T) {
	ctx := context.Background()
	lt := baseLayer(t)
	commit := func(s *Store, opts CommitOptions) Image {
		t.Helper()
		img, err := s.Commit(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	cfg := &ocispec.ImageConfig{Env: []string{"A=1"}, Cmd: []string{"/bin/hello"}, Labels: map[string]string{"z": "1", "a": "2"}}
	s1, s2 := newStore(t), newStore(t)
	b1 := commit(s1, CommitOptions{Name: "base", Layer: bytes.NewReader(lt), Config: cfg, History: "base layer"})
	b2 := commit(s2, CommitOptions{Name: "base", Layer: bytes.NewReader(lt), Config: cfg, History: "base layer"})
	if b1.Digest != b2.Digest || b1.Layers[0].Digest != b2.Layers[0].Digest {
		t.Fatalf("identical commits differ: %s %s", b1.Digest, b2.Digest)
	}
	if b1.Layers[0].MediaType != ocispec.MediaTypeImageLayerGzip || b1.Config.Created != nil || !b1.Created.IsZero() {
		t.Fatalf("layer %s, created %v", b1.Layers[0].MediaType, b1.Config.Created)
	}
	if b1.Config.RootFS.DiffIDs[0] != digest.FromBytes(lt) || b1.Config.OS != "linux" {
		t.Fatalf("config %+v", b1.Config)
	}
	again := commit(s1, CommitOptions{Name: "base:again", Layer: bytes.NewReader(lt), Config: cfg, History: "base layer"})
	if again.Digest != b1.Digest {
		t.Fatal("recommit in the same store differs")
	}

	when := time.Date(2024, 5, 6, 7, 8, 9, 0, time.FixedZone("x", 3600))
	dated := commit(s1, CommitOptions{Name: "dated", Layer: bytes.NewReader(lt), Config: cfg, Created: &when})
	if dated.Digest == b1.Digest || !dated.Created.Equal(when) || dated.Created.Location() != time.UTC {
		t.Fatalf("Created not recorded: %v", dated.Created)
	}

	child := commit(s1, CommitOptions{Name: "child:1", Parent: &b1,
		Layer: bytes.NewReader(makeTar(t, file("bin/hello", "changed\n"), file("etc/.wh.os-release", ""))), History: "change"})
	if len(child.Layers) != 2 || child.Config.Config.Cmd[0] != "/bin/hello" || len(child.Config.History) != 2 {
		t.Fatalf("child %+v", child.Config)
	}
	if child.Config.History[1].CreatedBy != "change" {
		t.Fatalf("history %+v", child.Config.History)
	}
	p, err := s1.Rootfs(ctx, child, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if readFile(t, filepath.Join(p, "bin/hello")) != "changed\n" {
		t.Fatal("child layer not applied")
	}
	if _, err := os.Stat(filepath.Join(p, "etc/os-release")); !os.IsNotExist(err) {
		t.Fatal("whiteout not applied")
	}
	pb, _ := s1.Rootfs(ctx, b1, "sb-base")
	if readFile(t, filepath.Join(pb, "bin/hello")) != "hello world\n" {
		t.Fatal("parent chain changed by child")
	}

	if _, err := s1.Commit(ctx, CommitOptions{Name: "Bad"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := s1.Commit(ctx, CommitOptions{Name: "nolayer"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("no layer: %v", err)
	}
}

func TestOwnershipPreservedAsRoot(t *testing.T) {
	requiresRoot(t)
	ctx := context.Background()
	s := newStore(t)
	e := file("home/u/f", "x")
	e.uid = 1234
	d := dir("home/u/")
	d.uid = 1234
	img, err := s.Commit(ctx, CommitOptions{Name: "own", Layer: bytes.NewReader(makeTar(t, dir("home/"), d, e))})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Rootfs(ctx, img, "sb")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"home/u", "home/u/f"} {
		if uid := ownerOf(t, filepath.Join(p, f)); uid != 1234 {
			t.Fatalf("%s owned by %d", f, uid)
		}
	}
}

func mustGet(t testing.TB, s *Store, name string) Image {
	t.Helper()
	img, err := s.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Tag points a second name at an image as stored, moves a name that
// named another, records when, and refuses an unknown source.
func TestTag(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ar, _ := simpleArchive(t, layer{tar: baseLayer(t)})
	importBytes(t, s, "app:v1", ar)
	ar2, _ := simpleArchive(t, layer{tar: makeTar(t, file("x", "y"))})
	importBytes(t, s, "app:v2", ar2)
	v1 := mustGet(t, s, "app:v1")
	before := time.Now().Add(-time.Second)
	img, err := s.Tag(ctx, "app:v1", "app:stable")
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "app:stable" || img.Digest != v1.Digest || img.Source != v1.Source || img.Tagged.Before(before) {
		t.Fatalf("Tag gave %+v, want v1's image tagged now", img)
	}
	if _, err := s.Tag(ctx, "app:v2", "app:stable"); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, "app:stable"); got.Digest != mustGet(t, s, "app:v2").Digest {
		t.Fatal("Tag did not move the name")
	}
	if _, err := s.Tag(ctx, "app:none", "app:x"); !errdefs.IsNotFound(err) {
		t.Fatalf("Tag of an unknown image: %v, want not found", err)
	}
	if imgs, _ := s.List(ctx); len(imgs) != 3 {
		t.Fatalf("List has %d images, want 3", len(imgs))
	}
}
