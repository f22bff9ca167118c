package archive

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A file of zeros (what a sparse file inside a sandbox reads as) is
// written with holes: its content is exact and it costs the disk only its
// data.
func TestExtractWritesZerosAsHoles(t *testing.T) {
	const size = 256 << 20
	data := io.MultiReader(
		bytes.NewReader([]byte("head")),
		io.LimitReader(zeroReader{}, size/2-4),
		bytes.NewReader([]byte("middle")),
		io.LimitReader(zeroReader{}, size/2-6-3),
		bytes.NewReader([]byte("end")),
	)
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		tw.WriteHeader(&tar.Header{Name: "sparse", Mode: 0o644, Size: size, Typeflag: tar.TypeReg})
		io.Copy(tw, data)
		pw.CloseWithError(tw.Close())
	}()
	dir := t.TempDir()
	if err := Extract(pr, dir, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "sparse")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Fatalf("extracted %d bytes, want %d", fi.Size(), size)
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 1<<20 {
		t.Errorf("a %d-byte file of zeros takes %d bytes of disk", size, used)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range []struct {
		off  int64
		want string
	}{{0, "head\x00"}, {size/2 - 1, "\x00middle\x00"}, {size - 4, "\x00end"}} {
		b := make([]byte, len(c.want))
		if _, err := f.ReadAt(b, c.off); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("at %d: %q, want %q", c.off, b, c.want)
		}
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
