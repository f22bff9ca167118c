package overlay

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestAsyncDigester(t *testing.T) {
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	a := newAsyncDigester()
	for off, n := 0, 1; off < len(data); off, n = off+n, n*3%65537+1 {
		end := min(off+n, len(data))
		if w, err := a.Write(data[off:end]); err != nil || w != end-off {
			t.Fatalf("write: %d %v", w, err)
		}
	}
	if got, want := a.Digest(), digest.FromBytes(data); got != want || a.Digest() != want {
		t.Fatalf("digest %s, want %s", got, want)
	}
	if newAsyncDigester().Digest() != digest.FromBytes(nil) {
		t.Fatal("digest of nothing")
	}
}

// A snapshot layer is zstd-compressed, deterministic, unpacks, and
// survives an export and an import unchanged.
func TestSnapshotLayerZstd(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	base := makeTar(t, dir("etc/"), file("etc/group", "g"), file("etc/passwd", "p"), dir("home/"), file("home/old", "o"), dir("z/"))
	parent := importBytes(t, s, "base", func() []byte { a, _ := simpleArchive(t, layer{tar: base, compression: "gzip"}); return a }())
	snap := func(name string) Image {
		img, err := s.Snapshot(ctx, SnapshotOptions{Name: name, Parent: parent, Upper: gvisorUpper(t, upperSample()...), Exclude: []string{"/run", "/.sbx"}})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	a, b := snap("a"), snap("b")
	top := a.Layers[len(a.Layers)-1]
	if top.MediaType != ocispec.MediaTypeImageLayerZstd || a.Layers[0].MediaType != ocispec.MediaTypeImageLayerGzip {
		t.Fatalf("layers %+v", a.Layers)
	}
	if a.Digest != b.Digest {
		t.Fatal("identical changes gave different images")
	}
	want := digest.FromBytes(convert(t, gvisorUpper(t, upperSample()...)))
	if got := a.Config.RootFS.DiffIDs[len(a.Layers)-1]; got != want {
		t.Fatalf("diff_id %s, want %s", got, want)
	}
	var buf bytes.Buffer
	if err := s.Export(ctx, "a", &buf); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t)
	c := importBytes(t, s2, "c", buf.Bytes())
	if c.Digest != a.Digest {
		t.Fatalf("export and import changed the digest: %s -> %s", a.Digest, c.Digest)
	}
	if _, err := s2.Rootfs(ctx, c, "sb"); err != nil {
		t.Fatal(err)
	}
}

// New checkpoints carry XXH64 checksums; checkpoints committed with SHA-256
// digests are still verified by them.
func TestCheckpointChecksums(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ci, err := s.NewCheckpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pages := bytes.Repeat([]byte("pages"), 1<<18)
	os.WriteFile(filepath.Join(ci.Dir(), "checkpoint.img"), []byte("state"), 0o644)
	os.WriteFile(filepath.Join(ci.Dir(), "pages.img"), pages, 0o644)
	ck, err := ci.Commit(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range ck.Files {
		if len(f.XXH64) != 16 || f.Digest != "" {
			t.Fatalf("file %+v: want an XXH64 checksum only", f)
		}
	}

	// A manifest as earlier versions wrote it.
	legacy := Checkpoint{Files: []CheckpointFile{
		{Name: "checkpoint.img", Size: 5, Digest: digest.FromString("state")},
		{Name: "pages.img", Size: int64(len(pages)), Digest: digest.FromBytes(pages)},
	}}
	mb, _ := json.Marshal(legacy)
	ld := digest.FromBytes(mb)
	dir := s.checkpointPath(ld)
	os.MkdirAll(filepath.Join(dir, "image"), 0o700)
	os.WriteFile(filepath.Join(dir, "manifest.json"), mb, 0o600)
	os.WriteFile(filepath.Join(dir, "image", "checkpoint.img"), []byte("state"), 0o600)
	os.WriteFile(filepath.Join(dir, "image", "pages.img"), pages, 0o600)

	for _, d := range []digest.Digest{ck.Digest, ld} {
		if _, err := s.OpenCheckpoint(ctx, d); err != nil {
			t.Fatalf("open %s: %v", d, err)
		}
		p := filepath.Join(s.checkpointPath(d), "image", "pages.img")
		f, _ := os.OpenFile(p, os.O_RDWR, 0)
		f.WriteAt([]byte("X"), int64(len(pages)/2))
		f.Close()
		if _, err := s.OpenCheckpoint(ctx, d); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pages.img") {
			t.Fatalf("flipped byte in %s: %v", d, err)
		}
	}
}

// BenchmarkSnapshot stores a snapshot of 100 MiB of incompressible changes.
func BenchmarkSnapshot(b *testing.B) {
	ctx := context.Background()
	s := newStore(b)
	base := makeTar(b, dir("etc/"), file("etc/group", "g"))
	a, _ := simpleArchive(b, layer{tar: base})
	parent := importBytes(b, s, "base", a)
	data := make([]byte, 100<<20)
	rand.Read(data)
	f, err := os.CreateTemp(b.TempDir(), "upper")
	if err != nil {
		b.Fatal(err)
	}
	tw := tar.NewWriter(f)
	tw.WriteHeader(&tar.Header{Name: "./root/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "./root/changes", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
	tw.Write(data)
	tw.Close()
	b.SetBytes(int64(len(data)))
	for i := 0; b.Loop(); i++ {
		if _, err := s.Snapshot(ctx, SnapshotOptions{Name: fmt.Sprintf("snap:%d", i), Parent: parent, Upper: f}); err != nil {
			b.Fatal(err)
		}
	}
}
