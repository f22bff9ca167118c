package overlay

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/containerd/containerd/v2/core/content"
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
		img, err := s.Snapshot(ctx, SnapshotOptions{Name: name, Parent: parent, Upper: gvisorUpper(t, upperSample()...), Exclude: []string{"/run", "/.hutch"}})
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

// A snapshot streamed in name order is the image the sorted conversion
// gives. One out of order, or whose End or Check fails, stores nothing: no
// image, no blob, no file being written.
func TestSnapshotStream(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	base := makeTar(t, dir("etc/"), file("etc/group", "g"), file("etc/passwd", "p"), dir("home/"), file("home/old", "o"), dir("z/"))
	parent := importBytes(t, s, "base", func() []byte { a, _ := simpleArchive(t, layer{tar: base, compression: "gzip"}); return a }())
	exclude := []string{"/run", "/.hutch"}
	sorted, err := s.Snapshot(ctx, SnapshotOptions{Name: "sorted", Parent: parent, Upper: gvisorUpper(t, upperSample()...), Exclude: exclude})
	if err != nil {
		t.Fatal(err)
	}
	var checked int
	streamed, err := s.Snapshot(ctx, SnapshotOptions{
		Name: "streamed", Parent: parent, UpperStream: bufio.NewReader(rewound(t, gvisorUpper(t, upperSampleInOrder()...))), Exclude: exclude,
		Check: func(*tar.Header) error { checked++; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if streamed.Digest != sorted.Digest {
		t.Fatalf("streamed %s, sorted %s", streamed.Digest, sorted.Digest)
	}
	if checked != len(upperSampleInOrder()) {
		t.Fatalf("Check saw %d headers, want %d", checked, len(upperSampleInOrder()))
	}

	blobs := func() (n int) {
		s.content.Walk(ctx, func(content.Info) error { n++; return nil }) //nolint:errcheck // counted
		return n
	}
	before := blobs()
	fail := errors.New("runsc failed")
	for name, opts := range map[string]SnapshotOptions{
		"out of order": {UpperStream: rewound(t, gvisorUpper(t, upperSample()...))},
		"End fails":    {UpperStream: rewound(t, gvisorUpper(t, upperSampleInOrder()...)), End: func() error { return fail }},
		"Check fails":  {UpperStream: rewound(t, gvisorUpper(t, upperSampleInOrder()...)), Check: func(*tar.Header) error { return fail }},
	} {
		opts.Name, opts.Parent, opts.Exclude = "failed", parent, exclude
		_, err := s.Snapshot(ctx, opts)
		if want := map[bool]error{true: ErrUnordered, false: fail}[name == "out of order"]; !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
		if _, err := s.Get(ctx, "failed"); err == nil {
			t.Errorf("%s: an image was tagged", name)
		}
		if n := blobs(); n != before {
			t.Errorf("%s: %d blobs, %d before", name, n, before)
		}
		if st, _ := s.content.ListStatuses(ctx); len(st) != 0 {
			t.Errorf("%s: ingests left: %v", name, st)
		}
		if left, _ := os.ReadDir(s.tmpDir()); len(left) != 0 {
			t.Errorf("%s: %d files left in %s", name, len(left), s.tmpDir())
		}
	}
	if _, err := s.Snapshot(ctx, SnapshotOptions{Name: "both", Parent: parent, Upper: gvisorUpper(t, upperSample()...), UpperStream: bytes.NewReader(nil)}); err == nil {
		t.Error("a snapshot of a file and a stream at once")
	}
}

// upperOneFile is an upper layer tar, in name order and rewound, holding
// /root/data.
func upperOneFile(t testing.TB, data []byte) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "upper")
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "./root/", Typeflag: tar.TypeDir, Mode: 0o700})
	tw.WriteHeader(&tar.Header{Name: "./root/data", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
	tw.Write(data)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return rewound(t, f)
}

func rewound(t testing.TB, f *os.File) *os.File {
	t.Helper()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	return f
}

// A snapshot whose changes do not compress is stored as a plain tar: its
// digest is its diff_id. It unpacks, and survives an export and an import
// unchanged. Changes that compress are zstd.
func TestSnapshotIncompressible(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	base := makeTar(t, dir("etc/"), file("etc/group", "g"))
	parent := importBytes(t, s, "base", func() []byte { a, _ := simpleArchive(t, layer{tar: base, compression: "gzip"}); return a }())
	random := make([]byte, 6<<20)
	rand.Read(random)
	upper := func(data []byte) *os.File { return upperOneFile(t, data) }
	img, err := s.Snapshot(ctx, SnapshotOptions{Name: "random", Parent: parent, UpperStream: upper(random)})
	if err != nil {
		t.Fatal(err)
	}
	top := img.Layers[len(img.Layers)-1]
	if top.MediaType != ocispec.MediaTypeImageLayer || img.Config.RootFS.DiffIDs[len(img.Layers)-1] != top.Digest {
		t.Fatalf("layer %+v, diff_id %s", top, img.Config.RootFS.DiffIDs[len(img.Layers)-1])
	}
	if top.Size < int64(len(random)) {
		t.Fatalf("layer of %d bytes holds %d bytes of data", top.Size, len(random))
	}
	if fi, err := os.Stat(filepath.Join(s.ociDir(), "blobs", "sha256", top.Digest.Encoded())); err != nil || fi.Mode().Perm() != 0o444 {
		t.Fatalf("the layer's blob: %v, %v; want read-only", fi.Mode(), err)
	}
	again, err := s.Snapshot(ctx, SnapshotOptions{Name: "again", Parent: parent, Upper: upper(random)})
	if err != nil || again.Digest != img.Digest {
		t.Fatalf("the same changes again: %v, %s vs %s", err, again.Digest, img.Digest)
	}
	p, err := s.Rootfs(ctx, img, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(p, "root/data")); err != nil || !bytes.Equal(b, random) {
		t.Fatalf("unpacked data: %v", err)
	}
	var buf bytes.Buffer
	if err := s.Export(ctx, "random", &buf); err != nil {
		t.Fatal(err)
	}
	if c := importBytes(t, newStore(t), "c", buf.Bytes()); c.Digest != img.Digest {
		t.Fatalf("export and import changed the digest: %s -> %s", img.Digest, c.Digest)
	}

	text := bytes.Repeat([]byte("compressible text\n"), 6<<20/18)
	img, err = s.Snapshot(ctx, SnapshotOptions{Name: "text", Parent: parent, UpperStream: upper(text)})
	if err != nil {
		t.Fatal(err)
	}
	if top := img.Layers[len(img.Layers)-1]; top.MediaType != ocispec.MediaTypeImageLayerZstd || top.Size > int64(len(text))/10 {
		t.Fatalf("layer %+v", top)
	}
}

// New checkpoints carry XXH64 checksums of 16 MiB chunks, the last one
// short; checkpoints committed with XXH64 or SHA-256 checksums of whole
// files are still verified by them. A byte flipped in any chunk is found.
func TestCheckpointChecksums(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ci, err := s.NewCheckpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pages := bytes.Repeat([]byte("pages"), (2*checksumChunk+checksumChunk/2)/5)
	os.WriteFile(filepath.Join(ci.Dir(), "checkpoint.img"), []byte("state"), 0o644)
	os.WriteFile(filepath.Join(ci.Dir(), "pages.img"), pages, 0o644)
	os.WriteFile(filepath.Join(ci.Dir(), "empty.img"), nil, 0o644)
	ck, err := ci.Commit(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunks := map[string]int{"checkpoint.img": 1, "pages.img": 3, "empty.img": 0}
	for _, f := range ck.Files {
		if len(f.XXH64Chunks) != chunks[f.Name] || f.ChunkSize != checksumChunk || f.XXH64 != "" || f.Digest != "" {
			t.Fatalf("file %s: %d chunk checksums of %d bytes, whole %q %q; want %d chunks of %d and no whole-file checksum",
				f.Name, len(f.XXH64Chunks), f.ChunkSize, f.XXH64, f.Digest, chunks[f.Name], checksumChunk)
		}
		for _, c := range f.XXH64Chunks {
			if len(c) != 16 {
				t.Fatalf("file %s: chunk checksum %q", f.Name, c)
			}
		}
	}

	// Manifests as earlier versions wrote them.
	legacy := func(files ...CheckpointFile) digest.Digest {
		mb, _ := json.Marshal(Checkpoint{Files: files})
		d := digest.FromBytes(mb)
		dir := s.checkpointPath(d)
		os.MkdirAll(filepath.Join(dir, "image"), 0o700)
		os.WriteFile(filepath.Join(dir, "manifest.json"), mb, 0o600)
		os.WriteFile(filepath.Join(dir, "image", "checkpoint.img"), []byte("state"), 0o600)
		os.WriteFile(filepath.Join(dir, "image", "pages.img"), pages, 0o600)
		return d
	}
	sha := legacy(
		CheckpointFile{Name: "checkpoint.img", Size: 5, Digest: digest.FromString("state")},
		CheckpointFile{Name: "pages.img", Size: int64(len(pages)), Digest: digest.FromBytes(pages)},
	)
	xxh := legacy(
		CheckpointFile{Name: "checkpoint.img", Size: 5, XXH64: fmt.Sprintf("%016x", xxhash.Sum64String("state"))},
		CheckpointFile{Name: "pages.img", Size: int64(len(pages)), XXH64: fmt.Sprintf("%016x", xxhash.Sum64(pages))},
	)

	flip := func(d digest.Digest, at int64) {
		p := filepath.Join(s.checkpointPath(d), "image", "pages.img")
		f, _ := os.OpenFile(p, os.O_RDWR, 0)
		b := make([]byte, 1)
		f.ReadAt(b, at)
		f.WriteAt([]byte{b[0] ^ 1}, at)
		f.Close()
	}
	for _, d := range []digest.Digest{ck.Digest, sha, xxh} {
		for _, at := range []int64{0, checksumChunk, int64(len(pages)) - 1} {
			if _, err := s.OpenCheckpoint(ctx, d); err != nil {
				t.Fatalf("open %s: %v", d, err)
			}
			flip(d, at)
			if _, err := s.OpenCheckpoint(ctx, d); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pages.img") {
				t.Fatalf("byte %d flipped in %s: %v", at, d, err)
			}
			flip(d, at)
		}
	}
	// Cut short, and grown: refused by size before any checksum.
	p := filepath.Join(s.checkpointPath(ck.Digest), "image", "pages.img")
	for _, size := range []int64{int64(len(pages)) - 1, int64(len(pages)) + 1} {
		os.Truncate(p, size)
		if _, err := s.OpenCheckpoint(ctx, ck.Digest); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "manifest says") {
			t.Fatalf("pages.img of %d bytes: %v", size, err)
		}
	}
}

// BenchmarkSnapshot stores a snapshot of 100 MiB of incompressible changes,
// sorted from a file and streamed.
func BenchmarkSnapshot(b *testing.B) {
	ctx := context.Background()
	s := newStore(b)
	base := makeTar(b, dir("etc/"), file("etc/group", "g"))
	a, _ := simpleArchive(b, layer{tar: base})
	parent := importBytes(b, s, "base", a)
	data := make([]byte, 100<<20)
	rand.Read(data)
	f := upperOneFile(b, data)
	b.SetBytes(int64(len(data)))
	for _, stream := range []bool{false, true} {
		b.Run(map[bool]string{false: "sorted", true: "streamed"}[stream], func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				opts := SnapshotOptions{Name: fmt.Sprintf("snap:%d", i), Parent: parent, Upper: f}
				if stream {
					f.Seek(0, io.SeekStart)
					opts.Upper, opts.UpperStream = nil, bufio.NewReaderSize(f, 1<<20)
				}
				if _, err := s.Snapshot(ctx, opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A checkpoint committed unsealed records sizes only; SealCheckpoint or the
// first OpenCheckpoint checksums it, after which a flipped byte is found.
// One never sealed before the host restarted is refused, as is one whose
// files changed size.
func TestCheckpointUnsealed(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	pages := bytes.Repeat([]byte("pages"), (checksumChunk+checksumChunk/2)/5)
	commit := func() Checkpoint {
		t.Helper()
		ci, err := s.NewCheckpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(ci.Dir(), "checkpoint.img"), []byte("state"), 0o644)
		os.WriteFile(filepath.Join(ci.Dir(), "pages.img"), pages, 0o644)
		ck, err := ci.CommitUnsealed(ctx, map[string]string{"n": fmt.Sprint(time.Now().UnixNano())})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range ck.Files {
			if f.ChunkSize != 0 || f.XXH64Chunks != nil || f.XXH64 != "" || f.Digest != "" {
				t.Fatalf("unsealed file %+v has checksums", f)
			}
		}
		return ck
	}
	pagesOf := func(ck Checkpoint) string { return filepath.Join(s.checkpointPath(ck.Digest), "image", "pages.img") }
	flip := func(ck Checkpoint, at int64) {
		f, _ := os.OpenFile(pagesOf(ck), os.O_RDWR, 0)
		b := make([]byte, 1)
		f.ReadAt(b, at)
		f.WriteAt([]byte{b[0] ^ 1}, at)
		f.Close()
	}

	// Sealed explicitly, then damaged: refused.
	a := commit()
	if err := s.SealCheckpoint(ctx, a.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenCheckpoint(ctx, a.Digest); err != nil {
		t.Fatal(err)
	}
	flip(a, checksumChunk+1)
	if _, err := s.OpenCheckpoint(ctx, a.Digest); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pages.img") {
		t.Fatalf("byte flipped after the seal: %v", err)
	}
	// Sealing again does not take the damaged bytes as the truth.
	if err := s.SealCheckpoint(ctx, a.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenCheckpoint(ctx, a.Digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("sealed twice, damaged in between: %v", err)
	}

	// Sealed by the first open, then damaged: refused.
	b := commit()
	if _, err := s.OpenCheckpoint(ctx, b.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.checkpointPath(b.Digest), "sums.json")); err != nil {
		t.Fatalf("open did not seal: %v", err)
	}
	flip(b, 0)
	if _, err := s.OpenCheckpoint(ctx, b.Digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("byte flipped after the first open: %v", err)
	}

	// Cut short before any seal: refused by size.
	c := commit()
	os.Truncate(pagesOf(c), int64(len(pages))-4096)
	if _, err := s.OpenCheckpoint(ctx, c.Digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("cut short before the seal: %v", err)
	}
	if err := s.SealCheckpoint(ctx, c.Digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("sealing one cut short: %v", err)
	}

	// Never sealed, and the host restarted since: refused.
	d := commit()
	boot := bootID
	bootID = func() string { return "another-boot" }
	defer func() { bootID = boot }()
	if _, err := s.OpenCheckpoint(ctx, d.Digest); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "restarted") {
		t.Fatalf("unsealed across a restart: %v", err)
	}
	// One sealed before the restart is verified as usual.
	if _, err := s.OpenCheckpoint(ctx, b.Digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("sealed before a restart, damaged: %v", err)
	}
	flip(b, 0)
	if _, err := s.OpenCheckpoint(ctx, b.Digest); err != nil {
		t.Fatalf("sealed before a restart, intact: %v", err)
	}

	// A sums.json that does not match the manifest: refused.
	e := commit()
	os.WriteFile(filepath.Join(s.checkpointPath(e.Digest), "sums.json"), []byte(`{"files":[{"name":"pages.img","size":1}]}`), 0o600)
	bootID = boot
	if _, err := s.OpenCheckpoint(ctx, e.Digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("mismatched sums.json: %v", err)
	}
}

func TestCompresses(t *testing.T) {
	random := func(n int) []byte { b := make([]byte, n); rand.Read(b); return b }
	text := func(n int) []byte {
		return []byte(strings.Repeat("the quick brown fox jumps over the lazy dog; ", n/45+1)[:n])
	}
	// Every other 256 KiB zero, the rest random: half of it compresses.
	mixed := random(compressSample)
	for off := 0; off < len(mixed); off += 512 << 10 {
		clear(mixed[off : off+256<<10])
	}
	// Random but for its last 64 KiB: too little saved.
	tail := random(compressSample)
	copy(tail[len(tail)-64<<10:], text(64<<10))
	for _, c := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"empty", nil, true},
		{"random, short", random(100 << 10), false},
		{"text, short", text(100 << 10), true},
		{"random", random(compressSample), false},
		{"text", text(compressSample), true},
		{"half zeros", mixed, true},
		{"random but 64 KiB of text", tail, false},
	} {
		if got := compresses(c.b); got != c.want {
			t.Errorf("%s: compresses = %v, want %v", c.name, got, c.want)
		}
	}
}
